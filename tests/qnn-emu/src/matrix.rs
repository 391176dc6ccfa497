//! The emulator's matmul. Each output is one dot product over the whole weight row with 16
//! running sums (the order below), so the numbers do not depend on row blocking, threads or
//! the CPU. Four input rows share one pass over a weight row, and on x86_64 an AVX2 build of
//! the same loops is chosen at run time: it multiplies and adds exactly as the portable one
//! (no fused multiply-add), only wider.
//!
//! Weights are f32 (expanded at load). Keeping GGUF blocks packed and widening each row on use
//! was measured slower (a SmolLM2 decode step ~1.9x slower).

use crate::format::WeightHeader;

/// Lanes of running sums in a dot product: part of the emulator's arithmetic (its order).
const L: usize = 16;

enum Rows {
    F32(Vec<f32>),
}

/// An [out_dim, in_dim] weight matrix.
pub struct Matrix {
    rows: Rows,
    in_dim: usize,
    out_dim: usize,
}

impl Matrix {
    /// The weight `w` of `data`, `in_dim` wide (its last dimension).
    pub fn load(w: &WeightHeader, data: &[u8], in_dim: usize) -> Matrix {
        Matrix::from_f32(crate::format::dequantize(w, data), in_dim)
    }

    pub fn from_f32(w: Vec<f32>, in_dim: usize) -> Matrix {
        let out_dim = w.len().checked_div(in_dim).unwrap_or(0);
        Matrix {
            rows: Rows::F32(w),
            in_dim,
            out_dim,
        }
    }

    /// Row `o`.
    #[inline(always)]
    fn row(&self, o: usize) -> &[f32] {
        let n = self.in_dim;
        match &self.rows {
            Rows::F32(w) => &w[o * n..(o + 1) * n],
        }
    }
}

/// Sum of `acc` then the tail products: the last part of every dot product.
#[inline(always)]
fn finish(acc: &[f32; L], a: &[f32], b: &[f32]) -> f32 {
    let mut s: f32 = acc.iter().sum();
    for (x, y) in a.iter().zip(b) {
        s += x * y;
    }
    s
}

/// Dot product with independent running sums so the compiler can vectorise it.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; L];
    let (ac, at) = a.split_at(a.len() / L * L);
    let (bc, bt) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(L).zip(bc.chunks_exact(L)) {
        for k in 0..L {
            acc[k] += x[k] * y[k];
        }
    }
    finish(&acc, at, &bt[..at.len()])
}

/// Four dot products of `w` with four rows at once (one read of `w` for all four); each is
/// computed exactly as `dot` computes it.
#[inline(always)]
fn dot4(w: &[f32], x: [&[f32]; 4]) -> [f32; 4] {
    let n = w.len() / L * L;
    let (wc, wt) = w.split_at(n);
    let [x0, x1, x2, x3] = x.map(|r| r[..w.len()].split_at(n));
    let (mut a0, mut a1, mut a2, mut a3) = ([0f32; L], [0f32; L], [0f32; L], [0f32; L]);
    let chunks = wc
        .chunks_exact(L)
        .zip(x0.0.chunks_exact(L))
        .zip(x1.0.chunks_exact(L))
        .zip(x2.0.chunks_exact(L))
        .zip(x3.0.chunks_exact(L));
    for ((((c, c0), c1), c2), c3) in chunks {
        for k in 0..L {
            a0[k] += c[k] * c0[k];
            a1[k] += c[k] * c1[k];
            a2[k] += c[k] * c2[k];
            a3[k] += c[k] * c3[k];
        }
    }
    [
        finish(&a0, wt, x0.1),
        finish(&a1, wt, x1.1),
        finish(&a2, wt, x2.1),
        finish(&a3, wt, x3.1),
    ]
}

