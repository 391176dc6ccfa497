//! Token selection from logits.
//!
//! * Greedy kernels: one pass (argmax fused with the non-finite check, also straight over
//!   f16 logits).
//! * [`Sampler`]: the one filter chain, in HF transformers' order — repetition penalty,
//!   temperature, top-k, top-p, min-p ([`Sampler::apply`], which keeps the normalised
//!   candidates) — then a selector ([`Sampler::select`]: a seeded draw). Nothing sorts the whole
//!   vocabulary: [`top_candidates`] keeps a running threshold, skips 64-logit blocks whose
//!   maximum is below it, and partially selects; top-p without top-k widens a partial
//!   selection until the nucleus is covered.

use rand::{Rng, SeedableRng};

const LANES: usize = 16;

/// Largest value (NaN never wins; -inf for an empty or all-NaN slice), in a form the
/// compiler turns into SIMD max instructions.
fn max_value(v: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; LANES];
    let mut chunks = v.chunks_exact(LANES);
    for c in &mut chunks {
        let c: &[f32; LANES] = c.try_into().expect("exact chunk");
        for j in 0..LANES {
            m[j] = if c[j] > m[j] { c[j] } else { m[j] };
        }
    }
    let mut best = m
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    for &x in chunks.remainder() {
        if x > best {
            best = x;
        }
    }
    best
}

/// True when every value is finite (vectorised bit test: exponent all ones = NaN/Inf).
pub fn all_finite(v: &[f32]) -> bool {
    let mut bad = [0u32; LANES];
    let mut chunks = v.chunks_exact(LANES);
    for c in &mut chunks {
        let c: &[f32; LANES] = c.try_into().expect("exact chunk");
        for j in 0..LANES {
            bad[j] |= ((c[j].to_bits() & 0x7F80_0000) == 0x7F80_0000) as u32;
        }
    }
    bad.iter().all(|&b| b == 0) && chunks.remainder().iter().all(|x| x.is_finite())
}

/// Greedy argmax; ties go to the lower id (as QHexRT and HF do). NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let m = max_value(logits);
    if m == f32::NEG_INFINITY {
        return 0;
    }
    logits.iter().position(|&x| x == m).unwrap_or(0) as u32
}

/// Argmax with the non-finite check: `Err(i)` names the first NaN/Inf. One vectorised pass
/// keeps, per lane, the finiteness flag, the maximum and the chunk where it was first seen.
pub fn argmax_checked(logits: &[f32]) -> Result<u32, usize> {
    let mut m = [f32::NEG_INFINITY; LANES];
    let mut at = [0u32; LANES];
    let mut bad = [0u32; LANES];
    let mut chunks = logits.chunks_exact(LANES);
    for (ci, c) in (&mut chunks).enumerate() {
        let c: &[f32; LANES] = c.try_into().expect("exact chunk");
        let ci = ci as u32;
        for j in 0..LANES {
            bad[j] |= ((c[j].to_bits() & 0x7F80_0000) == 0x7F80_0000) as u32;
            let gt = c[j] > m[j];
            m[j] = if gt { c[j] } else { m[j] };
            at[j] = if gt { ci } else { at[j] };
        }
    }
    let tail_ok = chunks.remainder().iter().all(|x| x.is_finite());
    if !tail_ok || bad.iter().any(|&b| b != 0) {
        return Err(first_non_finite(logits).unwrap_or(0));
    }
    // Lanes hold the first occurrence of their maximum; across lanes, the lowest index wins.
    let mut best = f32::NEG_INFINITY;
    let mut best_i = 0usize;
    for j in 0..LANES {
        let i = at[j] as usize * LANES + j;
        if m[j] > best || (m[j] == best && i < best_i) {
            best = m[j];
            best_i = i;
        }
    }
    let base = logits.len() - chunks.remainder().len();
    for (j, &x) in chunks.remainder().iter().enumerate() {
        if x > best {
            best = x;
            best_i = base + j;
        }
    }
    Ok(best_i as u32)
}

