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
/// `-`, Lark does not), in the start rule (`root` vs `start`), and in character classes and
/// the any-character `.`, which Lark writes as regexes (`/[a-z]/`; a bare `[x]` is Lark's
/// "optional x"). Strings, grouping, alternation and the `* + ? {m,n}` repeats read the same
/// in llguidance's Lark.
pub fn gbnf_to_lark(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.chars().peekable();
    // Copy quoted strings verbatim, classes as regexes; rename identifiers elsewhere.
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                out.push(c);
                while let Some(d) = chars.next() {
                    out.push(d);
                    if d == '\\' {
                        if let Some(e) = chars.next() {
                            out.push(e);
                        }
                    } else if d == '"' {
                        break;
                    }
                }
            }
            '[' => {
                // The class as a regex: its escapes are regex escapes already (`\n`, `\x41`,
                // `\u0041`, `\]`); only the regex's delimiter needs one.
                out.push_str("/[");
                while let Some(d) = chars.next() {
                    match d {
                        '\\' => {
                            out.push(d);
                            if let Some(e) = chars.next() {
                                out.push(e);
                            }
                        }
                        '/' => out.push_str("\\/"),
                        ']' => break,
                        _ => out.push(d),
                    }
                }
                out.push_str("]/");
            }
            // Any one character, newlines included.
            '.' => out.push_str("/(?s:.)/"),
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
        let words = llguidance::token_bytes_from_tokenizer_json(&v)
            .map_err(|e| err(format!("cannot list its tokens for structured output: {e}")))?;
        Vocab::from_tokens(words, n_vocab, eos).map_err(|e| err(e.to_string()))
    }

    /// The same from the tokens' byte strings (a special token's start with 0xFF, as
    /// llguidance writes them).
    pub fn from_tokens(mut words: Vec<Vec<u8>>, n_vocab: usize, eos: u32) -> Result<Vocab> {
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
            .map_err(|e| Error::Grammar(format!("setup failed: {e}")))?;
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

/// A grammar problem, as one line: llguidance's first line, with a regex-syntax report
/// folded into it (its pattern, carets and `error:` lines) and the grammar excerpt and
/// parser state dump that follow dropped.
fn gerr(msg: impl std::fmt::Display) -> Error {
    let text = msg.to_string();
    if let Some(r) = RegexReport::find(&text) {
        return Error::Grammar(r.line());
    }
    let first = text.lines().next().unwrap_or("").trim();
    Error::Grammar(first.trim_end_matches(':').to_string())
}

/// A JSON schema's compile error: a bad regex is named by its place in the schema (a
/// JSON pointer), as written there, with regex-syntax's own account of where it fails;
/// llguidance reports the regex after its rewrite (`\d` → `[0-9]`) and no place.
fn schema_err(schema: &serde_json::Value, msg: impl std::fmt::Display) -> Error {
    let text = msg.to_string();
    match RegexReport::find(&text).and_then(|r| schema_regex_error(schema, &r)) {
        Some(line) => Error::Grammar(line),
        None => gerr(text),
    }
}

/// regex-syntax's report inside an llguidance message (one-line patterns; a multi-line
/// one gives no column):
///
/// ```text
/// <context>regex parse error:
///     <pattern>
///     <carets under the span>
/// error: <what>
/// ```
#[derive(Debug, PartialEq)]
struct RegexReport<'a> {
    /// What llguidance said before the report (e.g. a Lark grammar's line and column).
    context: &'a str,
    pattern: Option<&'a str>,
    /// 1-based column (in characters) of the span's start, and its length.
    span: Option<(usize, usize)>,
    what: &'a str,
}

/// regex-syntax indents the pattern and the carets by four spaces.
const REPORT_INDENT: &str = "    ";

