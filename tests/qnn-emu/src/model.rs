//! The reference decoder the emulator runs: f32 math, HF Llama/Qwen2 semantics.

use crate::format::{dequantize, KvLayout, ModelHeader, Parsed};
use crate::matrix::{dot, matmul, Matrix};
use std::collections::HashMap;

/// What a layer mixes its tokens with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Attention over every cached position (`cmask`, `cos`/`sin`).
    Full,
    /// Attention through the sliding-window mask (`cmask_local`, `cos_local`/`sin_local`).
    Sliding,
    /// LFM2's gated short convolution; its state is `past_conv_<i>` / `present_conv_<i>`.
    Conv,
}

impl LayerKind {
    pub fn parse(s: &str) -> Result<LayerKind, String> {
        match s {
            "full_attention" => Ok(LayerKind::Full),
            "sliding_attention" => Ok(LayerKind::Sliding),
            "conv" => Ok(LayerKind::Conv),
            other => Err(format!(
                "layer type {other:?} is not full_attention, sliding_attention or conv"
            )),
        }
    }

    pub fn has_kv(self) -> bool {
        self != LayerKind::Conv
    }
}

pub struct Attn {
    wq: Matrix,
    wk: Matrix,
    wv: Matrix,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    wo: Matrix,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3, LFM2).
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
}

pub struct ShortConv {
    /// [3H, H]: B, C and x projections, in that order.
    in_proj: Matrix,
    /// [H, W] depthwise taps, oldest first.
    taps: Vec<f32>,
    out_proj: Matrix,
}

pub struct Layer {
    pub kind: LayerKind,
    attn_norm: Vec<f32>,
    attn: Option<Attn>,
    conv: Option<ShortConv>,
    /// Gemma 3's norms after the attention and the FFN (before the residual add).
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    post_ffw_norm: Option<Vec<f32>>,
    w_gate: Matrix,
    w_up: Matrix,
    w_down: Matrix,
}

/// Weights held by one context (only what its graphs need).
pub struct Weights {
    pub cfg: ModelHeader,
    pub layers: Vec<Layer>,
    pub output_norm: Option<Vec<f32>>,
    pub lm: Option<Matrix>,
    /// `token_embd.weight`, loaded only for Genie graphs (they embed ids in-graph).
    pub embd: Option<Vec<f32>>,
}

/// Each layer's kind from the header (all full attention when it lists none).
pub fn layer_kinds(cfg: &ModelHeader) -> Result<Vec<LayerKind>, String> {
    if cfg.layer_types.is_empty() {
        return Ok(vec![LayerKind::Full; cfg.n_layers]);
    }
    if cfg.layer_types.len() != cfg.n_layers {
        return Err(format!(
            "layer_types lists {} layers, n_layers is {}",
            cfg.layer_types.len(),
            cfg.n_layers
        ));
    }
    cfg.layer_types
        .iter()
        .map(|t| LayerKind::parse(t))
        .collect()
}