/// Greedy argmax straight over f16 logits (no f32 conversion), with the non-finite check:
/// `Err(i)` names the first NaN/Inf. f16 bit patterns map to order-preserving u16 keys
/// (negative: inverted; positive: sign bit set; -0 equals +0), so the pass is integer max.
pub fn argmax_f16_checked(logits: &[half::f16]) -> Result<u32, usize> {
    #[inline(always)]
    fn key(b: u16) -> u16 {
        let b = if b == 0x8000 { 0 } else { b };
        if b & 0x8000 != 0 {
            !b
        } else {
            b | 0x8000
        }
    }
    const L: usize = 32;
    let mut m = [0u16; L];
    let mut bad = [0u16; L];
    let mut chunks = logits.chunks_exact(L);
    for c in &mut chunks {
        let c: &[half::f16; L] = c.try_into().expect("exact chunk");
        for j in 0..L {
            let b = c[j].to_bits();
            bad[j] |= ((b & 0x7C00) == 0x7C00) as u16;
            m[j] = m[j].max(key(b));
        }
    }
    if bad.iter().any(|&b| b != 0) || chunks.remainder().iter().any(|x| !x.is_finite()) {
        return Err(logits.iter().position(|x| !x.is_finite()).unwrap_or(0));
    }
    let mut best = m.iter().copied().max().unwrap_or(0);
    for x in chunks.remainder() {
        best = best.max(key(x.to_bits()));
    }
    Ok(logits
        .iter()
        .position(|x| key(x.to_bits()) == best)
        .unwrap_or(0) as u32)
}

/// Index of the first non-finite value, if any.
pub fn first_non_finite(v: &[f32]) -> Option<usize> {
    if all_finite(v) {
        return None;
    }
    v.iter().position(|x| !x.is_finite())
}

/// Maximum of a block and whether it holds a NaN/Inf, in one vectorisable pass.
fn block_max_bad(v: &[f32]) -> (f32, bool) {
    let mut m = [f32::NEG_INFINITY; LANES];
    let mut bad = [0u32; LANES];
    let mut chunks = v.chunks_exact(LANES);
    for c in &mut chunks {
        let c: &[f32; LANES] = c.try_into().expect("exact chunk");
        for j in 0..LANES {
            bad[j] |= ((c[j].to_bits() & 0x7F80_0000) == 0x7F80_0000) as u32;
            m[j] = if c[j] > m[j] { c[j] } else { m[j] };
        }
    }
    let mut best = m
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    let mut any_bad = bad.iter().any(|&b| b != 0);
    for &x in chunks.remainder() {
        any_bad |= !x.is_finite();
        if x > best {
            best = x;
        }
    }
    (best, any_bad)
}

#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// <= 0: greedy.
    pub temp: f32,
    /// 0: off.
    pub top_k: usize,
    /// >= 1: off.
    pub top_p: f32,
    /// 0: off. Keeps tokens with p >= min_p * p_max.
    pub min_p: f32,
    /// 1: off. Positive logits are divided by it, negative ones multiplied (HF / QHexRT).
    pub repeat_penalty: f32,
    /// How many of the most recent tokens (prompt included) the penalty looks at: 0 turns
    /// the penalty off and [`WHOLE_CONTEXT`] looks at every token, as llama.cpp's 0 / -1.
    pub repeat_last_n: usize,
    /// None: seeded from the OS.
    pub seed: Option<u64>,
}

/// `repeat_last_n` that covers the whole sequence (llama.cpp's `--repeat-last-n -1`).
pub const WHOLE_CONTEXT: usize = usize::MAX;

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temp: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: None,
        }
    }
}

impl SamplerConfig {
    /// Check the ranges. `name` gives how the caller spells a setting (`temp`, `top-p`,
    /// `min-p`, `repeat-penalty`), e.g. `--temp` on the command line; the error names it.
    pub fn check(&self, name: impl Fn(&str) -> String) -> Result<(), String> {
        let bad = |what: &str, range: &str, v: f32| {
            Err(format!("{}{range} {v} is out of range", name(what)))
        };
        if !self.temp.is_finite() || self.temp < 0.0 {
            return bad("temp", "", self.temp);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top-p", " (0, 1]", self.top_p);
        }
        if !(0.0..1.0).contains(&self.min_p) {
            return bad("min-p", " [0, 1)", self.min_p);
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad("repeat-penalty", "", self.repeat_penalty);
        }
        Ok(())
    }

    /// Whether the repetition penalty changes anything (a penalty of 1 or a window of 0
    /// is off).
    pub fn penalizes(&self) -> bool {
        self.repeat_penalty != 1.0 && self.repeat_last_n > 0
    }

    /// Greedy: temperature 0, or a top-k of one.
    pub fn is_greedy(&self) -> bool {
        self.temp <= 0.0 || self.top_k == 1
    }

