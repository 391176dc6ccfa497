//! Reasoning blocks (`<think> … </think>`, DeepSeek-R1 style): show, hide or strip them, and
//! optionally cap their length by forcing the closing tag into the sequence.
//!
//! The rule for `hide` and `strip`: the answer is what follows the first `</think>`, leading
//! whitespace trimmed. Output that never closes the tag counts as all reasoning.

use crate::engine::{Engine, FinishReason, GenConfig, Next, Output};
use crate::error::Result;

pub const THINK_CLOSE: &str = "</think>";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Print everything.
    #[default]
    Show,
    /// Print and save only the answer.
    Hide,
    /// Print everything, save only the answer (transcript, JSON `text`).
    Strip,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Mode, String> {
        match s {
            "show" => Ok(Mode::Show),
            "hide" => Ok(Mode::Hide),
            "strip" => Ok(Mode::Strip),
            _ => Err(format!("{s:?} is not one of show, hide, strip")),
        }
    }
}

/// The answer part of a whole output text.
pub fn answer(text: &str) -> &str {
    match text.find(THINK_CLOSE) {
        Some(i) => text[i + THINK_CLOSE.len()..].trim_start(),
        None => "",
    }
}

/// The text to save (JSON `text`, chat history) for `mode`.
pub fn saved(mode: Mode, text: &str) -> &str {
    match mode {
        Mode::Show => text,
        Mode::Hide | Mode::Strip => answer(text),
    }
}

/// Streaming filter for stdout: feed decoded pieces, print what it returns.
#[derive(Debug, Default)]
pub struct Filter {
    mode: Mode,
    closed: bool,
    /// Still trimming whitespace right after `</think>`.
    trimming: bool,
    buf: String,
}

impl Filter {
    pub fn new(mode: Mode) -> Filter {
        Filter {
            mode,
            ..Default::default()
        }
    }

    pub fn push(&mut self, piece: &str) -> String {
        if self.mode != Mode::Hide {
            return piece.to_string();
        }
        if !self.closed {
            self.buf.push_str(piece);
            let Some(i) = self.buf.find(THINK_CLOSE) else {
                return String::new();
            };
            self.closed = true;
            self.trimming = true;
            let rest = self.buf[i + THINK_CLOSE.len()..].to_string();
            self.buf.clear();
            return self.trim(&rest);
        }
        self.trim(piece)
    }

    fn trim(&mut self, s: &str) -> String {
        if !self.trimming {
            return s.to_string();
        }
        let t = s.trim_start();
        if !t.is_empty() {
            self.trimming = false;
        }
        t.to_string()
    }
}

/// A reasoning budget: after `max` generated tokens with the block still open, `close` (the
/// ids of `</think>`) is forced into the sequence.
#[derive(Debug, Clone)]
pub struct Budget {
    pub max: usize,
    pub close: Vec<u32>,
}

/// `engine.generate` with an optional reasoning budget. Forced ids go through `on_token`
/// like sampled ones and appear in `output_ids`. The engine continues from its cache: the
/// last sampled token (not fed yet) and the forced ids are fed as the continuation prompt.
pub fn generate(
    engine: &mut Engine,
    ids: &[u32],
    cfg: &GenConfig,
    tokenize_ms: f64,
    budget: Option<&Budget>,
    mut on_token: impl FnMut(u32) -> Result<Next>,
) -> Result<Output> {
    let Some(b) = budget.filter(|b| !b.close.is_empty()) else {
        return engine.generate(ids, cfg, tokenize_ms, on_token);
    };
    let mut seen: Vec<u32> = Vec::new();
    let mut hit = false;
    let mut closed = false;
    let first = engine.generate(ids, cfg, tokenize_ms, |t| {
        seen.push(t);
        let r = on_token(t)?;
        closed = closed || seen.ends_with(&b.close);
        if !closed && seen.len() >= b.max && matches!(r, Next::Continue) {
            hit = true;
            return Ok(Next::Stop(FinishReason::Stop));
        }
        Ok(r)
    })?;
    if !hit {
        return Ok(first);
    }
    let mut out = first;
    let last = *out
        .output_ids
        .last()
        .expect("the budget stop follows a token");
    for &c in &b.close {
        on_token(c)?;
        out.output_ids.push(c);
    }
    let left = cfg.n_tokens.saturating_sub(out.output_ids.len());
    let mut cont = vec![last];
    cont.extend_from_slice(&b.close);
    if left == 0 || engine.pos() + cont.len() > engine.max_ctx() {
        out.finish = if left == 0 {
            FinishReason::Length
        } else {
            FinishReason::CtxFull
        };
        out.stats.generated_tokens = out.output_ids.len();
        return Ok(out);
    }
    let cfg2 = GenConfig {
        n_tokens: left,
        ..cfg.clone()
    };
    let second = engine.generate(&cont, &cfg2, 0.0, on_token)?;
    out.output_ids.extend_from_slice(&second.output_ids);
    out.finish = second.finish;
    out.stats.decode_ms += second.stats.prefill_ms + second.stats.decode_ms;
    out.stats.generated_tokens = out.output_ids.len();
    out.stats.finish();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hide_prints_only_the_answer_across_split_pieces() {
        let mut f = Filter::new(Mode::Hide);
        let pieces = ["<think>", "I reason", "</th", "ink>", "\n\n", " Paris", "."];
        let out: String = pieces.iter().map(|p| f.push(p)).collect();
        assert_eq!(out, "Paris.");
        let mut f = Filter::new(Mode::Hide);
        let out: String = ["never", " closed"].iter().map(|p| f.push(p)).collect();
        assert_eq!(out, "");
    }

    #[test]
    fn saved_text_per_mode() {
        let t = "<think>x</think>\n\nanswer </think> kept";
        assert_eq!(saved(Mode::Show, t), t);
        assert_eq!(saved(Mode::Strip, t), "answer </think> kept");
        assert_eq!(saved(Mode::Hide, "no close"), "");
    }
}
