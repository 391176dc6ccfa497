//! Run statistics and their two renderings: the stderr stats line and the JSON object.

use serde::Serialize;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    pub load_ms: f64,
    /// Prompt processing: graphs + lm-head up to the first sampled token.
    pub prefill_ms: f64,
    /// From the start of generation (tokenizing included) to the first token.
    pub ttft_ms: f64,
    /// All decode steps after the first token.
    pub decode_ms: f64,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub ms_per_tok: f64,
    /// Cache capacity of the context-ladder rung the run ended on (the bundle's context
    /// when it has no ladder).
    pub ctx_rung: usize,
    /// Times the cache moved to a larger (or, after a rewind, smaller) rung in this run.
    pub rung_moves: usize,
}

impl Stats {
    /// Fill the derived rates. The first token comes from prefill, so decode rates count
    /// generated - 1 tokens.
    pub fn finish(&mut self) {
        let dec = self.generated_tokens.saturating_sub(1);
        self.prefill_tok_s = rate(self.prompt_tokens, self.prefill_ms);
        self.decode_tok_s = rate(dec, self.decode_ms);
        self.ms_per_tok = if dec > 0 {
            self.decode_ms / dec as f64
        } else {
            0.0
        };
    }

    pub fn line(&self) -> String {
        format!(
            "prompt={} generated={} load_ms={:.2} prefill_ms={:.2} ttft_ms={:.2} decode_ms={:.2} decode_tok_s={:.2} ms_per_tok={:.2}",
            self.prompt_tokens,
            self.generated_tokens,
            self.load_ms,
            self.prefill_ms,
            self.ttft_ms,
            self.decode_ms,
            self.decode_tok_s,
            self.ms_per_tok
        ) + &if self.rung_moves > 0 {
            format!(" ctx_rung={} rung_moves={}", self.ctx_rung, self.rung_moves)
        } else {
            String::new()
        }
    }
}

fn rate(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1000.0 / ms
    } else {
        0.0
    }
}