    /// The effective chain, in the order it is applied (printed at -v and in --json), e.g.
    /// `["penalties(1.1, last 64)", "temp(0.8)", "top-k(40)", "top-p(0.95)", "dist(seed 7)"]`.
    pub fn chain(&self) -> Vec<String> {
        let mut parts = Vec::new();
        if self.penalizes() {
            let window = match self.repeat_last_n {
                WHOLE_CONTEXT => "all".to_string(),
                n => format!("last {n}"),
            };
            parts.push(format!("penalties({}, {window})", self.repeat_penalty));
        }
        if self.is_greedy() {
            parts.push("greedy".into());
            return parts;
        }
        parts.push(format!("temp({})", self.temp));
        if self.top_k > 0 {
            parts.push(format!("top-k({})", self.top_k));
        }
        if self.top_p < 1.0 {
            parts.push(format!("top-p({})", self.top_p));
        }
        if self.min_p > 0.0 {
            parts.push(format!("min-p({})", self.min_p));
        }
        parts.push(match self.seed {
            Some(s) => format!("dist(seed {s})"),
            None => "dist(random seed)".into(),
        });
        parts
    }
}

/// The filter chain and its selector. [`Sampler::apply`] runs the chain (penalty,
/// temperature, top-k, top-p, min-p) and keeps what it leaves as candidates with normalised
/// probabilities ([`Sampler::candidates`], for callers such as rejection sampling that need
/// the distribution, not only a token); [`Sampler::select`] then picks one: the single
/// candidate of a greedy chain, else a seeded draw. [`Sampler::sample`] is the two in turn.
pub struct Sampler {
    cfg: SamplerConfig,
    rng: rand::rngs::StdRng,
    /// Candidates of the last apply: (id, weight), weights relative to the best (exp(0) = 1),
    /// sorted by weight descending; only the first `keep` survive the chain.
    cand: Vec<(u32, f32)>,
    keep: usize,
    /// Sum of the kept weights (the draw scales by it, so the probabilities need no pass).
    total: f64,
    /// The token when the chain leaves no choice (greedy, or all logits NaN): no draw.
    forced: Option<u32>,
    /// The kept candidates with probabilities summing to 1, built on request.
    probs: Vec<(u32, f32)>,
    seen: Vec<u32>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        let rng = match cfg.seed {
            Some(s) => rand::rngs::StdRng::seed_from_u64(s),
            None => rand::rngs::StdRng::from_os_rng(),
        };
        Sampler {
            cfg,
            rng,
            cand: Vec::new(),
            keep: 0,
            total: 0.0,
            forced: None,
            probs: Vec::new(),
            seen: Vec::new(),
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Pick the next token: [`Sampler::apply`] then [`Sampler::select`].
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.apply(logits, history);
        self.select()
    }

    /// Run the filter chain over `logits` (modified by the penalty; `history` is the
    /// sequence so far, used only by it), leaving the candidates for [`Sampler::select`]
    /// and [`Sampler::candidates`].
    pub fn apply(&mut self, logits: &mut [f32], history: &[u32]) {
        self.probs.clear();
        if self.cfg.penalizes() {
            self.penalize(logits, history);
        }
        if self.cfg.is_greedy() {
            self.force(argmax(logits));
            return;
        }
        let inv_t = 1.0 / self.cfg.temp;
        let k = if self.cfg.top_k > 0 {
            self.cfg.top_k.min(logits.len())
        } else {
            0
        };
        let mut want = if k > 0 { k } else { 256.min(logits.len()) };
        loop {
            top_candidates(logits, want, &mut self.cand);
            if self.cand.is_empty() {
                // Every logit is NaN: nothing to draw from.
                self.force(argmax(logits));
                return;
            }
            // Probabilities within the candidate set (top-k renormalises, as HF does).
            let max = self.cand[0].1;
            let mut z = 0f64;
            for c in self.cand.iter_mut() {
                c.1 = ((c.1 - max) * inv_t).exp();
                z += c.1 as f64;
            }
            let z_all = if k > 0 || want >= logits.len() {
                z
            } else {
                // Without top-k the nucleus is measured against the whole vocabulary.
                logits
                    .iter()
                    .map(|&l| (((l - max) * inv_t) as f64).exp())
                    .sum()
            };
            let top_p = self.cfg.top_p as f64;
            let min_p_cut =
                self.cfg.min_p > 0.0 && self.cand.last().is_some_and(|c| c.1 >= self.cfg.min_p);
            if k == 0 && want < logits.len() && ((top_p < 1.0 && z / z_all < top_p) || min_p_cut) {
                // The candidates do not cover the nucleus (or the min-p band) yet: widen.
                want = (want * 4).min(logits.len());
                continue;
            }
            let mut keep = self.cand.len();
            if top_p < 1.0 {
                let mut acc = 0f64;
                for (i, c) in self.cand.iter().enumerate() {
                    acc += c.1 as f64 / z_all;
                    if acc >= top_p {
                        keep = i + 1;
                        break;
                    }
                }
            }
            if self.cfg.min_p > 0.0 {
                // cand[0] holds the maximum probability (its weight is exp(0) = 1).
                let floor = self.cfg.min_p;
                keep = keep.min(self.cand.iter().take_while(|c| c.1 >= floor).count().max(1));
            }
            self.keep = keep;
            self.total = self.cand[..keep].iter().map(|c| c.1 as f64).sum();
            self.forced = None;
            return;
        }
    }

