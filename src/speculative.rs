//! Speculative decoding: draft several tokens cheaply, verify them in one execute of a
//! step that takes several rows over the cache (a chunked-prefill graph, a Genie AR-N
//! variant), and keep the longest drafted prefix the model itself would have picked, plus
//! the model's own pick after it. Greedy output is therefore unchanged, token for token;
//! rejected rows are undone by position and mask (`Runner::rewind`), never by copying.

use serde::Serialize;

/// Where drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftKind {
    /// Prompt lookup: the longest suffix of the text so far (`ngram_max` tokens down to
    /// `ngram_min`) that also occurred earlier proposes what followed its latest earlier
    /// occurrence. Pays on text that repeats its context (code edits, summaries, quotes).
    Lookup,
}

impl DraftKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DraftKind::Lookup => "lookup",
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

/// Weight of the newest observation in the running averages: about the last eight verifies.
const EMA: f64 = 0.25;
/// A verify must beat plain decoding by this factor to switch speculation back on, and
/// lose by it to switch off, so a ratio near 1 does not flip every step.
const HYSTERESIS: f64 = 1.05;

/// Decides, step by step, whether a draft is verified ([`Adaptive`]).
#[derive(Debug, Clone)]
pub struct Governor {
    mode: Adaptive,
    on: bool,
    /// Running mean of tokens per verify (actual, or scored while off).
    yield_ema: Option<f64>,
    /// Running mean wall times (ms) of a verify and of a decode step (`Measure`).
    verify_ms: Option<f64>,
    decode_ms: Option<f64>,
    /// A draft made while off, and how many of its tokens plain decoding has matched.
    shadow: Option<(Vec<u32>, usize)>,
}

fn ema(old: Option<f64>, x: f64) -> f64 {
    old.map_or(x, |o| o + EMA * (x - o))
}

impl Governor {
    pub fn new(mode: Adaptive) -> Governor {
        Governor {
            mode,
            on: true,
            yield_ema: None,
            verify_ms: None,
            decode_ms: None,
            shadow: None,
        }
    }

    /// The verify cost in decode steps, when known.
    pub fn cost(&self) -> Option<f64> {
        match self.mode {
            Adaptive::Off => None,
            Adaptive::Cost(r) => Some(r),
            Adaptive::Measure => match (self.verify_ms, self.decode_ms) {
                (Some(v), Some(d)) if d > 0.0 => Some(v / d),
                _ => None,
            },
        }
    }

    /// Whether to verify the draft at hand.
    pub fn speculate(&self) -> bool {
        self.on
    }

    /// Re-decide from the running means; true when speculation just switched off.
    fn decide(&mut self) -> bool {
        let (Some(e), Some(r)) = (self.yield_ema, self.cost()) else {
            // Nothing to weigh yet: keep speculating (a verify is how `Measure` learns).
            return false;
        };
        let was = self.on;
        if self.on && e * HYSTERESIS < r {
            self.on = false;
        } else if !self.on && e > r * HYSTERESIS {
            self.on = true;
        }
        was && !self.on
    }

    /// A verify ran: it yielded `tokens` and took `ms`. True when speculation switched off.
    pub fn verified(&mut self, tokens: usize, ms: f64) -> bool {
        self.yield_ema = Some(ema(self.yield_ema, tokens as f64));
        self.verify_ms = Some(ema(self.verify_ms, ms));
        self.decide()
    }

    /// A plain decode step took `ms`.
    pub fn decoded(&mut self, ms: f64) {
        self.decode_ms = Some(ema(self.decode_ms, ms));
    }

    /// While off: a draft the run would have verified, to score against what follows.
    pub fn shadow(&mut self, draft: Vec<u32>) {
        if self.shadow.is_none() && !draft.is_empty() {
            self.shadow = Some((draft, 0));
        }
    }

    /// Plain decoding picked `tok`: score the pending draft. Its verify would have yielded
    /// the matched tokens plus the model's own pick after them.
    pub fn picked(&mut self, tok: u32) {
        let Some((d, m)) = self.shadow.as_mut() else {
            return;
        };
        if d.get(*m) == Some(&tok) {
            *m += 1;
            if *m < d.len() {
                return;
            }
        }
        let y = (*m + 1) as f64;
        self.shadow = None;
        self.yield_ema = Some(ema(self.yield_ema, y));
        self.decide();
    }