impl Weights {
    pub fn load(p: &Parsed<'_>) -> Result<Weights, String> {
        let cfg = p.header.model.clone();
        let mut map: HashMap<&str, &crate::format::WeightHeader> = HashMap::new();
        for w in &p.header.weights {
            map.insert(w.name.as_str(), w);
        }
        let get = |name: &str, shape: &[usize]| -> Result<Option<Vec<f32>>, String> {
            match map.get(name) {
                None => Ok(None),
                Some(w) if w.shape != shape => Err(format!(
                    "weight {name}: shape {:?}, expected {shape:?}",
                    w.shape
                )),
                Some(w) => Ok(Some(dequantize(w, p.data))),
            }
        };
        let need = |name: &str, shape: &[usize]| -> Result<Vec<f32>, String> {
            get(name, shape)?.ok_or_else(|| format!("missing weight {name}"))
        };
        // The matmul weights stay in their blocks (crate::matrix).
        let get_mat = |name: &str, shape: &[usize]| -> Result<Option<Matrix>, String> {
            match map.get(name) {
                None => Ok(None),
                Some(w) if w.shape != shape => Err(format!(
                    "weight {name}: shape {:?}, expected {shape:?}",
                    w.shape
                )),
                Some(w) => Ok(Some(Matrix::load(w, p.data, shape[1]))),
            }
        };
        let mat = |name: &str, shape: &[usize]| -> Result<Matrix, String> {
            get_mat(name, shape)?.ok_or_else(|| format!("missing weight {name}"))
        };
        let (h, q, kv, f, hd) = (
            cfg.hidden,
            cfg.n_heads * cfg.head_dim,
            cfg.n_kv_heads * cfg.head_dim,
            cfg.ffn,
            cfg.head_dim,
        );
        let kinds = layer_kinds(&cfg)?;
        if kinds.contains(&LayerKind::Sliding) && cfg.sliding_window.is_none_or(|w| w == 0) {
            return Err("sliding_attention layers need a positive sliding_window".into());
        }
        let width = cfg.conv_width.unwrap_or(3);
        let needs_layers = p
            .header
            .graphs
            .iter()
            .any(|g| g.kind != crate::format::GraphKind::Lmhead);
        let mut layers = Vec::new();
        if needs_layers {
            for (i, &kind) in kinds.iter().enumerate() {
                let n = |s: &str| format!("blk.{i}.{s}");
                let attn = if kind.has_kv() {
                    Some(Attn {
                        wq: mat(&n("attn_q.weight"), &[q, h])?,
                        wk: mat(&n("attn_k.weight"), &[kv, h])?,
                        wv: mat(&n("attn_v.weight"), &[kv, h])?,
                        bq: get(&n("attn_q.bias"), &[q])?,
                        bk: get(&n("attn_k.bias"), &[kv])?,
                        bv: get(&n("attn_v.bias"), &[kv])?,
                        wo: mat(&n("attn_output.weight"), &[h, q])?,
                        q_norm: get(&n("attn_q_norm.weight"), &[hd])?,
                        k_norm: get(&n("attn_k_norm.weight"), &[hd])?,
                    })
                } else {
                    None
                };
                let conv = if kind == LayerKind::Conv {
                    Some(ShortConv {
                        in_proj: mat(&n("shortconv.in_proj.weight"), &[3 * h, h])?,
                        taps: need(&n("shortconv.conv.weight"), &[h, width])?,
                        out_proj: mat(&n("shortconv.out_proj.weight"), &[h, h])?,
                    })
                } else {
                    None
                };
                layers.push(Layer {
                    kind,
                    attn_norm: need(&n("attn_norm.weight"), &[h])?,
                    attn,
                    conv,
                    post_attn_norm: get(&n("post_attention_norm.weight"), &[h])?,
                    ffn_norm: need(&n("ffn_norm.weight"), &[h])?,
                    post_ffw_norm: get(&n("post_ffw_norm.weight"), &[h])?,
                    w_gate: mat(&n("ffn_gate.weight"), &[f, h])?,
                    w_up: mat(&n("ffn_up.weight"), &[f, h])?,
                    w_down: mat(&n("ffn_down.weight"), &[h, f])?,
                });
            }
        }
        let output_norm = get("output_norm.weight", &[h])?;
        let lm = match get_mat("output.weight", &[cfg.vocab, h])? {
            Some(w) => Some(w),
            None => get_mat("token_embd.weight", &[cfg.vocab, h])?,
        };
        use crate::format::GraphKind;
        let genie = p.header.graphs.iter().any(|g| g.kind == GraphKind::Genie);
        let needs_lm = genie || p.header.graphs.iter().any(|g| g.kind == GraphKind::Lmhead);
        let needs_norm = genie
            || p.header
                .graphs
                .iter()
                .any(|g| g.final_norm || (g.kind == GraphKind::Lmhead && g.norm));
        let embd = if genie {
            Some(need("token_embd.weight", &[cfg.vocab, h])?)
        } else {
            None
        };
        if needs_norm && output_norm.is_none() {
            return Err("a graph applies the final norm but output_norm.weight is missing".into());
        }
        if needs_lm && lm.is_none() {
            return Err("lm-head graph needs output.weight or token_embd.weight".into());
        }
        Ok(Weights {
            cfg,
            layers,
            output_norm,
            lm,
            embd,
        })
    }
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let h = w.len();
    let mut out = vec![0f32; x.len()];
    for (xr, orow) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / h as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for i in 0..h {
            orow[i] = w[i] * (xr[i] * inv);
        }
    }
    out
}