    /// The chain leaves one token, with probability 1.
    fn force(&mut self, id: u32) {
        self.cand.clear();
        self.cand.push((id, 1.0));
        self.keep = 1;
        self.total = 1.0;
        self.forced = Some(id);
    }

    /// The candidates the last [`Sampler::apply`] kept, as (id, probability) with the
    /// probabilities summing to 1, most likely first.
    pub fn candidates(&mut self) -> &[(u32, f32)] {
        if self.probs.is_empty() {
            let total = self.total;
            self.probs.extend(
                self.cand[..self.keep]
                    .iter()
                    .map(|&(id, w)| (id, (w as f64 / total) as f32)),
            );
        }
        &self.probs
    }

    /// The selector: the forced token of a chain that left no choice, else a draw from the
    /// kept candidates with the seeded generator.
    pub fn select(&mut self) -> u32 {
        if let Some(id) = self.forced {
            return id;
        }
        let kept = &self.cand[..self.keep];
        let mut r = self.rng.random::<f64>() * self.total;
        for c in kept {
            r -= c.1 as f64;
            if r <= 0.0 {
                return c.0;
            }
        }
        kept[self.keep - 1].0
    }

    /// Speculative acceptance of `draft`, a token proposed with certainty (a lookup
    /// draft: q(draft) = 1): kept with the probability p(draft) the chain gives it, else a
    /// draw from the kept candidates without it (the residual max(0, p - q), renormalised).
    /// Either way the token returned is distributed exactly as [`Sampler::select`]'s
    /// (Leviathan et al. 2023); the flag says whether the draft was kept.
    pub fn accept_or_resample(&mut self, draft: u32) -> (u32, bool) {
        if let Some(id) = self.forced {
            return (id, id == draft);
        }
        let kept = &self.cand[..self.keep];
        let w = kept
            .iter()
            .find(|c| c.0 == draft)
            .map_or(0.0, |c| c.1 as f64);
        if self.rng.random::<f64>() * self.total < w {
            return (draft, true);
        }
        let rest = self.total - w;
        let mut r = self.rng.random::<f64>() * rest;
        let mut last = None;
        for c in kept.iter().filter(|c| c.0 != draft) {
            r -= c.1 as f64;
            last = Some(c.0);
            if r <= 0.0 {
                return (c.0, false);
            }
        }
        // Rounding left a sliver: the last candidate (the draft only when it was the
        // only candidate, which a probability-1 draft never reaches).
        (last.unwrap_or(draft), false)
    }

    fn penalize(&mut self, logits: &mut [f32], history: &[u32]) {
        let n = self.cfg.repeat_last_n;
        if n == 0 {
            return;
        }
        let window = if n >= history.len() {
            history
        } else {
            &history[history.len() - n..]
        };
        self.seen.clear();
        self.seen.extend_from_slice(window);
        self.seen.sort_unstable();
        self.seen.dedup();
        let p = self.cfg.repeat_penalty;
        for &t in &self.seen {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if *l > 0.0 { *l / p } else { *l * p };
            }
        }
    }
}

