//! Lookahead decoding (Fu et al. 2024; Genie's `lade` dialog): Jacobi iteration over a
//! window of guessed tokens, with an n-gram pool that drafts.
//!
//! A verify feeds the current token, then a draft: the pool's best n-gram for that token
//! (when it has one), continued by the Jacobi window (the guesses for the positions after
//! it). The model's pick at every row is read. Rows up to the first rejection are the text;
//! the picks after it are the next Jacobi iteration's guesses (each conditioned on the
//! previous guesses, so a run of them converges to what greedy decoding will write), and
//! the n-grams along that trajectory go into the pool. The window is one level deep (the
//! previous iteration's guesses are the earlier levels) so that it shares one causal
//! multi-row execute with the verified prefix; output never depends on the drafts.

use std::collections::{HashMap, VecDeque};

/// `--lookahead-window`, `--lookahead-ngram`, `--lookahead-gcap` (Genie's `lade` keys
/// `window`, `ngram`, `gcap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookaheadConfig {
    /// Jacobi guesses carried ahead of the current token (rows of lookahead per verify,
    /// bounded by the verify step's rows less one).
    pub window: usize,
    /// Length of the pool's n-grams: a hit drafts `ngram - 1` tokens.
    pub ngram: usize,
    /// Guess-cache capacity: n-grams kept per first token, newest first.
    pub gcap: usize,
}

impl Default for LookaheadConfig {
    /// Sized for an 8-row verify graph (the exporter's `--verify-rows 8`): 7 rows ahead,
    /// 4-grams (the paper's N for its 7B runs), 8 candidates per token.
    fn default() -> LookaheadConfig {
        LookaheadConfig {
            window: 7,
            ngram: 4,
            gcap: 8,
        }
    }
}

/// Lookahead state for one run: the pool and the Jacobi window.
#[derive(Debug, Clone)]
pub struct Lookahead {
    cfg: LookaheadConfig,
    /// First token → the `ngram - 1` tokens that followed it, newest first.
    pool: HashMap<u32, VecDeque<Vec<u32>>>,
    /// Guesses for the positions after the current token, nearest first.
    window: Vec<u32>,
    /// How much of the history has been harvested into the pool.
    seen: usize,
}

impl Lookahead {
    pub fn new(cfg: LookaheadConfig) -> Lookahead {
        Lookahead {
            cfg: LookaheadConfig {
                window: cfg.window.max(1),
                ngram: cfg.ngram.max(2),
                gcap: cfg.gcap.max(1),
            },
            pool: HashMap::new(),
            window: Vec::new(),
            seen: 0,
        }
    }

    /// The pool's n-gram count (for tests and stats).
    pub fn pool_len(&self) -> usize {
        self.pool.values().map(VecDeque::len).sum()
    }

    fn insert(&mut self, gram: &[u32]) {
        let (&first, rest) = gram.split_first().expect("n-grams have n >= 2 tokens");
        let cands = self.pool.entry(first).or_default();
        if let Some(i) = cands.iter().position(|c| c[..] == *rest) {
            cands.remove(i);
        }
        cands.push_front(rest.to_vec());
        cands.truncate(self.cfg.gcap);
    }

    /// The text's own n-grams ending at each new position of `history` (so repeated text
    /// is drafted too, as prompt lookup would).
    fn harvest(&mut self, history: &[u32]) {
        let n = self.cfg.ngram;
        let from = self.seen.min(history.len()).max(n);
        for end in from..=history.len() {
            self.insert(&history[end - n..end]);
        }
        self.seen = history.len();
    }

    /// Draft up to `max` tokens after `history` (its last token is the current one, not
    /// yet fed): the pool candidate for it that agrees longest with the window (newest on
    /// a tie), then the window's guesses for the positions after the candidate.
    pub fn draft(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        let Some(&tok) = history.last() else {
            return Vec::new();
        };
        self.harvest(history);
        if self.window.is_empty() {
            // Nothing guessed yet (the run's start, or every guess used): start the Jacobi
            // iteration from the text before the current token, as the paper seeds its
            // window from the prompt. Wrong guesses cost only rows.
            let w = self.cfg.window;
            let n = history.len() - 1;
            self.window = history[n.saturating_sub(w)..n].to_vec();
        }
        // Chain through the pool: the best candidate for the current token, then for the
        // candidate's last token, and so on; where the pool has nothing, the window's
        // guesses for the positions still open.
        let ahead = self.cfg.window.min(max);
        let mut d: Vec<u32> = Vec::with_capacity(ahead);
        while d.len() < ahead {
            let last = d.last().copied().unwrap_or(tok);
            let guess = self.window.get(d.len()..).unwrap_or(&[]);
            let agree = |c: &[u32]| c.iter().zip(guess).take_while(|(a, b)| a == b).count();
            // `max_by_key` keeps the last of equals: walk oldest first so the newest wins.
            let best = self
                .pool
                .get(&last)
                .and_then(|cands| cands.iter().rev().max_by_key(|c| agree(c)));
            match best {
                Some(c) => d.extend(c.iter().take(ahead - d.len())),
                None => {
                    d.extend(guess.iter().take(ahead - d.len()));
                    break;
                }
            }
        }
        d
    }

