//! When a verify pays: the adaptive switch of `--spec-adaptive`.

use super::{Adaptive, SpecStats};

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
}