/// Rotate-half RoPE in place on `n_heads` heads of one row.
fn rope(v: &mut [f32], n_heads: usize, hd: usize, cos: &[f32], sin: &[f32]) {
    let half = hd / 2;
    for h in 0..n_heads {
        let x = &mut v[h * hd..(h + 1) * hd];
        for i in 0..half {
            let (a, b) = (x[i], x[i + half]);
            x[i] = a * cos[i] - b * sin[i];
            x[i + half] = b * cos[i + half] + a * sin[i + half];
        }
    }
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// GELU, tanh approximation (Gemma's `gelu_pytorch_tanh`).
fn gelu_tanh(v: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * v * (1.0 + (C * (v + 0.044715 * v * v * v)).tanh())
}

/// RMSNorm of each `w.len()`-wide head of `v` in place.
fn head_norm(v: &mut [f32], w: &[f32], eps: f32) {
    let n = rms_norm(v, w, eps);
    v.copy_from_slice(&n);
}

/// Keys/values visible to one attention call: the past cache (masked) then own rows.
pub struct KvView<'a> {
    pub past_k: Option<&'a [f32]>,
    pub past_v: Option<&'a [f32]>,
    pub ctx: usize,
    pub layout: KvLayout,
}

/// Run the decoder layers over `rows` rows.
///
/// `mask` has `rows` rows of `ctx + rows` columns when past K/V is given (decode: the own
/// column is implied 0 and `mask` has `ctx` columns, see `self_visible`), else `rows` columns.
pub struct LayerIo<'a> {
    pub x: Vec<f32>,
    pub rows: usize,
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    pub mask: &'a [f32],
    /// Sliding layers' RoPE rows (`cos_local`, `sin_local`) and mask (`cmask_local`);
    /// `None`: they use the global ones.
    pub local_rope: Option<(&'a [f32], &'a [f32])>,
    pub local_mask: Option<&'a [f32]>,
    /// Decode form: mask covers only the past (ctx columns); own key always visible.
    pub self_visible: bool,
    /// Per layer: a conv layer's state before these rows ([H, W], oldest column first);
    /// `None` (or a shorter list): zeros.
    pub conv_past: &'a [Option<Vec<f32>>],
}

pub struct LayerOut {
    pub y: Vec<f32>,
    /// Per layer: K (after RoPE) and V for the processed rows, [rows, K] position-major
    /// (empty for conv layers).
    pub new_k: Vec<Vec<f32>>,
    pub new_v: Vec<Vec<f32>>,
    /// Per layer: a conv layer's B*x rows [rows, H] and its state after them [H, W]
    /// (empty for attention layers).
    pub conv_bx: Vec<Vec<f32>>,
    pub conv_present: Vec<Vec<f32>>,
}