impl<'a> RegexReport<'a> {
    fn find(text: &'a str) -> Option<RegexReport<'a>> {
        const HEAD: &str = "regex parse error:";
        let lines: Vec<&str> = text.lines().collect();
        let at = lines.iter().position(|l| l.trim_end().ends_with(HEAD))?;
        let context = lines[at].trim_end().strip_suffix(HEAD)?.trim_end();
        let rest = &lines[at + 1..];
        let end = rest.iter().position(|l| l.starts_with("error: "))?;
        let what = rest[end]["error: ".len()..].trim();
        let (pattern, span) = match rest[..end] {
            [p, carets] => match (p.strip_prefix(REPORT_INDENT), carets.find('^')) {
                (Some(p), Some(i)) => {
                    let col = (carets[..i].chars().count() + 1).saturating_sub(REPORT_INDENT.len());
                    let len = carets[i..].chars().take_while(|&c| c == '^').count();
                    (Some(p), Some((col, len)))
                }
                _ => (None, None),
            },
            _ => (None, None),
        };
        Some(RegexReport {
            context: context.trim_end_matches(':'),
            pattern,
            span,
            what,
        })
    }

    /// The report as one line, after its context.
    fn line(&self) -> String {
        let pos = self.pattern.zip(self.span).map(|(p, s)| at_column(p, s));
        let pos = pos.unwrap_or_default();
        let quoted = self.pattern.map(|p| format!("\"{p}\""));
        match quoted {
            // The context (a Lark grammar's) already shows the regex.
            Some(q) if self.context.contains(&q) => {
                format!("{}: {}{pos}", self.context, self.what)
            }
            Some(q) if self.context.is_empty() => {
                format!("regex {q} does not parse: {}{pos}", self.what)
            }
            Some(q) => format!(
                "{}: regex {q} does not parse: {}{pos}",
                self.context, self.what
            ),
            None if self.context.is_empty() => format!("regex parse error: {}", self.what),
            None => format!("{}: regex parse error: {}", self.context, self.what),
        }
    }
}

/// ` at column C ("text")`: where in `pattern` the span (1-based column, length in
/// characters) starts, and what it covers when that is not the whole pattern.
fn at_column(pattern: &str, (col, len): (usize, usize)) -> String {
    let text: String = pattern
        .chars()
        .skip(col.saturating_sub(1))
        .take(len)
        .collect();
    if text.is_empty() || text == pattern {
        format!(" at column {col}")
    } else {
        format!(" at column {col} ({})", quote(&text))
    }
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

/// The schema's regex llguidance could not parse: the one whose rewrite is the pattern
/// its report shows, else the first that regex-syntax refuses.
fn schema_regex_error(schema: &serde_json::Value, report: &RegexReport) -> Option<String> {
    let mut found = Vec::new();
    schema_regexes(schema, "", &mut found);
    let rewritten =
        |re: &str| Some(llguidance::regex_to_lark(re, "dw")) == report.pattern.map(str::to_string);
    let (path, re) = found
        .iter()
        .find(|(_, re)| rewritten(re))
        .or_else(|| found.iter().find(|(_, re)| parse_regex(re).is_err()))?;
    let why = match parse_regex(re) {
        Err(e) => e,
        // regex-syntax takes it as written: give llguidance's account of its rewrite.
        Ok(()) => {
            let pos = report
                .pattern
                .zip(report.span)
                .map(|(p, s)| at_column(p, s));
            let rw = report
                .pattern
                .map(|p| format!(" of its rewrite {}", quote(p)));
            format!(
                "{}{}{}",
                report.what,
                pos.unwrap_or_default(),
                rw.unwrap_or_default()
            )
        }
    };
    Some(format!(
        "JSON schema {path}: regex {} does not parse: {why}",
        quote(re)
    ))
}

/// Parse `re` as llguidance's regex engine does (regex-syntax, default settings); the
/// error as `what at column C ("text")`.
fn parse_regex(re: &str) -> std::result::Result<(), String> {
    let e = match regex_syntax::Parser::new().parse(re) {
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    let (what, span) = match &e {
        regex_syntax::Error::Parse(a) => (a.kind().to_string(), *a.span()),
        regex_syntax::Error::Translate(h) => (h.kind().to_string(), *h.span()),
        _ => return Err(e.to_string().lines().last().unwrap_or("").to_string()),
    };
    let len = re
        .get(span.start.offset..span.end.offset)
        .map_or(0, |t| t.chars().count());
    let line = if span.start.line > 1 {
        format!(" on line {}", span.start.line)
    } else {
        String::new()
    };
    let on_line = re
        .lines()
        .nth(span.start.line.saturating_sub(1))
        .unwrap_or(re);
    Err(format!(
        "{what}{line}{}",
        at_column(on_line, (span.start.column, len))
    ))
}

/// Every regex a JSON schema holds, with its JSON pointer, in document order: `pattern`
/// values and `patternProperties` keys. `enum`, `const`, `default` and `examples` hold
/// data, not schemas, and are not searched; the names in `properties` and `$defs` are
/// names, never keywords.
fn schema_regexes(v: &serde_json::Value, path: &str, out: &mut Vec<(String, String)>) {
    use serde_json::Value;
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                let here = pointer(path, k);
                match (k.as_str(), x) {
                    ("pattern", Value::String(re)) => out.push((here, re.clone())),
                    ("patternProperties", Value::Object(p)) => {
                        for (re, sub) in p {
                            let at = pointer(&here, re);
                            out.push((at.clone(), re.clone()));
                            schema_regexes(sub, &at, out);
                        }
                    }
                    (
                        "properties" | "$defs" | "definitions" | "dependentSchemas",
                        Value::Object(p),
                    ) => {
                        for (name, sub) in p {
                            schema_regexes(sub, &pointer(&here, name), out);
                        }
                    }
                    ("enum" | "const" | "default" | "examples" | "x-guidance", _) => {}
                    _ => schema_regexes(x, &here, out),
                }
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                schema_regexes(x, &pointer(path, &i.to_string()), out);
            }
        }
        _ => {}
    }
}

