//! The token loop's graph side for Genie bundles: prompt chunks on the largest-AR variant
//! (the last chunk left-padded, so the last real token is always the last row), decode on
//! AR-1, and the KV cache kept as Genie keeps it ("SMART_MASK"): past rows left-aligned in
//! each variant's past inputs, the step's new rows copied to slot n_past after each step,
//! and the mask opening [0, n_past) plus the step's own (causal) columns at the end.

use super::model::{dims4, GenieModel};
use crate::error::{Error, Result};
use crate::ops::rope::RopeTable;
use crate::qnn::{Binding, TensorDesc};
use qnn_sys::dtype;
use std::sync::Arc;

pub struct GenieRunner {
    m: Arc<GenieModel>,
    /// bindings[variant][split]
    bindings: Vec<Vec<Binding>>,
    rope: RopeTable,
    pos: usize,
    /// The variant whose past inputs hold the cache for slots [0, pos).
    cache_in: usize,
    logits: Vec<f32>,
    scratch: Vec<f32>,
    pad: u32,
    /// Keep going on NaN / inf logits (`--allow-nonfinite`).
    pub allow_nonfinite: bool,
}

impl GenieRunner {
    pub fn new(m: &Arc<GenieModel>) -> Result<GenieRunner> {
        let mut bindings = Vec::new();
        for v in &m.variants {
            let mut bs = Vec::new();
            for s in &v.splits {
                bs.push(Binding::for_graph(&s.graph, &s.desc)?);
            }
            bindings.push(bs);
        }
        let max_ar = m.variants.iter().map(|v| v.ar).max().unwrap_or(1);
        let rope = RopeTable::new(
            m.cfg.rope_theta,
            m.head_dim,
            m.max_ctx() + max_ar,
            m.cfg.rope_scaling.as_ref(),
        );
        let pad = m.cfg.pad.or(m.cfg.eos.first().copied()).unwrap_or(0);
        let mut r = GenieRunner {
            m: Arc::clone(m),
            bindings,
            rope,
            pos: 0,
            cache_in: 0,
            logits: vec![0.0; m.vocab],
            scratch: Vec::new(),
            pad,
            allow_nonfinite: false,
        };
        r.reset();
        Ok(r)
    }

    pub fn reset(&mut self) {
        self.pos = 0;
        self.cache_in = 0;
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn max_ctx(&self) -> usize {
        self.m.max_ctx()
    }

    /// Keep the first `pos` cached positions, forget the rest.
    pub fn rewind(&mut self, pos: usize) {
        self.pos = self.pos.min(pos);
    }

    /// Logits of the last token fed.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    pub fn zero_copy(&self) -> bool {
        self.bindings.iter().flatten().all(|b| b.is_shared())
    }

    /// Feed `ids` at the current position, leaving the last one's logits in [`logits`].
    /// `cancelled` is polled between graph steps; returns false when it stopped the feed.
    pub fn feed(&mut self, ids: &[u32], cancelled: &dyn Fn() -> bool) -> Result<bool> {
        let big = 0;
        let small = self.m.variants.len() - 1;
        let mut i = 0;
        while i < ids.len() {
            if cancelled() {
                return Ok(false);
            }
            let left = ids.len() - i;
            // The largest AR while its past slots can take the chunk, else the smallest.
            let vb = &self.m.variants[big];
            let (v, k) = if left > 1 && self.pos + left.min(vb.ar) <= vb.past {
                (big, left.min(vb.ar))
            } else {
                let vs = &self.m.variants[small];
                (small, left.min(vs.ar))
            };
            self.step(v, &ids[i..i + k])?;
            i += k;
        }
        Ok(true)
    }

