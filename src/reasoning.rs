//! Reasoning blocks (`<think> … </think>`, DeepSeek-R1 style): show, hide or strip them, and
//! optionally cap their length by forcing the closing tag into the sequence.
//!
//! Text is reasoning only inside a block: after a `<think>` in the output, or from the start
//! when the prompt (the rendered chat template) ends by opening one, up to the next
//! `</think>`. Everything else is the answer, with the whitespace right after a `</think>`
//! trimmed. A model that never opens a block therefore answers with all of its text.

use crate::engine::{Engine, FinishReason, GenConfig, Next, Output};
use crate::error::Result;
use crate::tokenizer::Tokenizer;

pub const THINK_OPEN: &str = "<think>";
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

/// Whether a prompt ending in `text` leaves a reasoning block open for the reply.
pub fn opens_block(text: &str) -> bool {
    text.trim_end().ends_with(THINK_OPEN)
}

/// Whether the prompt `ids` end by opening a reasoning block (the last few ids decoded;
/// special tokens are kept by [`Tokenizer::decode`]).
pub fn prompt_opens_block(tok: &Tokenizer, ids: &[u32]) -> bool {
    let tail = &ids[ids.len().saturating_sub(8)..];
    tok.decode(tail).is_ok_and(|t| opens_block(&t))
}

/// The answer part of a whole output text (see the module rule).
pub fn answer(text: &str, starts_open: bool) -> String {
    let mut f = Filter::new(Mode::Hide, starts_open);
    let mut out = f.push(text);
    out.push_str(&f.finish());
    out
}

/// The text to save (JSON `text`, chat history) for `mode`.
pub fn saved(mode: Mode, text: &str, starts_open: bool) -> String {
    match mode {
        Mode::Show => text.to_string(),
        Mode::Hide | Mode::Strip => answer(text, starts_open),
    }
}

/// Streaming filter for stdout: feed decoded pieces, print what it returns, and at the end
/// what [`Filter::finish`] returns. In `Hide` mode it drops reasoning blocks; a tag split
/// across pieces is held back until it is known whether it is one.
#[derive(Debug, Default)]
pub struct Filter {
    mode: Mode,
    /// Inside a reasoning block.
    inside: bool,
    /// Still trimming whitespace right after `</think>`.
    trimming: bool,
    /// Text not yet classified: it may end with the start of a tag.
    buf: String,
}

/// The length of the longest suffix of `s` that is a proper prefix of `tag`.
fn partial_tag(s: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| s.is_char_boundary(s.len().saturating_sub(n)) && s.ends_with(&tag[..n]))
        .unwrap_or(0)
}

impl Filter {
    /// `starts_open`: the prompt opened a reasoning block (see [`opens_block`]).
    pub fn new(mode: Mode, starts_open: bool) -> Filter {
        Filter {
            mode,
            inside: starts_open,
            ..Default::default()
        }
    }

    pub fn push(&mut self, piece: &str) -> String {
        if self.mode != Mode::Hide {
            return piece.to_string();
        }
        self.buf.push_str(piece);
        let mut out = String::new();
        loop {
            let tag = if self.inside { THINK_CLOSE } else { THINK_OPEN };
            match self.buf.find(tag) {
                Some(i) => {
                    if !self.inside {
                        let before = self.buf[..i].to_string();
                        out.push_str(&self.trim(&before));
                    }
                    self.buf.drain(..i + tag.len());
                    self.inside = !self.inside;
                    self.trimming = !self.inside;
                }
                None => {
                    let keep = partial_tag(&self.buf, tag);
                    let done = self.buf.len() - keep;
                    if !self.inside {
                        let text = self.buf[..done].to_string();
                        out.push_str(&self.trim(&text));
                    }
                    self.buf.drain(..done);
                    return out;
                }
            }
        }
    }

    /// The text still held back (a partial tag that never completed), at the end.
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.buf);
        if self.mode != Mode::Hide || self.inside {
            return String::new();
        }
        self.trim(&rest)
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