impl Weights {
    pub fn run_layers(&self, io: LayerIo<'_>, past: &[KvView<'_>]) -> LayerOut {
        let c = &self.cfg;
        let (h, hd, nh, nkv) = (c.hidden, c.head_dim, c.n_heads, c.n_kv_heads);
        let kdim = nkv * hd;
        let rows = io.rows;
        let group = nh / nkv;
        let scale = c.attn_scale.unwrap_or(1.0 / (hd as f32).sqrt());
        let gelu = c.act.as_deref() == Some("gelu_tanh");
        let mut x = io.x;
        let n_layers = self.layers.len();
        let mut new_k = Vec::with_capacity(n_layers);
        let mut new_v = Vec::with_capacity(n_layers);
        let mut conv_bx = Vec::with_capacity(n_layers);
        let mut conv_present = Vec::with_capacity(n_layers);
        for (li, l) in self.layers.iter().enumerate() {
            let n = rms_norm(&x, &l.attn_norm, c.rms_eps);
            let mixed = if let Some(cv) = &l.conv {
                let (o, bx, present) = short_conv(
                    cv,
                    &n,
                    rows,
                    h,
                    io.conv_past.get(li).and_then(|p| p.as_deref()),
                );
                conv_bx.push(bx);
                conv_present.push(present);
                new_k.push(Vec::new());
                new_v.push(Vec::new());
                o
            } else {
                let a = l
                    .attn
                    .as_ref()
                    .expect("attention layers load their weights");
                let (cos, sin, mask) = match (l.kind, io.local_rope) {
                    (LayerKind::Sliding, Some((c2, s2))) => {
                        (c2, s2, io.local_mask.unwrap_or(io.mask))
                    }
                    (LayerKind::Sliding, None) => {
                        (io.cos, io.sin, io.local_mask.unwrap_or(io.mask))
                    }
                    _ => (io.cos, io.sin, io.mask),
                };
                let mut q = matmul(&n, rows, &a.wq, a.bq.as_deref());
                let mut k = matmul(&n, rows, &a.wk, a.bk.as_deref());
                let v = matmul(&n, rows, &a.wv, a.bv.as_deref());
                if let Some(w) = &a.q_norm {
                    head_norm(&mut q, w, c.rms_eps);
                }
                if let Some(w) = &a.k_norm {
                    head_norm(&mut k, w, c.rms_eps);
                }
                for r in 0..rows {
                    let (cr, sr) = (&cos[r * hd..(r + 1) * hd], &sin[r * hd..(r + 1) * hd]);
                    rope(&mut q[r * nh * hd..(r + 1) * nh * hd], nh, hd, cr, sr);
                    rope(&mut k[r * kdim..(r + 1) * kdim], nkv, hd, cr, sr);
                }
                let kv = past.get(li).filter(|p| p.past_k.is_some());
                let ctx = kv.map_or(0, |p| p.ctx);
                let mcols = if io.self_visible { ctx } else { ctx + rows };
                let mut attn = vec![0f32; rows * nh * hd];
                let mut scores = vec![0f32; ctx + rows];
                for r in 0..rows {
                    let mrow = &mask[r * mcols..(r + 1) * mcols];
                    for head in 0..nh {
                        let g = head / group;
                        let qh = &q[(r * nh + head) * hd..(r * nh + head + 1) * hd];
                        let mut maxv = f32::NEG_INFINITY;
                        // Past rows.
                        for j in 0..ctx {
                            let m = mrow[j];
                            scores[j] = if m == f32::NEG_INFINITY {
                                f32::NEG_INFINITY
                            } else {
                                let p = kv.expect("ctx > 0 only with a past");
                                let kp = kv_row(p.past_k.unwrap(), p.layout, ctx, nkv, hd, g, j);
                                dot(qh, kp) * scale + m
                            };
                            maxv = maxv.max(scores[j]);
                        }
                        // Own rows.
                        let own = if io.self_visible { r + 1 } else { rows };
                        for j in 0..own {
                            let m = if io.self_visible { 0.0 } else { mrow[ctx + j] };
                            let kj = &k[j * kdim + g * hd..j * kdim + (g + 1) * hd];
                            let s = if m == f32::NEG_INFINITY {
                                f32::NEG_INFINITY
                            } else {
                                dot(qh, kj) * scale + m
                            };
                            scores[ctx + j] = s;
                            maxv = maxv.max(s);
                        }
                        let total = ctx + own;
                        let mut sum = 0f32;
                        for s in &mut scores[..total] {
                            *s = if maxv == f32::NEG_INFINITY {
                                0.0
                            } else {
                                (*s - maxv).exp()
                            };
                            sum += *s;
                        }
                        let out = &mut attn[(r * nh + head) * hd..(r * nh + head + 1) * hd];
                        if sum == 0.0 {
                            continue;
                        }
                        for (j, &sc) in scores[..total].iter().enumerate() {
                            let p = sc / sum;
                            if p == 0.0 {
                                continue;
                            }
                            let vr = if j < ctx {
                                let pv = kv.expect("ctx > 0 only with a past");
                                kv_row(pv.past_v.unwrap(), pv.layout, ctx, nkv, hd, g, j)
                            } else {
                                let jj = j - ctx;
                                &v[jj * kdim + g * hd..jj * kdim + (g + 1) * hd]
                            };
                            for d in 0..hd {
                                out[d] += p * vr[d];
                            }
                        }
                    }
                }
                new_k.push(k);
                new_v.push(v);
                conv_bx.push(Vec::new());
                conv_present.push(Vec::new());
                matmul(&attn, rows, &a.wo, None)
            };
            let mixed = match &l.post_attn_norm {
                Some(w) => rms_norm(&mixed, w, c.rms_eps),
                None => mixed,
            };
            for (xi, oi) in x.iter_mut().zip(&mixed) {
                *xi += oi;
            }
            let n2 = rms_norm(&x, &l.ffn_norm, c.rms_eps);
            let gate = matmul(&n2, rows, &l.w_gate, None);
            let up = matmul(&n2, rows, &l.w_up, None);
            let act: Vec<f32> = gate
                .iter()
                .zip(&up)
                .map(|(g, u)| {
                    if gelu {
                        gelu_tanh(*g) * u
                    } else {
                        silu(*g) * u
                    }
                })
                .collect();
            let down = matmul(&act, rows, &l.w_down, None);
            let down = match &l.post_ffw_norm {
                Some(w) => rms_norm(&down, w, c.rms_eps),
                None => down,
            };
            for (xi, di) in x.iter_mut().zip(&down) {
                *xi += di;
            }
        }
        LayerOut {
            y: x,
            new_k,
            new_v,
            conv_bx,
            conv_present,
        }
    }

    /// Final RMSNorm then the vocabulary projection.
    /// The final RMSNorm of `rows` hidden rows (`output_norm.weight`).
    pub fn final_norm(&self, hidden: &[f32]) -> Vec<f32> {
        rms_norm(hidden, self.output_norm.as_ref().unwrap(), self.cfg.rms_eps)
    }

    /// The vocabulary projection of one (already normalised) hidden row.
    pub fn project(&self, normed: &[f32]) -> Vec<f32> {
        matmul(normed, 1, self.lm.as_ref().unwrap(), None)
    }
}

