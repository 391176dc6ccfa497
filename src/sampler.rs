//! Token selection from logits.
//!
//! Greedy is one pass (argmax, fused with the non-finite check in [`argmax_checked`]).
//! Top-k / top-p / temperature sampling never sorts the whole vocabulary: a bounded pass
//! keeps candidates above a running threshold, `select_nth_unstable_by` cuts them to k, and
//! only those k are sorted.

use rand::Rng;

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

/// Sampling parameters. `top_k == 0` means no top-k cut (then the candidate set is the
/// whole vocabulary, which is slow); `temperature <= 0` means greedy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
}

impl SamplingParams {
    pub const GREEDY: SamplingParams = SamplingParams {
        temperature: 0.0,
        top_k: 1,
        top_p: 1.0,
    };

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// Reusable buffers for [`sample_top_k_top_p`], so a step allocates nothing.
#[derive(Debug, Default)]
pub struct SamplerScratch {
    cand: Vec<(f32, u32)>,
    probs: Vec<f32>,
}

/// Top-k, then top-p (nucleus), then temperature sampling. Candidates are ordered by logit
/// (descending, ties to the lower id); non-finite logits are never candidates.
pub fn sample_top_k_top_p<R: Rng + ?Sized>(
    logits: &[f32],
    p: &SamplingParams,
    scratch: &mut SamplerScratch,
    rng: &mut R,
) -> u32 {
    sample_impl(logits, p, scratch, rng, false).unwrap_or(0)
}

/// [`sample_top_k_top_p`] with the non-finite check fused into its block pass: `Err(i)`
/// names the first NaN/Inf.
pub fn sample_top_k_top_p_checked<R: Rng + ?Sized>(
    logits: &[f32],
    p: &SamplingParams,
    scratch: &mut SamplerScratch,
    rng: &mut R,
) -> Result<u32, usize> {
    sample_impl(logits, p, scratch, rng, true)
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

fn sample_impl<R: Rng + ?Sized>(
    logits: &[f32],
    p: &SamplingParams,
    scratch: &mut SamplerScratch,
    rng: &mut R,
    check: bool,
) -> Result<u32, usize> {
    if p.is_greedy() || logits.is_empty() {
        return if check {
            argmax_checked(logits)
        } else {
            Ok(argmax(logits))
        };
    }
    let k = if p.top_k == 0 {
        logits.len()
    } else {
        p.top_k.min(logits.len())
    };
    let cand = &mut scratch.cand;
    cand.clear();
    // Keep a buffer of at most 2k candidates above a threshold; when it fills, cut it to the
    // best k and raise the threshold to the k-th value. Amortised O(V).
    let cap = (2 * k).max(64);
    let mut thr = f32::NEG_INFINITY;
    let by_logit_desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    // Blocks whose maximum is not above the threshold are skipped after one SIMD max.
    const BLOCK: usize = 64;
    for (bi, block) in logits.chunks(BLOCK).enumerate() {
        let (mx, bad) = block_max_bad(block);
        if check && bad {
            let j = block.iter().position(|x| !x.is_finite()).unwrap_or(0);
            return Err(bi * BLOCK + j);
        }
        if mx <= thr {
            continue;
        }
        for (j, &v) in block.iter().enumerate() {
            if v > thr && v.is_finite() {
                cand.push((v, (bi * BLOCK + j) as u32));
                if cand.len() >= cap {
                    cand.select_nth_unstable_by(k - 1, by_logit_desc);
                    cand.truncate(k);
                    thr = cand.iter().map(|c| c.0).fold(f32::INFINITY, f32::min);
                }
            }
        }
    }
    if cand.is_empty() {
        return Ok(argmax(logits));
    }
    if cand.len() > k {
        cand.select_nth_unstable_by(k - 1, by_logit_desc);
        cand.truncate(k);
    }
    cand.sort_unstable_by(by_logit_desc);
    // Softmax over the k candidates at temperature T.
    let inv_t = 1.0 / p.temperature;
    let mx = cand[0].0;
    let probs = &mut scratch.probs;
    probs.clear();
    let mut sum = 0.0f32;
    for &(v, _) in cand.iter() {
        let e = ((v - mx) * inv_t).exp();
        probs.push(e);
        sum += e;
    }
    // Nucleus: the smallest prefix whose mass reaches top_p (at least one token).
    let mut keep = probs.len();
    if p.top_p < 1.0 {
        let want = p.top_p.max(0.0) * sum;
        let mut acc = 0.0f32;
        for (i, &e) in probs.iter().enumerate() {
            acc += e;
            if acc >= want {
                keep = i + 1;
                break;
            }
        }
    }
    let mass: f32 = probs[..keep].iter().sum();
    let mut r = rng.random::<f32>() * mass;
    for (i, &e) in probs[..keep].iter().enumerate() {
        if r < e {
            return Ok(cand[i].1);
        }
        r -= e;
    }
    Ok(cand[keep - 1].1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

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
        let mut s = SamplerScratch::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let p = SamplingParams {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
        };
        assert_eq!(sample_top_k_top_p(&v, &p, &mut s, &mut rng), 1);
    }

    #[test]
    fn samples_only_inside_top_k_and_top_p() {
        // 10,000 logits; the top 5 are ids 9000..9005 with a steep fall-off.
        let mut v = vec![0.0f32; 10_000];
        for (j, id) in (9000..9005).enumerate() {
            v[id] = 20.0 - 2.0 * j as f32;
        }
        v[42] = f32::NAN;
        let mut s = SamplerScratch::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 3,
            top_p: 1.0,
        };
        let mut seen = [0usize; 3];
        for _ in 0..3000 {
            let t = sample_top_k_top_p(&v, &p, &mut s, &mut rng) as usize;
            assert!((9000..9003).contains(&t), "sampled {t} outside top-3");
            seen[t - 9000] += 1;
        }
        // Probabilities 1 : e^-2 : e^-4 (normalised 0.867, 0.117, 0.016).
        assert!(seen[0] > 2400 && seen[1] > 200 && seen[2] > 10, "{seen:?}");
        // top-p 0.8 keeps only the first (its mass alone is 0.867).
        let p = SamplingParams { top_p: 0.8, ..p };
        for _ in 0..200 {
            assert_eq!(sample_top_k_top_p(&v, &p, &mut s, &mut rng), 9000);
        }
    }

    #[test]
    fn checked_sampling_reports_the_first_non_finite() {
        let mut v: Vec<f32> = (0..3000).map(|i| (i % 97) as f32).collect();
        let mut s = SamplerScratch::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let p = SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
        };
        assert!(sample_top_k_top_p_checked(&v, &p, &mut s, &mut rng).is_ok());
        v[2100] = f32::NAN;
        v[2500] = f32::INFINITY;
        assert_eq!(
            sample_top_k_top_p_checked(&v, &p, &mut s, &mut rng),
            Err(2100)
        );
        v[2999] = f32::NEG_INFINITY;
        v[2100] = 0.0;
        assert_eq!(
            sample_top_k_top_p_checked(&v, &p, &mut s, &mut rng),
            Err(2500)
        );
    }

    #[test]
    fn candidate_cut_keeps_the_true_top_k() {
        // Increasing logits force many threshold raises; the sampled id must be in the top 40.
        let v: Vec<f32> = (0..151_936).map(|i| (i % 5000) as f32 * 1e-3).collect();
        let mut s = SamplerScratch::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let p = SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
        };
        let mut sorted: Vec<f32> = v.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = sorted[39];
        for _ in 0..50 {
            let t = sample_top_k_top_p(&v, &p, &mut s, &mut rng) as usize;
            assert!(
                v[t] >= kth,
                "id {t} with logit {} below the 40th {kth}",
                v[t]
            );
        }
    }
}