/// A reasoning budget: after `max` generated tokens with a block open, `close` (the ids of
/// `</think>`) is forced into the sequence. A block is open when the prompt opened one, or
/// once the output holds `open` (the ids of `<think>`) and has not closed it since; output
/// that never opens a block is never cut.
#[derive(Debug, Clone)]
pub struct Budget {
    pub max: usize,
    pub open: Vec<u32>,
    pub close: Vec<u32>,
}

/// `engine.generate` with an optional reasoning budget. Forced ids go through `on_token`
/// like sampled ones and appear in `output_ids`. The engine continues from its cache: the
/// last sampled token (not fed yet) and the forced ids are fed as the continuation prompt.
/// `starts_open`: the prompt opened a reasoning block.
pub fn generate(
    engine: &mut Engine,
    ids: &[u32],
    cfg: &GenConfig,
    tokenize_ms: f64,
    budget: Option<&Budget>,
    starts_open: bool,
    mut on_token: impl FnMut(u32) -> Result<Next>,
) -> Result<Output> {
    let Some(b) = budget.filter(|b| !b.close.is_empty()) else {
        return engine.generate(ids, cfg, tokenize_ms, on_token);
    };
    let mut seen: Vec<u32> = Vec::new();
    let mut hit = false;
    let mut open = starts_open;
    let first = engine.generate(ids, cfg, tokenize_ms, |t| {
        seen.push(t);
        let r = on_token(t)?;
        if open {
            open = !seen.ends_with(&b.close);
        } else {
            open = !b.open.is_empty() && seen.ends_with(&b.open);
        }
        if open && seen.len() >= b.max && matches!(r, Next::Continue) {
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

    fn hide(pieces: &[&str], starts_open: bool) -> String {
        let mut f = Filter::new(Mode::Hide, starts_open);
        let mut out: String = pieces.iter().map(|p| f.push(p)).collect();
        out.push_str(&f.finish());
        out
    }

    #[test]
    fn hide_prints_only_the_answer_across_split_pieces() {
        let pieces = ["<think>", "I reason", "</th", "ink>", "\n\n", " Paris", "."];
        assert_eq!(hide(&pieces, false), "Paris.");
        // Opened by the prompt: reasoning until the close tag, which may be split.
        assert_eq!(hide(&["x", "y</th", "ink>", " ok"], true), "ok");
        // Opened and never closed: all reasoning.
        assert_eq!(hide(&["<thi", "nk>never", " closed"], false), "");
    }

    #[test]
    fn text_without_an_opened_block_is_all_answer() {
        // A model that does not reason: everything prints (regression: it printed nothing).
        assert_eq!(hide(&[" Paris", "."], false), " Paris.");
        // A lone close tag is text, not the end of a block never opened.
        assert_eq!(hide(&["a </think> b"], false), "a </think> b");
        // A held-back partial tag that never completes is printed at the end.
        assert_eq!(hide(&["1 <", "thi"], false), "1 <thi");
        // Text before an opened block is answer too.
        assert_eq!(hide(&["A", "<think>r</think>", " B"], false), "AB");
        assert_eq!(hide(&["é<", "think>ü</think>ö"], false), "éö");
    }

    #[test]
    fn saved_text_per_mode() {
        let t = "<think>x</think>\n\nanswer </think> kept";
        assert_eq!(saved(Mode::Show, t, false), t);
        assert_eq!(saved(Mode::Strip, t, false), "answer </think> kept");
        assert_eq!(saved(Mode::Hide, "no block", false), "no block");
        assert_eq!(saved(Mode::Strip, "no close", true), "");
        assert_eq!(saved(Mode::Strip, "r</think> a", true), "a");
    }

    #[test]
    fn a_prompt_opens_a_block_only_when_it_ends_with_the_tag() {
        assert!(opens_block("<|Assistant|><think>\n"));
        assert!(!opens_block("<think>x</think> answer:"));
        assert!(!opens_block("The capital of France is"));
    }
}
