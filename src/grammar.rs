//! Structured output: constrain generation to a JSON schema or a grammar (Lark, or GBNF as
//! llama.cpp writes it), through llguidance.
//!
//! A [`Vocab`] is built once per tokenizer (the token byte strings in a trie); a
//! [`Constraint`] is one generation's parser state. Per step the engine asks the constraint
//! for the tokens allowed next and hides the rest (their logits become -inf) before the
//! sampler runs, then commits the token it picked. When the grammar is complete only the
//! end token is allowed, so the run ends with `eos` and no end-token text.

use crate::error::{Error, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use std::path::Path;
use std::sync::Arc;

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// A JSON schema (`-j` / `--json-schema`); `{"type": "object"}` for "any JSON object".
    JsonSchema(serde_json::Value),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
}

impl Spec {
    /// A grammar file's text: GBNF (llama.cpp's, recognised by its `::=` rules) is rewritten
    /// into Lark; anything else is read as Lark.
    pub fn from_grammar_text(text: &str) -> Spec {
        if text.contains("::=") {
            Spec::Lark(gbnf_to_lark(text))
        } else {
            Spec::Lark(text.to_string())
        }
    }
}

/// GBNF → Lark: the two differ in the rule arrow (`::=` vs `:`), in rule names (GBNF allows
/// `-`, Lark does not) and in the start rule (`root` vs `start`). Strings, character classes,
/// grouping, alternation and the `* + ? {m,n}` repeats read the same in llguidance's Lark.
pub fn gbnf_to_lark(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.chars().peekable();
    // Copy quoted strings and character classes verbatim; rename identifiers elsewhere.
    while let Some(c) = chars.next() {
        match c {
            '"' | '[' => {
                // A quoted string or a character class, copied as it is.
                let close = if c == '"' { '"' } else { ']' };
                out.push(c);
                while let Some(d) = chars.next() {
                    out.push(d);
                    if d == '\\' {
                        if let Some(e) = chars.next() {
                            out.push(e);
                        }
                    } else if d == close {
                        break;
                    }
                }
            }
            '#' => {
                // A comment runs to the end of the line.
                for d in chars.by_ref() {
                    if d == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ':' if text_starts(&mut chars, ":=") => {
                chars.next();
                chars.next();
                out.push(':');
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut name = String::from(c);
                while let Some(&d) = chars.peek() {
                    if d.is_ascii_alphanumeric() || d == '_' || d == '-' {
                        name.push(d);
                        chars.next();
                    } else {
                        break;
                    }
                }
                let name = name.replace('-', "_");
                out.push_str(if name == "root" { "start" } else { &name });
            }
            _ => out.push(c),
        }
    }
    out
}

fn text_starts(chars: &mut std::iter::Peekable<std::str::Chars<'_>>, s: &str) -> bool {
    let ahead: String = chars.clone().take(s.chars().count()).collect();
    ahead == s
}

/// JSON output on one line with `, ` and `: ` separators and no other whitespace, unless the
/// schema sets llguidance's own `x-guidance` options: free whitespace lets a small model fill
/// the token budget with newlines (seen on SmolLM2, greedy).
fn with_json_layout(schema: &serde_json::Value) -> serde_json::Value {
    let mut s = schema.clone();
    if let Some(o) = s.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": "
            })
        });
    }
    s
}

/// The tokenizer's tokens as byte strings, ready for any number of constraints.
pub struct Vocab {
    factory: ParserFactory,
    n_vocab: usize,
}

impl std::fmt::Debug for Vocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vocab({} tokens)", self.n_vocab)
    }
}

impl Vocab {
    /// Read `tokenizer.json` (its vocabulary and added tokens) for a model whose token space
    /// has `n_vocab` rows and whose end token is `eos`.
    pub fn load(tokenizer_json: &Path, n_vocab: usize, eos: u32) -> Result<Vocab> {
        let err = |msg: String| Error::Tokenizer {
            path: tokenizer_json.to_path_buf(),
            msg,
        };
        let bytes = std::fs::read(tokenizer_json).map_err(|e| Error::io(tokenizer_json, e))?;
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| err(format!("not JSON: {e}")))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&v)
            .map_err(|e| err(format!("cannot list its tokens for structured output: {e}")))?;
        // Rows past the tokenizer's tokens (padding of the embedding) can never be produced.
        words.resize(words.len().max(n_vocab), Vec::new());
        let info = TokRxInfo {
            vocab_size: words.len() as u32,
            tok_eos: eos,
            tok_bos: None,
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: None,
        };
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| err(format!("structured output setup failed: {e}")))?;
        factory.quiet();
        Ok(Vocab {
            factory,
            n_vocab: words.len(),
        })
    }
}

