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

/// Speculation settings (`--spec`, `--draft-max`, `--draft-min`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecConfig {
    pub kind: DraftKind,
    /// Most tokens drafted per verify (also bounded by the verify step's rows less one).
    pub draft_max: usize,
    /// Fewer drafted tokens than this are not verified: the step runs as plain decode.
    pub draft_min: usize,
    /// Longest and shortest suffix n-gram the lookup matches.
    pub ngram_max: usize,
    pub ngram_min: usize,
}

impl SpecConfig {
    pub fn lookup() -> SpecConfig {
        SpecConfig {
            kind: DraftKind::Lookup,
            draft_max: 8,
            draft_min: 1,
            ngram_max: 4,
            ngram_min: 1,
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
    /// Multi-row verify executes.
    pub verifies: usize,
    /// Generated tokens per verify (accepted drafts plus the model's own pick).
    pub tokens_per_verify: f64,
    /// Graph executes (verifies and plain decode steps) per generated token after the
    /// first; 1.0 without speculation.
    pub decode_executes_per_token: f64,
    /// Plain one-row decode executes (no draft, or no verify step free at this position).
    #[serde(skip)]
    pub plain: usize,
    /// Tokens generated after the first, from verifies.
    #[serde(skip)]
    pub verify_tokens: usize,
}

impl SpecStats {
    pub fn new(cfg: &SpecConfig) -> SpecStats {
        SpecStats {
            kind: cfg.kind.as_str().to_string(),
            k: cfg.draft_max,
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
    fn lookup_takes_the_longest_suffix_and_its_latest_occurrence() {
        let cfg = SpecConfig::lookup();
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
        let strict = SpecConfig {
            ngram_min: 2,
            ..SpecConfig::lookup()
        };
        assert!(lookup(&[4, 5, 4], &strict, 8).is_empty());
    }
}