/// The `k` largest (id, logit) pairs, sorted descending (ties: lower id first), without
/// sorting the whole vocabulary: values at or below the running k-th best are skipped.
pub fn top_candidates(logits: &[f32], k: usize, out: &mut Vec<(u32, f32)>) {
    out.clear();
    let k = k.max(1).min(logits.len());
    let cap = (4 * k).max(64);
    let mut threshold = f32::NEG_INFINITY;
    let by_value = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    const BLOCK: usize = 64;
    for (bi, block) in logits.chunks(BLOCK).enumerate() {
        // Once k candidates are held, a block whose maximum is not above the threshold
        // cannot contribute (one vectorised max instead of a compare per logit).
        if out.len() >= k && block_max_bad(block).0 <= threshold {
            continue;
        }
        for (j, &v) in block.iter().enumerate() {
            if v > threshold || out.len() < k {
                if v.is_nan() {
                    continue;
                }
                out.push(((bi * BLOCK + j) as u32, v));
                if out.len() >= cap {
                    out.select_nth_unstable_by(k - 1, by_value);
                    out.truncate(k);
                    threshold = out.iter().map(|c| c.1).fold(f32::INFINITY, f32::min);
                }
            }
        }
    }
    out.sort_unstable_by(by_value);
    out.truncate(k);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pearson's chi-square of `counts` against probabilities `p` (categories with an
    /// expected count under 5 pooled), and the critical value at alpha = 0.001 for its
    /// degrees of freedom (Wilson-Hilferty).
    pub(crate) fn chi_square(counts: &[u64], p: &[f64]) -> (f64, f64) {
        let n: u64 = counts.iter().sum();
        let (mut stat, mut df, mut pooled_o, mut pooled_e) = (0.0, 0usize, 0.0, 0.0);
        for (&o, &pi) in counts.iter().zip(p) {
            let e = pi * n as f64;
            if e < 5.0 {
                pooled_o += o as f64;
                pooled_e += e;
            } else {
                stat += (o as f64 - e).powi(2) / e;
                df += 1;
            }
        }
        if pooled_e > 0.0 {
            stat += (pooled_o - pooled_e).powi(2) / pooled_e.max(1e-9);
            df += 1;
        }
        let k = (df - 1).max(1) as f64;
        let z = 3.09;
        let crit = k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3);
        (stat, crit)
    }

    /// Speculative acceptance leaves the sampled distribution as it was: 20,000 seeded
    /// draws with a draft that the chain likes, one it keeps but dislikes, and one top-k
    /// drops, each within the chi-square bound of the chain's own probabilities; the usual
    /// mistake (resampling from p, the draft included, after a rejection) fails it.
    #[test]
    fn accepting_drafts_keeps_the_distribution() {
        let logits = [2.0f32, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, 3.0];
        let cfg = SamplerConfig {
            temp: 0.9,
            top_k: 6,
            seed: Some(5),
            ..SamplerConfig::default()
        };
        let n = 20_000;
        for draft in [7u32, 3, 6] {
            let mut s = Sampler::new(cfg.clone());
            let mut l = logits;
            s.apply(&mut l, &[]);
            let mut p = vec![0.0f64; logits.len()];
            for &(id, pr) in s.candidates() {
                p[id as usize] = pr as f64;
            }
            let (mut good, mut broken) = (vec![0u64; 8], vec![0u64; 8]);
            let mut kept = 0;
            for _ in 0..n {
                let (t, k) = s.accept_or_resample(draft);
                good[t as usize] += 1;
                kept += usize::from(k);
                let (t, k) = s.accept_or_resample(draft);
                let t = if k { t } else { s.select() };
                broken[t as usize] += 1;
            }
            let (stat, crit) = chi_square(&good, &p);
            assert!(
                stat < crit,
                "draft {draft}: chi2 {stat:.1} >= {crit:.1}, {good:?} vs {p:?}"
            );
            let (bad, crit) = chi_square(&broken, &p);
            if p[draft as usize] > 0.0 {
                assert!(
                    bad > crit,
                    "draft {draft}: the broken rule passed ({bad:.1} < {crit:.1})"
                );
                let rate = kept as f64 / n as f64;
                assert!(
                    (rate - p[draft as usize]).abs() < 0.02,
                    "kept {rate} vs p {}",
                    p[draft as usize]
                );
            } else {
                assert_eq!(kept, 0, "a draft outside the candidates is never kept");
            }
        }
    }

    #[test]
    fn argmax_prefers_lower_id_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5]), 1);
        assert_eq!(argmax(&[-2.0]), 0);
    }

    #[test]
    fn finds_non_finite() {
        assert_eq!(first_non_finite(&[0.0, 1.0]), None);
        assert_eq!(first_non_finite(&[0.0, f32::INFINITY]), Some(1));
    }

    #[test]
    fn fused_argmax_matches_and_reports_first_non_finite() {
        let mut v: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32).collect();
        assert_eq!(argmax_checked(&v), Ok(argmax(&v)));
        v[13] = f32::NAN;
        v[500] = f32::INFINITY;
        assert_eq!(argmax_checked(&v), Err(13));
        let tail = [0.0, 2.0, f32::NEG_INFINITY];
        assert_eq!(argmax_checked(&tail), Err(2));
        assert_eq!(argmax_checked(&[1.0, 5.0, 5.0]), Ok(1));
    }

    #[test]
    fn f16_argmax_matches_the_f32_one() {
        let v: Vec<f32> = (0..5000)
            .map(|i| (((i * 7919) % 2003) as f32 - 1000.0) * 0.01)
            .collect();
        let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
        let back: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
        assert_eq!(argmax_f16_checked(&h), Ok(argmax(&back)));
        let neg: Vec<half::f16> = [-3.0f32, -1.0, -2.0, -1.0]
            .iter()
            .map(|&x| half::f16::from_f32(x))
            .collect();
        assert_eq!(argmax_f16_checked(&neg), Ok(1));
        let z: Vec<half::f16> = [-0.0f32, 0.0]
            .iter()
            .map(|&x| half::f16::from_f32(x))
            .collect();
        assert_eq!(argmax_f16_checked(&z), Ok(0), "-0 ties +0: lower id");
        let mut bad = h.clone();
        bad[4000] = half::f16::INFINITY;
        bad[4100] = half::f16::NAN;
        assert_eq!(argmax_f16_checked(&bad), Err(4000));
    }

    #[test]
    fn top_k_one_or_zero_temperature_is_greedy() {
        let v = [0.1, 0.9, 0.3, 0.9];
        for cfg in [
            SamplerConfig {
                temp: 0.0,
                top_k: 40,
                top_p: 0.95,
                ..Default::default()
            },
            SamplerConfig {
                temp: 0.8,
                top_k: 1,
                seed: Some(1),
                ..Default::default()
            },
        ] {
            assert!(cfg.is_greedy());
            assert_eq!(cfg.chain(), vec!["greedy".to_string()]);
            assert_eq!(Sampler::new(cfg).sample(&mut v.to_vec(), &[]), 1);
        }
    }

    #[test]
    fn samples_only_inside_top_k_and_top_p() {
        // 10,000 logits; the top 5 are ids 9000..9005 with a steep fall-off.
        let mut v = vec![0.0f32; 10_000];
        for (j, id) in (9000..9005).enumerate() {
            v[id] = 20.0 - 2.0 * j as f32;
        }
        v[42] = f32::NAN;
        let cfg = SamplerConfig {
            temp: 1.0,
            top_k: 3,
            seed: Some(7),
            ..Default::default()
        };
        let mut s = Sampler::new(cfg.clone());
        let mut seen = [0usize; 3];
        for _ in 0..3000 {
            let t = s.sample(&mut v.clone(), &[]) as usize;
            assert!((9000..9003).contains(&t), "sampled {t} outside top-3");
            seen[t - 9000] += 1;
        }
        // Probabilities 1 : e^-2 : e^-4 (normalised 0.867, 0.117, 0.016).
        assert!(seen[0] > 2400 && seen[1] > 200 && seen[2] > 10, "{seen:?}");
        // top-p 0.8 keeps only the first (its mass alone is 0.867).
        let mut s = Sampler::new(SamplerConfig { top_p: 0.8, ..cfg });
        for _ in 0..200 {
            assert_eq!(s.sample(&mut v.clone(), &[]), 9000);
        }
    }

    #[test]
    fn candidate_cut_keeps_the_true_top_k() {
        // Increasing logits force many threshold raises; the sampled id must be in the top 40.
        let v: Vec<f32> = (0..151_936).map(|i| (i % 5000) as f32 * 1e-3).collect();
        let mut s = Sampler::new(SamplerConfig {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            seed: Some(3),
            ..Default::default()
        });
        let mut sorted: Vec<f32> = v.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = sorted[39];
        for _ in 0..50 {
            let t = s.sample(&mut v.clone(), &[]) as usize;
            assert!(
                v[t] >= kth,
                "id {t} with logit {} below the 40th {kth}",
                v[t]
            );
        }
    }

    #[test]
    fn all_nan_logits_do_not_panic() {
        let mut s = Sampler::new(SamplerConfig {
            temp: 1.0,
            seed: Some(1),
            ..Default::default()
        });
        assert_eq!(s.sample(&mut vec![f32::NAN; 300], &[]), 0);
    }
}