/// `path` + `/key`, the key escaped as a JSON pointer token (RFC 6901).
fn pointer(path: &str, key: &str) -> String {
    format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"))
}

impl Constraint {
    /// Compile `spec`. A grammar that does not compile, or that can match nothing at all,
    /// is an error here, before any token is generated.
    pub fn new(vocab: &Vocab, spec: &Spec) -> Result<Constraint> {
        let grammar = match spec {
            Spec::JsonSchema(s) => TopLevelGrammar::from_json_schema(with_json_layout(s)),
            Spec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        };
        let err = |e: &dyn std::fmt::Display| match spec {
            Spec::JsonSchema(s) => schema_err(s, e),
            Spec::Lark(_) => gerr(e),
        };
        let parser = vocab.factory.create_parser(grammar).map_err(|e| err(&e))?;
        let mut m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(err(&e));
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

    /// How many leading tokens of `draft` the grammar would take in turn from here (the
    /// end token counts when the output so far is complete); the state is unchanged.
    /// Speculation cuts a draft there, so a token the grammar refuses is never fed.
    pub fn admits(&mut self, draft: &[u32]) -> Result<usize> {
        match draft.first() {
            // The first is read off the mask the next pick uses: exact, and no parser work.
            Some(&t) if self.allows(t) => {}
            _ => return Ok(0),
        }
        if self.m.is_stopped() {
            // Complete: the end token (allowed, so it is the first) ends the run there.
            return Ok(1);
        }
        Ok(self
            .m
            .validate_tokens(draft)
            .map_err(gerr)?
            .clamp(1, draft.len()))
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
            "start : item (\",\" item)*  \nitem : /[a-z-]/+ | \"x::=y\"\nmy_rule : \"-\""
        );
        assert!(
            matches!(Spec::from_grammar_text("start: \"a\""), Spec::Lark(s) if s == "start: \"a\"")
        );
    }

    /// GBNF's classes, negated classes with escapes, `.` and bounded repeats compile, and
    /// take what llama.cpp's GBNF takes.
    #[test]
    fn gbnf_classes_and_any_char_become_regexes_that_match_as_in_gbnf() {
        // The class after "/" refuses `"`, `/` and `]` (escaped in GBNF).
        let g = r#"root ::= [a-z]{2,3} "/" [^"/\]] . "-" x
x ::= [\x41-\u005a]+"#;
        assert_eq!(
            gbnf_to_lark(g),
            r#"start : /[a-z]/{2,3} "/" /[^"\/\]]/ /(?s:.)/ "-" x
x : /[\x41-\u005a]/+"#
        );
        let v = bytes_vocab();
        let Spec::Lark(lark) = Spec::from_grammar_text(g) else {
            unreachable!()
        };
        let mut c = Constraint::new(&v, &Spec::Lark(lark)).unwrap();
        let ids = |s: &str| s.bytes().map(u32::from).collect::<Vec<_>>();
        // `.` takes a newline; `x` takes A-Z only.
        assert_eq!(c.admits(&ids("abc/q\n-QZ")).unwrap(), 9);
        assert_eq!(c.admits(&ids("abc/q\n-a")).unwrap(), 7);
        assert_eq!(c.admits(&ids("ab/]")).unwrap(), 3);
        assert_eq!(c.admits(&ids("ab//")).unwrap(), 3);
        assert_eq!(c.admits(&ids("abcd")).unwrap(), 3);
        assert_eq!(c.admits(&ids("A")).unwrap(), 0);
    }

    /// A vocabulary of the 256 single bytes and an end token (256).
    fn bytes_vocab() -> Vocab {
        let words = (0..=255u8).map(|b| vec![b]).collect();
        Vocab::from_tokens(words, 257, 256).unwrap()
    }