    /// One execution of variant `vi` over `chunk` (at most AR tokens) at `self.pos`.
    fn step(&mut self, vi: usize, chunk: &[u32]) -> Result<()> {
        let m = Arc::clone(&self.m);
        let v = &m.variants[vi];
        let k = chunk.len();
        let cap = v.past.min(m.cfg.ctx_size);
        if self.pos + k > cap {
            return Err(Error::PromptTooLong {
                tokens: k,
                free: cap.saturating_sub(self.pos),
                max_ctx: cap,
            });
        }
        if self.cache_in != vi {
            self.move_cache(self.cache_in, vi)?;
            self.cache_in = vi;
        }
        let (ar, cl, pos) = (v.ar, v.cl, self.pos);
        // Left padding: real tokens in rows off..AR.
        let off = ar - k;
        {
            let (s, i) = v.input_ids;
            let b = &mut self.bindings[vi][s];
            let bytes = b.input_bytes_mut(i);
            for r in 0..ar {
                let id = if r < off { self.pad } else { chunk[r - off] };
                bytes[r * 4..r * 4 + 4].copy_from_slice(&(id as i32).to_le_bytes());
            }
        }
        for &(s, i) in &v.masks {
            let b = &mut self.bindings[vi][s];
            let desc = b.desc.inputs[i].clone();
            write_mask(b.input_bytes_mut(i), &desc, ar, cl, pos, off)?;
        }
        let half = m.head_dim / 2;
        let hd = m.head_dim;
        for (list, cos) in [(&v.cos, true), (&v.sin, false)] {
            for &(s, i) in list {
                let mut rows = vec![0f32; ar * half];
                for r in 0..ar {
                    // Padding rows take position `pos` (they are never attended).
                    let p = pos + r.saturating_sub(off);
                    let full = if cos {
                        self.rope.cos(p)
                    } else {
                        self.rope.sin(p)
                    };
                    rows[r * half..(r + 1) * half].copy_from_slice(&full[..half]);
                }
                let _ = hd;
                self.bindings[vi][s].input_mut(i).write_f32(0, &rows);
            }
        }
        for s in 0..v.splits.len() {
            for &(i, ps, po) in &v.splits[s].links {
                let (src, dst) = pair(&mut self.bindings[vi], ps, s);
                let from = src.output_bytes(po);
                let to = dst.input_bytes_mut(i);
                if from.len() != to.len() {
                    return Err(Error::graph(
                        &v.splits[s].desc.name,
                        format!(
                            "input {} ({} bytes) cannot take {} of {} ({} bytes)",
                            v.splits[s].desc.inputs[i].name,
                            to.len(),
                            v.splits[ps].desc.outputs[po].name,
                            v.splits[ps].desc.name,
                            from.len()
                        ),
                    ));
                }
                to.copy_from_slice(from);
            }
            v.splits[s].graph.execute(&mut self.bindings[vi][s])?;
        }
        // New K/V rows off..AR go to slots pos..pos+k.
        for at in &v.layers {
            self.copy_rows(vi, at.key_out, at.key_in, true, off, k)?;
            self.copy_rows(vi, at.value_out, at.value_in, false, off, k)?;
        }
        let (s, o) = v.logits;
        let row = if v.logit_rows == 1 { 0 } else { ar - 1 };
        let vocab = m.vocab;
        self.bindings[vi][s]
            .output(o)
            .read_f32(row * vocab, &mut self.logits);
        if !self.allow_nonfinite && self.logits.iter().any(|x| !x.is_finite()) {
            return Err(Error::NonFinite {
                what: "logits",
                step: self.pos,
                pos: pos + k - 1,
                graph: v.splits[s].desc.name.clone(),
                hint: "",
            });
        }
        self.pos += k;
        Ok(())
    }