    /// The running means, for the stats.
    pub fn report(&self, st: &mut SpecStats) {
        st.verify_cost = self.cost();
        st.expected_yield = self.yield_ema;
    }
}

/// Draft up to `max` tokens to follow `history` (prompt and output so far, the last token
/// included): prompt lookup, longest matching suffix first, latest earlier occurrence.
pub fn lookup(history: &[u32], cfg: &SpecConfig, max: usize) -> Vec<u32> {
    let n = history.len();
    if max == 0 {
        return Vec::new();
    }
    for g in (cfg.ngram_min.max(1)..=cfg.ngram_max).rev() {
        if g >= n {
            continue;
        }
        let suffix = &history[n - g..];
        // Latest earlier occurrence whose continuation is non-empty: start at n - g - 1.
        for start in (0..n - g).rev() {
            if &history[start..start + g] == suffix {
                let from = start + g;
                let to = (from + max).min(n);
                return history[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_governor_switches_off_when_verifies_lose_and_on_when_drafts_match_again() {
        // A verify costs 2 decode steps.
        let mut g = Governor::new(Adaptive::Cost(2.0));
        assert!(g.speculate());
        // Verifies yielding 3 tokens pay; yielding 1 (every draft rejected) loses.
        assert!(!g.verified(3, 1.0));
        assert!(g.speculate());
        let mut off = false;
        for _ in 0..8 {
            off |= g.verified(1, 1.0);
        }
        assert!(off && !g.speculate());
        // Off: drafts are scored against plain picks. A draft [5 6 7] followed by 5 6 9
        // would have yielded 3 tokens (5, 6, then the model's 9).
        for _ in 0..8 {
            g.shadow(vec![5, 6, 7]);
            g.shadow(vec![1]); // one pending draft at a time
            for t in [5, 6, 9] {
                g.picked(t);
            }
        }
        assert!(g.speculate(), "{g:?}");
        // A fully matched draft yields its length plus one.
        let mut g = Governor::new(Adaptive::Cost(2.5));
        g.on = false;
        g.shadow(vec![1, 2]);
        g.picked(1);
        g.picked(2);
        assert_eq!(g.yield_ema, Some(3.0));
        assert!(g.speculate());
        // Off never switches; Measure learns the cost from wall times.
        let mut g = Governor::new(Adaptive::Off);
        for _ in 0..8 {
            assert!(!g.verified(1, 100.0));
        }
        assert!(g.speculate());
        let mut g = Governor::new(Adaptive::Measure);
        g.decoded(10.0);
        assert!(g.verified(1, 40.0));
        assert_eq!(g.cost(), Some(4.0));
    }

    #[test]
    fn lookup_takes_the_longest_suffix_and_its_latest_occurrence() {
        let cfg = SpecConfig {
            ngram_min: 1,
            ..SpecConfig::lookup()
        };
        // "1 2 3 4 | 9 2 3 5 | ... 2 3": the 2-gram [2 3] last occurred before 5.
        let h = [1, 2, 3, 4, 9, 2, 3, 5, 7, 2, 3];
        assert_eq!(lookup(&h, &cfg, 3), vec![5, 7, 2]);
        // A longer suffix wins over a later short one: [9 2 3] occurred once, before 5.
        let h = [9, 2, 3, 6, 6, 1, 2, 3, 8, 9, 2, 3];
        assert_eq!(lookup(&h, &cfg, 2), vec![6, 6]);
        // The continuation stops at the end of the history.
        assert_eq!(lookup(&[4, 5, 4], &cfg, 8), vec![5, 4]);
        // Nothing repeats: no draft; a zero budget drafts nothing.
        assert!(lookup(&[1, 2, 3], &cfg, 8).is_empty());
        assert!(lookup(&[4, 5, 4], &cfg, 0).is_empty());
        // ngram_min bounds the shortest match.
        let strict = SpecConfig::lookup();
        assert_eq!(strict.ngram_min, 2, "the default");
        assert!(lookup(&[4, 5, 4], &strict, 8).is_empty());
    }
}