    fn schema_error(schema: serde_json::Value) -> String {
        let v = bytes_vocab();
        match Constraint::new(&v, &Spec::JsonSchema(schema)) {
            Err(Error::Grammar(m)) => m,
            other => panic!("not a grammar error: {other:?}"),
        }
    }

    #[test]
    fn a_bad_schema_regex_is_named_by_its_place_as_written() {
        use serde_json::json;
        for (schema, want) in [
            (
                json!({"type": "object", "properties": {"name": {"type": "string", "pattern": "\\d+(ab"}}}),
                r#"JSON schema /properties/name/pattern: regex "\\d+(ab" does not parse: unclosed group at column 4 ("(")"#,
            ),
            (
                json!({"type": "string", "pattern": "a{2,1}"}),
                r#"JSON schema /pattern: regex "a{2,1}" does not parse: invalid repetition count range, the start must be <= the end at column 2 ("{2,1}")"#,
            ),
            (
                json!({"type": "object", "patternProperties": {"^x/[": {"type": "string"}}}),
                r#"JSON schema /patternProperties/^x~1[: regex "^x/[" does not parse: unclosed character class at column 4 ("[")"#,
            ),
            (
                json!({"$defs": {"id": {"type": "string", "pattern": "(?<=a)b"}}, "type": "object",
                    "properties": {"a": {"$ref": "#/$defs/id"}}}),
                r#"JSON schema /$defs/id/pattern: regex "(?<=a)b" does not parse: look-around, including look-ahead and look-behind, is not supported at column 1 ("(?<=")"#,
            ),
        ] {
            let got = schema_error(schema.clone());
            assert_eq!(got, want, "{schema}");
            assert_eq!(got.lines().count(), 1);
        }
    }

    #[test]
    fn enum_values_and_property_names_are_not_taken_for_regexes() {
        let mut found = Vec::new();
        let schema = serde_json::json!({"properties": {"pattern": {"type": "string", "pattern": "a+"}},
            "enum": [{"pattern": "("}], "anyOf": [{"pattern": "b"}]});
        schema_regexes(&schema, "", &mut found);
        let want = [
            ("/properties/pattern/pattern", "a+"),
            ("/anyOf/0/pattern", "b"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(p, r)| (p.to_string(), r.to_string()))
            .collect();
        assert_eq!(found, want);
    }

    #[test]
    fn a_lark_regex_error_is_one_line_with_its_place() {
        let v = bytes_vocab();
        let e = Constraint::new(&v, &Spec::Lark("start: x\nx: /ab(/".into())).unwrap_err();
        let Error::Grammar(m) = e else {
            panic!("{e:?}")
        };
        assert_eq!(
            m,
            r#"at 2(4): invalid regex "ab(" (in regex): unclosed group at column 3 ("(")"#
        );
    }

    /// `admits` counts the draft tokens the grammar takes in turn and leaves the state as it
    /// was: the refused token and everything after it are cut, never committed.
    #[test]
    fn admits_stops_at_the_first_refused_token_and_keeps_the_state() {
        let v = bytes_vocab();
        let schema = serde_json::json!({"type": "object", "properties": {"n": {"type": "integer"}},
            "required": ["n"], "additionalProperties": false});
        let mut c = Constraint::new(&v, &Spec::JsonSchema(schema)).unwrap();
        let allowed = |c: &Constraint| (0..257u32).filter(|&t| c.allows(t)).collect::<Vec<_>>();
        for &b in br#"{"n": "# {
            assert!(c.allows(u32::from(b)), "{}", b as char);
            c.commit(u32::from(b)).unwrap();
        }
        let before = allowed(&c);
        let ids = |s: &str| s.bytes().map(u32::from).collect::<Vec<_>>();
        // An integer, then a quote the grammar refuses there.
        assert_eq!(c.admits(&ids("42\"x")).unwrap(), 2);
        assert_eq!(c.admits(&ids("\"x")).unwrap(), 0);
        assert_eq!(c.admits(&ids("7}")).unwrap(), 2);
        assert_eq!(c.admits(&[ids("7}"), vec![256, 256]].concat()).unwrap(), 3);
        assert_eq!(c.admits(&[]).unwrap(), 0);
        assert_eq!(allowed(&c), before, "admits changed the state");
        // A complete document: the end token is admitted after it, nothing else.
        for &b in b"7}" {
            c.commit(u32::from(b)).unwrap();
        }
        assert_eq!(c.admits(&[256, 256]).unwrap(), 1);
        assert_eq!(c.admits(&ids(" ")).unwrap(), 0);
    }
}
