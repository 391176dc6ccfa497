//! Speculative decoding: draft several tokens cheaply, verify them in one execute of a
//! step that takes several rows over the cache (a chunked-prefill graph, a Genie AR-N
//! variant), and keep the longest drafted prefix the model itself would have picked, plus
//! the model's own pick after it. Greedy output is therefore unchanged, token for token;
//! rejected rows are undone by position and mask (`Runner::rewind`), never by copying.

use serde::Serialize;

mod governor;
mod lookahead;
mod lookup;

pub use governor::Governor;
pub use lookahead::{Lookahead, LookaheadConfig};
pub use lookup::lookup;

/// Where drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftKind {
    /// Prompt lookup: the longest suffix of the text so far (`ngram_max` tokens down to
    /// `ngram_min`) that also occurred earlier proposes what followed its latest earlier
    /// occurrence. Pays on text that repeats its context (code edits, summaries, quotes).
    Lookup,
    /// Lookahead (Jacobi) decoding: the rows after the verified prefix carry the model's
    /// own guesses for the positions ahead, refined by every verify; the n-grams they and
    /// the text form go into a pool that drafts when its first token comes up. Drafts on
    /// open text too, with no second model.
    Lookahead,
    /// A second bundle with the same tokenizer drafts greedily ([`crate::draft::DraftModel`]).
    Draft,
}

impl DraftKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DraftKind::Lookup => "lookup",
            DraftKind::Lookahead => "lookahead",
            DraftKind::Draft => "draft",
        }
    }
}

/// Speculation settings (`--spec`, `--draft-max`, `--draft-min`, `--spec-adaptive`).
#[derive(Debug, Clone, PartialEq)]
pub struct SpecConfig {
    pub kind: DraftKind,
    /// Most tokens drafted per verify (also bounded by the verify step's rows less one).
    pub draft_max: usize,
    /// Fewer drafted tokens than this are not verified: the step runs as plain decode.
    pub draft_min: usize,
    /// Longest and shortest suffix n-gram the lookup matches.
    pub ngram_max: usize,
    pub ngram_min: usize,
    /// When speculation pays (`--spec-adaptive`).
    pub adaptive: Adaptive,
    /// `--spec lookahead`: the Jacobi window and the n-gram pool.
    pub lookahead: LookaheadConfig,
    /// `--spec draft`: the draft model stops drafting at a pick it gives less than this
    /// probability (`--draft-p-min`).
    pub draft_p_min: f32,
    /// `--spec draft BUNDLE`: the draft bundle's manifest or Genie config (its artifacts
    /// beside it), loaded onto the target's backend ([`crate::draft::DraftModel::load`]).
    pub draft_bundle: Option<std::path::PathBuf>,
}

/// How speculation decides whether a verify pays (`--spec-adaptive`). A verify of a few
/// rows costs about `r` decode steps and yields `E` tokens on average (accepted drafts
/// plus the model's own pick): it pays while `E > r`. `E` is tracked while speculating and,
/// while not, from the drafts the run would have verified, scored against the tokens plain
/// decoding picks (free: no execute), so speculation switches back on when the text starts
/// repeating its context again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Adaptive {
    /// Verify every draft.
    Off,
    /// `r` measured: the running ratio of verify to decode wall time (on a phone, the
    /// graphs' real costs; on the emulator, CPU time, which grows with the rows).
    Measure,
    /// `r` given, in decode steps (e.g. from the exporter's `--estimate` of the verify and
    /// decode graphs).
    Cost(f64),
}

impl Adaptive {
    pub fn describe(self) -> String {
        match self {
            Adaptive::Off => "off".into(),
            Adaptive::Measure => "measure".into(),
            Adaptive::Cost(r) => format!("cost {r}"),
        }
    }
}

impl SpecConfig {
    /// The defaults of `kind`.
    pub fn of(kind: DraftKind) -> SpecConfig {
        SpecConfig {
            kind,
            ..SpecConfig::lookup()
        }
    }

    pub fn lookup() -> SpecConfig {
        SpecConfig {
            kind: DraftKind::Lookup,
            draft_max: 8,
            draft_min: 1,
            ngram_max: 4,
            // One-token matches (a common word, a bracket) draft mostly rejected tokens:
            // on the task set they lower tokens per verify from 2.3 to 1.9 on a summary.
            ngram_min: 2,
            adaptive: Adaptive::Measure,
            lookahead: LookaheadConfig::default(),
            // llama.cpp's speculative default: a draft pick below 75 % is more often wrong
            // than worth its row.
            draft_p_min: 0.75,
            draft_bundle: None,
        }
    }
}

/// Counts of one speculative run (`--json`'s `"spec"`).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SpecStats {
    #[serde(rename = "type")]
    pub kind: String,
    /// `--draft-max`.
    pub k: usize,
    /// Tokens proposed to verifies, and how many of them the model kept.
    pub drafted: usize,
    pub accepted: usize,
    /// Drafted tokens a grammar refused: cut from the draft before the verify, never fed.
    pub refused: usize,
    /// Multi-row verify executes.
    pub verifies: usize,
    /// Generated tokens per verify (accepted drafts plus the model's own pick).
    pub tokens_per_verify: f64,
    /// Graph executes (verifies and plain decode steps) per generated token after the
    /// first; 1.0 without speculation.
    pub decode_executes_per_token: f64,
    /// Plain one-row decode executes (no draft, no verify step free at this position, or
    /// speculation switched off).
    pub plain: usize,
    /// `--spec-adaptive`: off, measure, or cost R.
    pub adaptive: String,
    /// Steps with a draft that ran as plain decode because speculation did not pay, and
    /// how many times it switched off.
    pub skipped: usize,
    pub switched_off: usize,
    /// The verify cost in decode steps the last decision used (None: not known yet).
    pub verify_cost: Option<f64>,
    /// Tokens a verify yields on average, as the last decision saw it.
    pub expected_yield: Option<f64>,
    /// Tokens generated after the first, from verifies.
    #[serde(skip)]
    pub verify_tokens: usize,
    /// `--spec lookahead`: n-grams in the pool at the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<usize>,
    /// `--spec draft`: the draft model's graph executes (its prompt chunks included).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_executes: Option<usize>,
}

impl SpecStats {
    pub fn new(cfg: &SpecConfig) -> SpecStats {
        SpecStats {
            kind: cfg.kind.as_str().to_string(),
            k: cfg.draft_max,
            adaptive: cfg.adaptive.describe(),
            ..Default::default()
        }
    }

    /// Fill the ratios.
    pub fn finish(&mut self) {
        self.tokens_per_verify = if self.verifies > 0 {
            self.verify_tokens as f64 / self.verifies as f64
        } else {
            0.0
        };
        let tokens = self.verify_tokens + self.plain;
        self.decode_executes_per_token = if tokens > 0 {
            (self.verifies + self.plain) as f64 / tokens as f64
        } else {
            0.0
        };
    }
}