    /// A verify fed `fed` (the current token, then the draft) and the model picked
    /// `picks[j]` after row `j` (every row the verify has; a pick after the last row may
    /// be missing). `kept` drafts were accepted, so `picks[kept]` is the new current
    /// token. The picks after it are the next window; the n-grams along the trajectory
    /// past the kept prefix go into the pool (the kept ones arrive with the history).
    pub fn verified(&mut self, fed: &[u32], picks: &[u32], kept: usize) {
        let n = self.cfg.ngram;
        // Row j's n-gram: the n - 1 tokens fed up to it, then its pick.
        for j in (kept + 1)..picks.len().min(fed.len()) {
            if j + 2 >= n {
                let mut gram = fed[j + 2 - n..=j].to_vec();
                gram.push(picks[j]);
                self.insert(&gram);
            }
        }
        let next: Vec<u32> = picks.iter().skip(kept + 1).copied().collect();
        self.window = next;
        self.extend_window();
    }

    /// A plain decode step picked the current token: the guess for its position is spent.
    pub fn decoded(&mut self) {
        if !self.window.is_empty() {
            self.window.remove(0);
        }
    }

    /// Grow a short window back to `window` guesses from the pool: after each guess, the
    /// newest n-gram that starts with it (one step of the pool's own chain).
    fn extend_window(&mut self) {
        while self.window.len() < self.cfg.window {
            let Some(&last) = self.window.last() else {
                return;
            };
            match self.pool.get(&last).and_then(|c| c.front()) {
                Some(next) => {
                    let room = self.cfg.window - self.window.len();
                    self.window.extend(next.iter().take(room));
                }
                None => return,
            }
        }
    }

    #[cfg(test)]
    fn window(&self) -> &[u32] {
        &self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn la(window: usize, ngram: usize, gcap: usize) -> Lookahead {
        Lookahead::new(LookaheadConfig {
            window,
            ngram,
            gcap,
        })
    }

    #[test]
    fn the_text_seeds_the_pool_and_a_hit_drafts_its_continuation() {
        let mut l = la(3, 3, 2);
        // "1 2 3 . 1": the 3-gram [1 2 3] is in the text; 1 drafts 2 3, then the window.
        let d = l.draft(&[1, 2, 3, 9, 1], 6);
        assert_eq!(&d[..2], &[2, 3]);
        // The window started from the text before the current token: [2 3 9], of which
        // the first two positions are the candidate's; guess 9 continues it.
        assert_eq!(d, vec![2, 3, 9]);
        assert_eq!(l.pool_len(), 3); // [1 2 3] [2 3 9] [3 9 1]
                                     // `max` bounds the draft.
        assert_eq!(l.draft(&[1, 2, 3, 9, 1], 1), vec![2]);
    }

    #[test]
    fn a_verify_moves_the_window_to_the_picks_after_the_kept_prefix() {
        let mut l = la(4, 3, 8);
        // Fed: current 5, drafts 6 7 8; the model kept 6 (pick 6 after 5) then picked 4
        // after 6 (so 7 was rejected), then 8 after 7, 1 after 8.
        l.verified(&[5, 6, 7, 8], &[6, 4, 8, 1], 1);
        // New current token: 4; the window is the picks after it: 8, 1 (then the pool's
        // chain: [7 8 1] does not start with 1, so it stays short).
        assert_eq!(l.window(), &[8, 1]);
        // Trajectory n-grams past the kept prefix: rows 2 and 3: [6 7 8], [7 8 1].
        assert_eq!(l.pool.get(&6).unwrap()[0], vec![7, 8]);
        assert_eq!(l.pool.get(&7).unwrap()[0], vec![8, 1]);
        // The window grows back along the pool: a guess 6 continues with 7 8.
        l.verified(&[3, 6], &[2, 6], 0);
        assert_eq!(l.window(), &[6, 7, 8]);
        // A plain decode spends the first guess.
        l.decoded();
        assert_eq!(l.window(), &[7, 8]);
    }

    #[test]
    fn the_candidate_agreeing_with_the_window_wins_and_gcap_bounds_the_pool() {
        let mut l = la(3, 3, 2);
        l.insert(&[1, 5, 6]);
        l.insert(&[1, 7, 8]);
        l.window = vec![5, 6, 0];
        // [5 6] agrees with the window over two tokens, [7 8] (newer) over none.
        assert_eq!(l.draft(&[1], 3), vec![5, 6, 0]);
        l.window = vec![9, 9, 9];
        // No agreement: the newest wins.
        assert_eq!(l.draft(&[1], 3), vec![7, 8, 9]);
        // gcap 2: a third n-gram for 1 drops the oldest; a repeat moves to the front.
        l.insert(&[1, 2, 2]);
        assert_eq!(l.pool[&1], VecDeque::from(vec![vec![2, 2], vec![7, 8]]));
        l.insert(&[1, 7, 8]);
        assert_eq!(l.pool[&1], VecDeque::from(vec![vec![7, 8], vec![2, 2]]));
    }
}