#[cfg(test)]
mod chain_tests {
    use super::*;

    fn pseudo_logits(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u64 * 2654435761) % 10007) as f32 / 997.0 - 5.0)
            .collect()
    }

    #[test]
    fn top_candidates_equal_a_full_sort() {
        let l = pseudo_logits(151_936);
        let mut all: Vec<(u32, f32)> = l.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut got = Vec::new();
        for k in [1, 40, 1000] {
            top_candidates(&l, k, &mut got);
            assert_eq!(got, all[..k].to_vec(), "k = {k}");
        }
    }

    /// Draw `n` samples and compare frequencies with the expected distribution: every
    /// bucket within 4.5 standard deviations of a binomial count.
    fn check_frequencies(cfg: SamplerConfig, logits: &[f32], expected: &[f64], n: usize) {
        let mut s = Sampler::new(cfg);
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..n {
            let mut l = logits.to_vec();
            counts[s.sample(&mut l, &[]) as usize] += 1;
        }
        for (i, (&c, &p)) in counts.iter().zip(expected).enumerate() {
            let mean = p * n as f64;
            let sd = (n as f64 * p * (1.0 - p)).sqrt().max(1.0);
            assert!(
                (c as f64 - mean).abs() <= 4.5 * sd,
                "token {i}: {c} draws, expected {mean:.0} ± {sd:.0}"
            );
            if p == 0.0 {
                assert_eq!(c, 0, "token {i} must be filtered out");
            }
        }
    }

    fn softmax(l: &[f32], t: f32) -> Vec<f64> {
        let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = l.iter().map(|&x| (((x - m) / t) as f64).exp()).collect();
        let z: f64 = e.iter().sum();
        e.iter().map(|x| x / z).collect()
    }

    const L: [f32; 6] = [2.0, 1.0, 0.5, 0.0, -1.0, -3.0];

    #[test]
    fn temperature_sampling_follows_the_softmax() {
        let cfg = SamplerConfig {
            temp: 0.8,
            seed: Some(7),
            ..Default::default()
        };
        check_frequencies(cfg, &L, &softmax(&L, 0.8), 60_000);
    }

    #[test]
    fn top_k_renormalises_over_the_k_best() {
        let cfg = SamplerConfig {
            temp: 1.0,
            top_k: 3,
            seed: Some(8),
            ..Default::default()
        };
        let mut p = softmax(&L[..3], 1.0);
        p.extend([0.0; 3]);
        check_frequencies(cfg, &L, &p, 60_000);
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        // softmax(L) ≈ [.56, .21, .13, .08, .03, .004]: top-p 0.8 keeps the first three.
        let full = softmax(&L, 1.0);
        assert!(full[0] + full[1] < 0.8 && full[0] + full[1] + full[2] >= 0.8);
        let cfg = SamplerConfig {
            temp: 1.0,
            top_p: 0.8,
            seed: Some(9),
            ..Default::default()
        };
        let z: f64 = full[..3].iter().sum();
        let mut p: Vec<f64> = full[..3].iter().map(|x| x / z).collect();
        p.extend([0.0; 3]);
        check_frequencies(cfg, &L, &p, 60_000);
    }

    #[test]
    fn top_p_without_top_k_widens_over_a_large_vocabulary() {
        // 5000 equal logits: the nucleus of 0.5 needs 2500 tokens, more than the first window.
        let l = vec![0.0f32; 5000];
        let mut s = Sampler::new(SamplerConfig {
            temp: 1.0,
            top_p: 0.5,
            seed: Some(3),
            ..Default::default()
        });
        // Uniform over the 2500 (or 2501 at the boundary): 2000 draws all below 2400 has
        // probability 0.96^2000 ≈ 1e-35, and any draw above 2501 is a wrong nucleus.
        let mut max_id = 0;
        for _ in 0..2_000 {
            max_id = max_id.max(s.sample(&mut l.clone(), &[]));
        }
        assert!((2400..=2501).contains(&max_id), "{max_id}");
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // p_max ≈ .56; min-p 0.2 keeps p >= .11: tokens 0, 1, 2.
        let full = softmax(&L, 1.0);
        let cfg = SamplerConfig {
            temp: 1.0,
            min_p: 0.2,
            seed: Some(10),
            ..Default::default()
        };
        let z: f64 = full[..3].iter().sum();
        let mut p: Vec<f64> = full[..3].iter().map(|x| x / z).collect();
        p.extend([0.0; 3]);
        check_frequencies(cfg, &L, &p, 60_000);
    }

    /// apply + candidates + select: the probabilities are the chain's renormalised
    /// distribution (here top-k 2 over a known softmax) and select draws from them.
    #[test]
    fn apply_keeps_normalised_candidates_for_the_caller() {
        let cfg = SamplerConfig {
            temp: 1.0,
            top_k: 2,
            seed: Some(7),
            ..Default::default()
        };
        let mut s = Sampler::new(cfg.clone());
        let mut logits = vec![0.0f32, 2.0, 1.0, -1.0];
        s.apply(&mut logits, &[]);
        let c = s.candidates().to_vec();
        let e = (1.0f64).exp();
        let want = [(1u32, e / (e + 1.0)), (2u32, 1.0 / (e + 1.0))];
        assert_eq!(c.len(), 2);
        for ((id, p), (wid, wp)) in c.iter().zip(want) {
            assert_eq!(*id, wid);
            assert!((*p as f64 - wp).abs() < 1e-6, "{c:?}");
        }
        let picked = s.select();
        assert!(picked == 1 || picked == 2);
        // The same seed through sample() picks the same token.
        let mut t = Sampler::new(cfg);
        assert_eq!(t.sample(&mut [0.0f32, 2.0, 1.0, -1.0], &[]), picked);
        // Greedy leaves one candidate of probability 1 and draws nothing.
        let mut g = Sampler::new(SamplerConfig::default());
        g.apply(&mut [0.0f32, 2.0, 3.0], &[]);
        assert_eq!(g.candidates(), &[(2, 1.0)]);
        assert_eq!(g.select(), 2);
    }

    #[test]
    fn same_seed_same_sequence() {
        let cfg = SamplerConfig {
            temp: 0.9,
            top_k: 40,
            top_p: 0.95,
            seed: Some(42),
            ..Default::default()
        };
        let l = pseudo_logits(50_000);
        let draw = |cfg: &SamplerConfig| {
            let mut s = Sampler::new(cfg.clone());
            (0..50)
                .map(|_| s.sample(&mut l.clone(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(&cfg), draw(&cfg));
        let other = SamplerConfig {
            seed: Some(43),
            ..cfg.clone()
        };
        assert_ne!(draw(&cfg), draw(&other));
    }

    #[test]
    fn repeat_penalty_divides_positive_and_multiplies_negative_logits() {
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            repeat_last_n: 2,
            ..Default::default()
        });
        let mut l = vec![4.0, -1.0, 3.9, 0.5];
        // History [0, 1, 0]: the window (last 2) holds 1 and 0.
        let t = s.sample(&mut l, &[0, 1, 0]);
        assert_eq!(l, vec![2.0, -2.0, 3.9, 0.5]);
        assert_eq!(t, 2);
    }

    #[test]
    fn repeat_window_zero_is_off_and_whole_context_covers_everything() {
        let run = |n: usize| {
            let mut s = Sampler::new(SamplerConfig {
                repeat_penalty: 2.0,
                repeat_last_n: n,
                ..Default::default()
            });
            let mut l = vec![4.0, -1.0, 3.9, 0.5];
            s.sample(&mut l, &[0, 1, 3]);
            l
        };
        assert_eq!(run(0), vec![4.0, -1.0, 3.9, 0.5]);
        assert_eq!(run(WHOLE_CONTEXT), vec![2.0, -2.0, 3.9, 0.25]);
        let off = SamplerConfig {
            repeat_penalty: 1.3,
            repeat_last_n: 0,
            ..Default::default()
        };
        assert!(!off.chain().iter().any(|c| c.starts_with("penalties")));
        let all = SamplerConfig {
            repeat_last_n: WHOLE_CONTEXT,
            ..off
        };
        assert_eq!(all.chain()[0], "penalties(1.3, all)");
    }
}
