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

/// Where a generation's text goes while it runs: stdout for the CLI ([`WriteSink`]), a
/// token callback for the C API.
pub trait TextSink {
    /// After each generated token: the text it released, whole characters only (empty while
    /// a character or a possible stop string is incomplete). `false` ends the run with
    /// [`FinishReason::Cancelled`].
    fn token(&mut self, text: &str, token: u32) -> Result<bool>;
    /// The run ended: the text held back until now, so that everything passed to `token`
    /// and `end` adds up to the turn's text.
    fn end(&mut self, rest: &str) -> Result<()>;
    /// The run failed part-way; `released` says whether any text went out before.
    fn failed(&mut self, _released: bool) {}
}

/// Text to a writer, flushed per piece and ended by a newline (also after a failure, when
/// something was printed).
pub struct WriteSink<'a>(pub &'a mut dyn Write);

impl TextSink for WriteSink<'_> {
    fn token(&mut self, text: &str, _token: u32) -> Result<bool> {
        write_flush(self.0, text)?;
        Ok(true)
    }

    fn end(&mut self, rest: &str) -> Result<()> {
        write_flush(self.0, &format!("{rest}\n"))
    }

    fn failed(&mut self, released: bool) {
        if released {
            let _ = write_flush(self.0, "\n");
        }
    }
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

    /// Feed `ids` and generate up to `cfg.n_tokens` tokens. With a sink, text is passed to it
    /// as it becomes final (under the reasoning filter). `requested` is the token count the user asked for: when it
    /// exceeds `cfg.n_tokens` (clamped to the context) and the run hits the clamp, the
    /// finish is `ctx_full`.
    pub fn generate(
        &self,
        engine: &mut Engine,
        ids: &[u32],
        cfg: &GenConfig,
        requested: usize,
        tokenize_ms: f64,
        sink: Option<&mut dyn TextSink>,
    ) -> Result<TextTurn> {
        self.generate_after(engine, ids, 0, cfg, requested, tokenize_ms, sink)
    }

    /// [`TextDriver::generate`] for a prompt whose first `kept` ids the engine's cache
    /// already holds (a conversation's shared prefix): only the rest is fed, while the
    /// prompt as a whole decides whether it opened a reasoning block.
    #[allow(clippy::too_many_arguments)]
    pub fn generate_after(
        &self,
        engine: &mut Engine,
        ids: &[u32],
        kept: usize,
        cfg: &GenConfig,
        requested: usize,
        tokenize_ms: f64,
        mut sink: Option<&mut dyn TextSink>,
    ) -> Result<TextTurn> {
        let whole = ids;
        let ids = &ids[kept.min(ids.len())..];
        let mut stream = self.tok.stream();
        let mut stops = StopMatcher::new(&self.opts.stops);
        // Reasoning starts open only when the prompt itself opened a block.
        let starts_open = self.opts.reasoning != Mode::Show || self.opts.budget.is_some();
        let starts_open = starts_open && reasoning::prompt_opens_block(self.tok, whole);
        let mut filter = Filter::new(self.opts.reasoning, starts_open);
        // Text released so far: streamed pieces minus anything a stop string may still claim.
        let mut released = String::new();
        let decode_while_running = sink.is_some() || !stops.is_empty();
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
                let pushed = match stream.step(tok)? {
                    Some(piece) => stops.push(&piece),
                    None => Default::default(),
                };
                released.push_str(&pushed.emit);
                let go = match sink.as_deref_mut() {
                    Some(s) => s.token(&filter.push(&pushed.emit), tok)?,
                    None => true,
                };
                Ok(if pushed.stopped {
                    Next::Stop(FinishReason::Stop)
                } else if !go {
                    Next::Stop(FinishReason::Cancelled)
                } else {
                    Next::Continue
                })
            },
        );
        engine.constraint = None;
        let output = match result {
            Ok(o) => o,
            Err(e) => {
                if let Some(s) = sink.as_deref_mut() {
                    s.failed(!released.is_empty());
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
        if let Some(s) = sink {
            // Text the stream or the stop matcher held back goes out now, so what was
            // passed on always equals `text` (under the reasoning filter).
            let rest = text.strip_prefix(released.as_str()).unwrap_or_default();
            s.end(&(filter.push(rest) + &filter.finish()))?;
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