/// LFM2's gated short convolution over `rows` normalised rows: [B, C, x] = in_proj(n),
/// y = C * conv(B * x), out_proj(y). The causal depthwise conv reads the state `past`
/// ([H, W], oldest column first; zeros when absent) before the first row. Returns the
/// projected rows, the B*x rows [rows, H] and the state after the last row [H, W].
fn short_conv(
    cv: &ShortConv,
    n: &[f32],
    rows: usize,
    h: usize,
    past: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let w = cv.taps.len() / h;
    let bcx = matmul(n, rows, &cv.in_proj, None);
    let mut bx = vec![0f32; rows * h];
    for r in 0..rows {
        let row = &bcx[r * 3 * h..(r + 1) * 3 * h];
        for i in 0..h {
            bx[r * h + i] = row[i] * row[2 * h + i];
        }
    }
    // Column t of the history: t < w are the past state, then one per row.
    let hist = |i: usize, t: usize| -> f32 {
        if t < w {
            past.map_or(0.0, |p| p[i * w + t])
        } else {
            bx[(t - w) * h + i]
        }
    };
    let mut y = vec![0f32; rows * h];
    for r in 0..rows {
        for i in 0..h {
            let mut acc = 0f32;
            for k in 0..w {
                acc += cv.taps[i * w + k] * hist(i, r + 1 + k);
            }
            y[r * h + i] = bcx[r * 3 * h + h + i] * acc;
        }
    }
    let mut present = vec![0f32; h * w];
    for i in 0..h {
        for k in 0..w {
            present[i * w + k] = hist(i, rows + k);
        }
    }
    (matmul(&y, rows, &cv.out_proj, None), bx, present)
}

/// Row `j` of KV head `g` in a cache of either layout.
fn kv_row(
    buf: &[f32],
    layout: KvLayout,
    ctx: usize,
    nkv: usize,
    hd: usize,
    g: usize,
    j: usize,
) -> &[f32] {
    match layout {
        KvLayout::PosMajor => &buf[j * nkv * hd + g * hd..j * nkv * hd + (g + 1) * hd],
        KvLayout::HeadMajor => &buf[(g * ctx + j) * hd..(g * ctx + j + 1) * hd],
    }
}

/// Convert position-major [rows, nkv*hd] to head-major [nkv, rows, hd].
pub fn to_head_major(v: &[f32], rows: usize, nkv: usize, hd: usize) -> Vec<f32> {
    let mut out = vec![0f32; v.len()];
    for r in 0..rows {
        for g in 0..nkv {
            out[(g * rows + r) * hd..(g * rows + r + 1) * hd]
                .copy_from_slice(&v[(r * nkv + g) * hd..(r * nkv + g + 1) * hd]);
        }
    }
    out
}
