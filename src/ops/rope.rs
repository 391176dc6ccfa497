//! RoPE cos/sin tables in rotate-half layout, computed once for every position.
//!
//! The arithmetic mirrors HF transformers' `rotary_emb` in f32 (inverse frequencies from
//! `theta ** (2i/d)`, optional llama3 frequency scaling, angle = inv_freq * pos, then
//! cos/sin), so the tables match the reference bit for bit or within an ulp.

use crate::bundle::manifest::RopeScaling;

pub struct RopeTable {
    head_dim: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// Inverse frequencies (head_dim / 2 of them), llama3-scaled when `scaling` is given.
pub fn inv_freq(theta: f64, head_dim: usize, scaling: Option<&RopeScaling>) -> Vec<f32> {
    let base = theta as f32;
    let mut f: Vec<f32> = (0..head_dim / 2)
        .map(|i| 1.0f32 / base.powf((2 * i) as f32 / head_dim as f32))
        .collect();
    if let Some(s) = scaling.filter(|s| s.rope_type == "linear") {
        // Linear position interpolation: every frequency divided by the factor.
        let factor = s.factor as f32;
        f.iter_mut().for_each(|v| *v /= factor);
        return f;
    }
    if let Some(s) = scaling {
        let factor = s.factor as f32;
        let low = s.low_freq_factor as f32;
        let high = s.high_freq_factor as f32;
        let old = s.original_max_position_embeddings as f32;
        let low_wavelen = old / low;
        let high_wavelen = old / high;
        for v in &mut f {
            let wavelen = 2.0 * std::f32::consts::PI / *v;
            let scaled = if wavelen > low_wavelen {
                *v / factor
            } else {
                *v
            };
            // (wavelengths are finite, so this is HF's ~(w < high) & ~(w > low))
            let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
            *v = if medium {
                let smooth = (old / wavelen - low) / (high - low);
                (1.0 - smooth) * scaled / factor + smooth * scaled
            } else {
                scaled
            };
        }
    }
    f
}

impl RopeTable {
    pub fn new(
        theta: f64,
        head_dim: usize,
        positions: usize,
        scaling: Option<&RopeScaling>,
    ) -> Self {
        let inv = inv_freq(theta, head_dim, scaling);
        let half = head_dim / 2;
        let mut cos = vec![0f32; positions * head_dim];
        let mut sin = vec![0f32; positions * head_dim];
        for p in 0..positions {
            for (i, f) in inv.iter().enumerate() {
                let a = f * p as f32;
                let (s, c) = a.sin_cos();
                for j in [i, i + half] {
                    cos[p * head_dim + j] = c;
                    sin[p * head_dim + j] = s;
                }
            }
        }
        RopeTable { head_dim, cos, sin }
    }

    pub fn positions(&self) -> usize {
        self.cos.len() / self.head_dim
    }

    /// The cos row of position `p` (head_dim values).
    pub fn cos(&self, p: usize) -> &[f32] {
        &self.cos[p * self.head_dim..(p + 1) * self.head_dim]
    }

    pub fn sin(&self, p: usize) -> &[f32] {
        &self.sin[p * self.head_dim..(p + 1) * self.head_dim]
    }

    /// Rows p0..p0+n, contiguous.
    pub fn cos_rows(&self, p0: usize, n: usize) -> &[f32] {
        &self.cos[p0 * self.head_dim..(p0 + n) * self.head_dim]
    }

    pub fn sin_rows(&self, p0: usize, n: usize) -> &[f32] {
        &self.sin[p0 * self.head_dim..(p0 + n) * self.head_dim]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_halves_repeat() {
        let t = RopeTable::new(10000.0, 8, 4, None);
        assert!(t.cos(0).iter().all(|&c| c == 1.0));
        assert!(t.sin(0).iter().all(|&s| s == 0.0));
        assert_eq!(&t.cos(3)[..4], &t.cos(3)[4..]);
        // First frequency is 1 rad per position.
        assert!((t.cos(1)[0] - 1f32.cos()).abs() < 1e-7);
        // Last frequency is theta^(-6/8).
        let f = 10000f32.powf(-0.75);
        assert!((t.sin(2)[3] - (2.0 * f).sin()).abs() < 1e-7);
    }

    #[test]
    fn llama3_scaling_bands() {
        let s = RopeScaling {
            rope_type: "llama3".into(),
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        let plain = inv_freq(500000.0, 64, None);
        let scaled = inv_freq(500000.0, 64, Some(&s));
        // High frequencies (short wavelengths) are untouched, the lowest divided by factor.
        assert_eq!(scaled[0], plain[0]);
        assert!((scaled[31] - plain[31] / 32.0).abs() <= plain[31] * 1e-6);
        // Medium band lies between the two.
        let mid = (0..32)
            .find(|&i| scaled[i] != plain[i] && (scaled[i] - plain[i] / 32.0).abs() > 1e-12)
            .expect("a smoothed band");
        assert!(scaled[mid] < plain[mid] && scaled[mid] > plain[mid] / 32.0);
    }
}