    /// Copy a step's K/V output rows `off..off+k` into past slots `pos..pos+k` of the same
    /// variant. Keys are [n_kv, head_dim, rows] (transposed), values [n_kv, rows, head_dim].
    /// Both tensors are in one split (load refuses other bundles, see `assign_roles`).
    fn copy_rows(
        &mut self,
        vi: usize,
        out: (usize, usize),
        inp: (usize, usize),
        key: bool,
        off: usize,
        k: usize,
    ) -> Result<()> {
        let v = &self.m.variants[vi];
        let (n_kv, hd, ar, past, pos) = (self.m.n_kv, self.m.head_dim, v.ar, v.past, self.pos);
        let runs: Vec<(usize, usize, usize)> = if key {
            // For each (head, dim): k consecutive elements.
            (0..n_kv * hd)
                .map(|hd_i| (hd_i * ar + off, hd_i * past + pos, k))
                .collect()
        } else {
            (0..n_kv)
                .map(|h| ((h * ar + off) * hd, (h * past + pos) * hd, k * hd))
                .collect()
        };
        if out.0 != inp.0 {
            return Err(Error::graph(
                &v.splits[out.0].desc.name,
                "K/V output and past input in different splits",
            ));
        }
        let b = &mut self.bindings[vi][out.0];
        copy_runs(b, out.1, inp.1, &runs, &mut self.scratch);
        Ok(())
    }