/// Output columns [o0, o1) of x · Wᵀ (+ bias) for `rows` rows, as a [rows, o1 - o0] block.
#[inline(always)]
fn block(
    x: &[f32],
    rows: usize,
    w: &Matrix,
    bias: Option<&[f32]>,
    o0: usize,
    o1: usize,
) -> Vec<f32> {
    let n = w.in_dim;
    let width = o1.saturating_sub(o0);
    let mut out = vec![0f32; rows * width];
    let xr = |r: usize| &x[r * n..(r + 1) * n];
    for o in o0..o1 {
        let b = bias.map_or(0.0, |b| b[o]);
        let c = o - o0;
        let wr = w.row(o);
        let mut r = 0;
        while r + 4 <= rows {
            let d = dot4(wr, [xr(r), xr(r + 1), xr(r + 2), xr(r + 3)]);
            for (i, v) in d.into_iter().enumerate() {
                out[(r + i) * width + c] = v + b;
            }
            r += 4;
        }
        for r in r..rows {
            out[r * width + c] = dot(wr, xr(r)) + b;
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn block_avx2(
    x: &[f32],
    rows: usize,
    w: &Matrix,
    bias: Option<&[f32]>,
    o0: usize,
    o1: usize,
) -> Vec<f32> {
    block(x, rows, w, bias, o0, o1)
}

/// `block` in the widest build this CPU runs.
fn block_best(
    x: &[f32],
    rows: usize,
    w: &Matrix,
    bias: Option<&[f32]>,
    o0: usize,
    o1: usize,
) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU was just found to have AVX2, the one feature block_avx2 is built for.
        return unsafe { block_avx2(x, rows, w, bias, o0, o1) };
    }
    block(x, rows, w, bias, o0, o1)
}

/// out[r][o] = W[o] · x[r] (+ bias) for `rows` input rows.
/// Splits the output dimension across threads; each weight row is read once for all rows.
pub fn matmul(x: &[f32], rows: usize, w: &Matrix, bias: Option<&[f32]>) -> Vec<f32> {
    let out_dim = w.out_dim;
    let threads = crate::threads().min(out_dim.max(1));
    let chunk = out_dim.div_ceil(threads);
    let range = |t: usize| (t * chunk, ((t + 1) * chunk).min(out_dim));
    // One thread computes inline: a spawn per matmul costs ~20 ms and ~0.5 MiB that is never
    // returned under qemu-user.
    let blocks: Vec<Vec<f32>> = if threads == 1 {
        vec![block_best(x, rows, w, bias, 0, out_dim)]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (o0, o1) = range(t);
                    s.spawn(move || block_best(x, rows, w, bias, o0, o1))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    if blocks.len() == 1 {
        return blocks.into_iter().next().unwrap();
    }
    let mut out = vec![0f32; rows * out_dim];
    for (t, blk) in blocks.iter().enumerate() {
        let (o0, o1) = range(t);
        let width = o1.saturating_sub(o0);
        for r in 0..rows {
            out[r * out_dim + o0..r * out_dim + o0 + width]
                .copy_from_slice(&blk[r * width..(r + 1) * width]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The emulator's order of a dot product, written out one product at a time: lane
    /// `i % 16` collects the products of the whole 16-wide chunks, the lanes are summed in
    /// order, then the tail is added.
    fn reference_dot(a: &[f32], b: &[f32]) -> f32 {
        let whole = a.len() / L * L;
        let mut lanes = [0f32; L];
        for i in 0..whole {
            lanes[i % L] += a[i] * b[i];
        }
        let mut s: f32 = lanes.iter().sum();
        for i in whole..a.len() {
            s += a[i] * b[i];
        }
        s
    }

    /// Whatever path computes it (four rows at once or one, AVX2 or not, one thread or
    /// several), every output is that dot product, bit for bit.
    #[test]
    fn every_output_is_the_reference_dot_product_bit_for_bit() {
        let mut seed = 0x2545f491u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed % 20001) as f32 / 10000.0 - 1.0
        };
        for (in_dim, out_dim) in [(96usize, 7usize), (100, 5), (7, 3)] {
            let w: Vec<f32> = (0..in_dim * out_dim).map(|_| next()).collect();
            let bias: Vec<f32> = (0..out_dim).map(|_| next()).collect();
            let m = Matrix::from_f32(w.clone(), in_dim);
            for rows in [1usize, 3, 4, 9] {
                let x: Vec<f32> = (0..rows * in_dim).map(|_| next()).collect();
                let got = matmul(&x, rows, &m, Some(&bias));
                for r in 0..rows {
                    for o in 0..out_dim {
                        let want = reference_dot(
                            &w[o * in_dim..(o + 1) * in_dim],
                            &x[r * in_dim..(r + 1) * in_dim],
                        ) + bias[o];
                        assert_eq!(
                            got[r * out_dim + o].to_bits(),
                            want.to_bits(),
                            "{in_dim} {rows} {r} {o}"
                        );
                    }
                }
            }
        }
    }
}
