//! Generated ids → text: the one place that decides what text is printed and saved.
//!
//! A [`TextDriver`] (a driver over the engine, holding no model state of its own) runs one
//! generation (a one-shot run, or one turn of `-i`) through the
//! engine and turns its tokens into text: streaming detokenization, stop strings (never
//! printing text a stop string may still claim, cutting before the first match), the
//! reasoning filter for stdout and the reasoning budget. The caller gets a [`TextTurn`]
//! with the ids, the full text, the text to save, and why the run ended.

use crate::engine::{Engine, FinishReason, GenConfig, Next, Output};
use crate::error::{Error, Result};
use crate::reasoning::{self, Budget, Filter, Mode};
use crate::stop::StopMatcher;
use crate::tokenizer::Tokenizer;
use std::io::Write;

/// How tokens become text (fixed for a session).
#[derive(Debug, Clone, Default)]
pub struct TextOptions {
    /// Stop when the text contains one of these (the stop string is not printed or saved).
    pub stops: Vec<String>,
    /// Reasoning blocks: what is printed and what is saved.
    pub reasoning: Mode,
    /// Force `</think>` after this many tokens while the block is open.
    pub budget: Option<Budget>,
    /// Structured output: every run is constrained to this grammar or schema.
    pub grammar: Option<(std::sync::Arc<crate::grammar::Vocab>, crate::grammar::Spec)>,
}

/// One finished generation.
#[derive(Debug, Clone)]
pub struct TextTurn {
    pub output: Output,
    /// Why the run ended, as the user sees it (see [`Output::finish_for`]).
    pub finish: FinishReason,
    /// The generated text: up to the stop string, without the end token.
    pub text: String,
    /// The text to save (JSON `text`, chat history) under the reasoning mode.
    pub saved: String,
}

pub struct TextDriver<'t> {
    tok: &'t Tokenizer,
    opts: TextOptions,
    /// End tokens (kept out of the text when they end the run).
    eos: Vec<u32>,
}

impl<'t> TextDriver<'t> {
    pub fn new(tok: &'t Tokenizer, eos: &[u32], opts: TextOptions) -> TextDriver<'t> {
        TextDriver {
            tok,
            opts,
            eos: eos.to_vec(),
        }
    }

    pub fn tokenizer(&self) -> &'t Tokenizer {
        self.tok
    }

    /// Feed `ids` and generate up to `cfg.n_tokens` tokens. With `out`, text is streamed to
    /// it as it becomes final and ended by a newline (also when generation fails part-way,
    /// after the text so far). `requested` is the token count the user asked for: when it
    /// exceeds `cfg.n_tokens` (clamped to the context) and the run hits the clamp, the
    /// finish is `ctx_full`.
    pub fn generate(
        &self,
        engine: &mut Engine,
        ids: &[u32],
        cfg: &GenConfig,
        requested: usize,
        tokenize_ms: f64,
        mut out: Option<&mut dyn Write>,
    ) -> Result<TextTurn> {
        let mut stream = self.tok.stream();
        let mut stops = StopMatcher::new(&self.opts.stops);
        // Reasoning starts open only when the prompt itself opened a block.
        let starts_open = self.opts.reasoning != Mode::Show || self.opts.budget.is_some();
        let starts_open = starts_open && reasoning::prompt_opens_block(self.tok, ids);
        let mut filter = Filter::new(self.opts.reasoning, starts_open);
        // Text released so far: streamed pieces minus anything a stop string may still claim.
        let mut released = String::new();
        let decode_while_running = out.is_some() || !stops.is_empty();
        engine.constraint = match &self.opts.grammar {
            Some((vocab, spec)) => Some(crate::grammar::Constraint::new(vocab, spec)?),
            None => None,
        };
        let result = reasoning::generate(
            engine,
            ids,
            cfg,
            tokenize_ms,
            self.opts.budget.as_ref(),
            starts_open,
            |tok| {
                if !decode_while_running {
                    return Ok(Next::Continue);
                }
                let Some(piece) = stream.step(tok)? else {
                    return Ok(Next::Continue);
                };
                let pushed = stops.push(&piece);
                if let Some(w) = out.as_deref_mut() {
                    write_flush(w, &filter.push(&pushed.emit))?;
                }
                released.push_str(&pushed.emit);
                Ok(if pushed.stopped {
                    Next::Stop(FinishReason::Stop)
                } else {
                    Next::Continue
                })
            },
        );
        engine.constraint = None;
        let output = match result {
            Ok(o) => o,
            Err(e) => {
                // Keep what was printed, ended by a newline; nothing if nothing was.
                if let Some(w) = out.as_deref_mut() {
                    if !released.is_empty() {
                        let _ = write_flush(w, "\n");
                    }
                }
                return Err(e);
            }
        };
        let finish = output.finish_for(cfg.n_tokens, requested);
        let text = if finish == FinishReason::Stop {
            released.clone()
        } else {
            self.tok.decode(&output.text_ids(finish, &self.eos))?
        };
        if let Some(w) = out {
            // Text the stream or the stop matcher held back goes out now, so what was
            // printed always equals `text` (under the reasoning filter).
            let rest = text.strip_prefix(released.as_str()).unwrap_or_default();
            let tail = filter.push(rest) + &filter.finish();
            write_flush(w, &format!("{tail}\n"))?;
        }
        let saved = reasoning::saved(self.opts.reasoning, &text, starts_open);
        Ok(TextTurn {
            output,
            finish,
            text,
            saved,
        })
    }
}

fn write_flush(w: &mut dyn Write, s: &str) -> Result<()> {
    let err = |e| Error::io("<stdout>", e);
    if !s.is_empty() {
        w.write_all(s.as_bytes()).map_err(err)?;
        w.flush().map_err(err)?;
    }
    Ok(())
}