    /// Copy the cache (slots [0, pos)) from variant `a`'s past inputs to variant `b`'s.
    fn move_cache(&mut self, a: usize, b: usize) -> Result<()> {
        let m = Arc::clone(&self.m);
        let (va, vb) = (&m.variants[a], &m.variants[b]);
        let (n_kv, hd, pos) = (m.n_kv, m.head_dim, self.pos);
        if pos == 0 {
            return Ok(());
        }
        for (la, lb) in va.layers.iter().zip(&vb.layers) {
            for (ta, tb, key) in [
                (la.key_in, lb.key_in, true),
                (la.value_in, lb.value_in, false),
            ] {
                let runs: Vec<(usize, usize, usize)> = if key {
                    (0..n_kv * hd)
                        .map(|i| (i * va.past, i * vb.past, pos))
                        .collect()
                } else {
                    (0..n_kv)
                        .map(|h| (h * va.past * hd, h * vb.past * hd, pos * hd))
                        .collect()
                };
                let (src_desc, dst_desc) = (
                    &va.splits[ta.0].desc.inputs[ta.1],
                    &vb.splits[tb.0].desc.inputs[tb.1],
                );
                let same = same_encoding(src_desc, dst_desc);
                let (ba, bb) = pair(&mut self.bindings, a, b);
                let (src_b, dst_b) = (&ba[ta.0], &mut bb[tb.0]);
                for &(from, to, n) in &runs {
                    if same {
                        let es = elem_size(src_desc);
                        let src = src_b.input_bytes(ta.1);
                        dst_b.input_bytes_mut(tb.1)[to * es..(to + n) * es]
                            .copy_from_slice(&src[from * es..(from + n) * es]);
                    } else {
                        self.scratch.resize(n, 0.0);
                        src_b.input(ta.1).read_f32(from, &mut self.scratch[..n]);
                        dst_b.input_mut(tb.1).write_f32(to, &self.scratch[..n]);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Two distinct elements of a slice, the first shared and the second mutable.
fn pair<T>(v: &mut [T], a: usize, b: usize) -> (&T, &mut T) {
    assert_ne!(a, b);
    if a < b {
        let (l, r) = v.split_at_mut(b);
        (&l[a], &mut r[0])
    } else {
        let (l, r) = v.split_at_mut(a);
        (&r[0], &mut l[b])
    }
}

fn elem_size(t: &TensorDesc) -> usize {
    t.bytes() / t.elems().max(1)
}

fn same_encoding(a: &TensorDesc, b: &TensorDesc) -> bool {
    a.dtype == b.dtype && a.quant == b.quant
}

/// Runs (from, to, n) of elements from output `o` to input `i` of one binding: bytes when
/// both tensors share dtype and quantization, through f32 otherwise.
fn copy_runs(
    b: &mut Binding,
    o: usize,
    i: usize,
    runs: &[(usize, usize, usize)],
    tmp: &mut Vec<f32>,
) {
    let (od, id) = (b.desc.outputs[o].clone(), b.desc.inputs[i].clone());
    if same_encoding(&od, &id) {
        let es = elem_size(&od);
        let (src, dst) = b.output_and_input_bytes_mut(o, i);
        for &(from, to, n) in runs {
            dst[to * es..(to + n) * es].copy_from_slice(&src[from * es..(from + n) * es]);
        }
    } else {
        let (src, mut dst) = b.output_and_input_mut(o, i);
        for &(from, to, n) in runs {
            tmp.resize(n, 0.0);
            src.read_f32(from, &mut tmp[..n]);
            dst.write_f32(to, &tmp[..n]);
        }
    }
}

/// Genie's "masked" value in float masks. Not -inf: graphs built for Genie may test
/// `mask < -500` or add the mask before a floor, and on the HTP an fp16 -inf there gave
/// different logits than -1000 (seen on the x86 HTP backend).
pub const FLOAT_MASKED: f32 = -1000.0;

/// The step's mask, Genie's way: rows are the AR new tokens (real ones in rows off..AR),
/// columns the CL slots: past [0, CL-AR) then the step's own AR. A real row r attends past
/// slots [0, pos) and own columns off..=r; padding rows attend only themselves.
/// Fixed-point masks carry Genie's raw codes (max = attend, 0 = masked); float masks 0 and
/// [`FLOAT_MASKED`].
fn write_mask(
    bytes: &mut [u8],
    t: &TensorDesc,
    ar: usize,
    cl: usize,
    pos: usize,
    off: usize,
) -> Result<()> {
    let past = cl - ar;
    let open = |r: usize, c: usize| -> bool {
        if c < past {
            r >= off && c < pos
        } else {
            let j = c - past;
            if r >= off {
                j >= off && j <= r
            } else {
                j == r
            }
        }
    };
    let d = dims4(t);
    debug_assert_eq!(d[2] * d[3], ar * cl);
    match t.dtype {
        dtype::FLOAT_32 => {
            for r in 0..ar {
                for c in 0..cl {
                    let v: f32 = if open(r, c) { 0.0 } else { FLOAT_MASKED };
                    let at = (r * cl + c) * 4;
                    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        dtype::FLOAT_16 => {
            for r in 0..ar {
                for c in 0..cl {
                    let v = if open(r, c) {
                        half::f16::ZERO
                    } else {
                        half::f16::from_f32(FLOAT_MASKED)
                    };
                    let at = (r * cl + c) * 2;
                    bytes[at..at + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        dtype::UFIXED_POINT_16 | dtype::UINT_16 => {
            for r in 0..ar {
                for c in 0..cl {
                    let v: u16 = if open(r, c) { u16::MAX } else { 0 };
                    let at = (r * cl + c) * 2;
                    bytes[at..at + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        dtype::UFIXED_POINT_8 | dtype::UINT_8 => {
            for r in 0..ar {
                for c in 0..cl {
                    bytes[r * cl + c] = if open(r, c) { u8::MAX } else { 0 };
                }
            }
        }
        _ => {
            return Err(Error::Graph {
                graph: "attention_mask".into(),
                msg: format!(
                    "{}: only float32/16 and uint16/uint8 masks are supported",
                    t.describe()
                ),
            })
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn mask_rows_are_causal_with_left_padding() {
        use crate::qnn::TensorDesc;
        let t = TensorDesc {
            id: 0,
            name: "attention_mask".into(),
            tensor_type: 0,
            dtype: qnn_sys::dtype::UFIXED_POINT_8,
            dims: vec![1, 1, 3, 8],
            quant: None,
            raw_quant: Default::default(),
        };
        let mut b = vec![9u8; 24];
        // AR 3, CL 8: past 5 slots, 2 in use; one padding row then two real tokens.
        super::write_mask(&mut b, &t, 3, 8, 2, 1).unwrap();
        let rows: Vec<String> = b
            .chunks(8)
            .map(|r| {
                r.iter()
                    .map(|&x| if x == 255 { '1' } else { '0' })
                    .collect()
            })
            .collect();
        assert_eq!(rows, ["00000100", "11000010", "11000011"]);
    }
}