/// One generation's grammar state.
pub struct Constraint {
    m: Matcher,
    mask: SimpleVob,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Constraint")
    }
}

/// A grammar problem, as one line (llguidance appends a multi-line parser state dump).
fn gerr(msg: impl std::fmt::Display) -> Error {
    let text = msg.to_string();
    let first = text.lines().next().unwrap_or("").trim();
    Error::Grammar(first.trim_end_matches(':').to_string())
}

impl Constraint {
    /// Compile `spec`. A grammar that does not compile, or that can match nothing at all,
    /// is an error here, before any token is generated.
    pub fn new(vocab: &Vocab, spec: &Spec) -> Result<Constraint> {
        let grammar = match spec {
            Spec::JsonSchema(s) => TopLevelGrammar::from_json_schema(with_json_layout(s)),
            Spec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        };
        let parser = vocab.factory.create_parser(grammar).map_err(gerr)?;
        let mut m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(gerr(e));
        }
        let nothing = || gerr("the grammar matches nothing: no token can start it");
        let mask = m.compute_mask_or_eos().map_err(|_| nothing())?;
        if mask.is_zero() {
            return Err(nothing());
        }
        Ok(Constraint { m, mask })
    }

    /// Hide every token the grammar does not allow next (logit -inf). Fails when none is
    /// allowed (a grammar that cannot continue) rather than letting the sampler pick one.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<()> {
        let words = self.mask.as_slice();
        for (w, chunk) in words.iter().zip(logits.chunks_mut(32)) {
            match *w {
                u32::MAX => {}
                // Most words of a mask are all-allowed or all-hidden: fill those whole.
                0 => chunk.fill(f32::NEG_INFINITY),
                w => {
                    for (bit, l) in chunk.iter_mut().enumerate() {
                        if w & (1 << bit) == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        // Logits past the mask (padding rows) are never allowed.
        let covered = words.len() * 32;
        if logits.len() > covered {
            logits[covered..].fill(f32::NEG_INFINITY);
        }
        Ok(())
    }

    /// Whether `tok` is allowed next.
    pub fn allows(&self, tok: u32) -> bool {
        self.mask.is_allowed(tok)
    }

    /// Take `tok` (which must be allowed) and prepare the next mask.
    pub fn commit(&mut self, tok: u32) -> Result<()> {
        if self.m.is_stopped() {
            // Complete: the end token was the only choice, and it ends the run.
            return Ok(());
        }
        self.m.consume_token(tok).map_err(gerr)?;
        // Once complete, the mask holds the end token alone.
        self.mask = self.m.compute_mask_or_eos().map_err(gerr)?;
        if self.mask.is_zero() {
            return Err(gerr("the grammar cannot continue and cannot end here"));
        }
        Ok(())
    }

    /// Undo the last `n` committed tokens (speculative decoding's rejected rows).
    pub fn rollback(&mut self, n: usize) -> Result<()> {
        self.m.rollback(n).map_err(gerr)?;
        self.mask = self.m.compute_mask_or_eos().map_err(gerr)?;
        Ok(())
    }

    /// The grammar is complete: only the end token may follow.
    pub fn is_done(&self) -> bool {
        self.m.is_stopped()
    }

    /// The output so far is a complete match (the end token is allowed).
    pub fn is_accepting(&mut self) -> bool {
        self.m.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gbnf_becomes_lark_with_names_strings_and_classes_kept() {
        let g = "root ::= item (\",\" item)*  # a list\nitem ::= [a-z-]+ | \"x::=y\"\nmy-rule ::= \"-\"";
        assert_eq!(
            gbnf_to_lark(g),
            "start : item (\",\" item)*  \nitem : [a-z-]+ | \"x::=y\"\nmy_rule : \"-\""
        );
        assert!(
            matches!(Spec::from_grammar_text("start: \"a\""), Spec::Lark(s) if s == "start: \"a\"")
        );
    }
}
