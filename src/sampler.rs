//! Token selection from logits: greedy by default (drop-in parity), or a filter chain in
//! HF transformers' order — repetition penalty, temperature, top-k, top-p, min-p — then a
//! seeded draw. Over a 152k vocabulary nothing sorts the whole vocabulary: top-k keeps a
//! running threshold and partially selects; top-p without top-k widens a partial selection
//! until the nucleus is covered.

use rand::{Rng, SeedableRng};

/// Greedy argmax; ties go to the lower id (as QHexRT and HF do). NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut bv = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > bv {
            bv = v;
            best = i;
        }
    }
    best as u32
}

/// Index of the first non-finite value, if any.
pub fn first_non_finite(v: &[f32]) -> Option<usize> {
    v.iter().position(|x| !x.is_finite())
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
    /// How many of the most recent tokens (prompt included) the penalty looks at; 0 = all.
    pub repeat_last_n: usize,
    /// None: seeded from the OS.
    pub seed: Option<u64>,
}

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
    pub fn is_greedy(&self) -> bool {
        self.temp <= 0.0
    }

    /// One-line description of the effective chain, for the banner.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.repeat_penalty != 1.0 {
            parts.push(format!(
                "repeat-penalty {} (last {})",
                self.repeat_penalty, self.repeat_last_n
            ));
        }
        if self.is_greedy() {
            parts.push("greedy".into());
        } else {
            parts.push(format!("temp {}", self.temp));
            if self.top_k > 0 {
                parts.push(format!("top-k {}", self.top_k));
            }
            if self.top_p < 1.0 {
                parts.push(format!("top-p {}", self.top_p));
            }
            if self.min_p > 0.0 {
                parts.push(format!("min-p {}", self.min_p));
            }
            parts.push(match self.seed {
                Some(s) => format!("seed {s}"),
                None => "random seed".into(),
            });
        }
        parts.join(" -> ")
    }
}

pub struct Sampler {
    cfg: SamplerConfig,
    rng: rand::rngs::StdRng,
    cand: Vec<(u32, f32)>,
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
            seen: Vec::new(),
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Pick the next token. `logits` may be modified (penalties); `history` is the sequence
    /// so far (prompt + generated), used only by the repetition penalty.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        if self.cfg.repeat_penalty != 1.0 {
            self.penalize(logits, history);
        }
        if self.cfg.is_greedy() {
            return argmax(logits);
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
            let kept = &self.cand[..keep];
            let total: f64 = kept.iter().map(|c| c.1 as f64).sum();
            let mut r = self.rng.random::<f64>() * total;
            for c in kept {
                r -= c.1 as f64;
                if r <= 0.0 {
                    return c.0;
                }
            }
            return kept[keep - 1].0;
        }
    }

    fn penalize(&mut self, logits: &mut [f32], history: &[u32]) {
        let n = self.cfg.repeat_last_n;
        let window = if n == 0 || n >= history.len() {
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
    for (i, &v) in logits.iter().enumerate() {
        if v > threshold || out.len() < k {
            if v.is_nan() {
                continue;
            }
            out.push((i as u32, v));
            if out.len() >= cap {
                out.select_nth_unstable_by(k - 1, by_value);
                out.truncate(k);
                threshold = out.iter().map(|c| c.1).fold(f32::INFINITY, f32::min);
            }
        }
    }
    out.sort_unstable_by(by_value);
    out.truncate(k);
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut max_id = 0;
        for _ in 0..20_000 {
            max_id = max_id.max(s.sample(&mut l.clone(), &[]));
        }
        assert!((2000..=2501).contains(&max_id), "{max_id}");
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
}
