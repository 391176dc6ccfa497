//! Contexts, graphs and `graphExecute`: argument validation against the binary's tensor
//! descriptors, then the decoder math.

use crate::api::{log, E_GRAPH_INVALID_HANDLE};
use crate::format::{self, GraphKind, KvLayout};
use crate::io::{from_f32, to_f32, TensorSpec};
use crate::knobs;
use crate::model::{to_head_major, KvView, LayerIo, Weights};
use crate::registry::{self, Kind};
use qnn_sys::*;
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::Arc;

pub const E_GRAPH_INVALID_ARGUMENT: u64 = 6000;
pub const E_GRAPH_INVALID_TENSOR: u64 = 6004;

pub struct EmuGraph {
    pub name: String,
    pub kind: GraphKind,
    pub seq: usize,
    pub ctx: usize,
    pub layout: KvLayout,
    final_norm: bool,
    norm: bool,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    weights: Arc<Weights>,
    null_compute: bool,
}

pub struct EmuContext {
    /// Boxed so graph handles (their addresses) stay valid whatever happens to the Vec.
    #[allow(clippy::vec_box)]
    pub graphs: Vec<Box<EmuGraph>>,
}

/// Deterministic tensor ids shared by the system-context view and the loaded context.
pub fn tensor_specs(h: &format::Header) -> Vec<(Vec<TensorSpec>, Vec<TensorSpec>)> {
    let spec = |t: &format::TensorHeader, id: u32| TensorSpec {
        id,
        name: t.name.clone(),
        dtype: format::dtype_from_name(&t.dtype).unwrap_or(dtype::UNDEFINED),
        dims: t.dims.clone(),
        scale: t.scale,
        offset: t.offset,
    };
    h.graphs
        .iter()
        .enumerate()
        .map(|(gi, g)| {
            let base = (gi as u32 + 1) * 1000;
            (
                g.inputs
                    .iter()
                    .enumerate()
                    .map(|(i, t)| spec(t, base + i as u32 + 1))
                    .collect(),
                g.outputs
                    .iter()
                    .enumerate()
                    .map(|(i, t)| spec(t, base + 500 + i as u32 + 1))
                    .collect(),
            )
        })
        .collect()
}

impl EmuContext {
    pub fn from_binary(buf: &[u8]) -> Result<EmuContext, String> {
        let parsed = format::parse(buf)?;
        let weights = Arc::new(if parsed.header.null_compute || knobs::get().null_compute {
            Weights {
                cfg: parsed.header.model.clone(),
                layers: Vec::new(),
                output_norm: None,
                lm: None,
                embd: None,
            }
        } else {
            Weights::load(&parsed)?
        });
        let null = parsed.header.null_compute || knobs::get().null_compute;
        let specs = tensor_specs(&parsed.header);
        let graphs = parsed
            .header
            .graphs
            .iter()
            .zip(specs)
            .map(|(g, (inputs, outputs))| {
                Box::new(EmuGraph {
                    name: g.name.clone(),
                    kind: g.kind,
                    seq: g.seq,
                    ctx: g.ctx,
                    layout: g.kv_layout,
                    final_norm: g.final_norm,
                    norm: g.norm,
                    inputs,
                    outputs,
                    weights: weights.clone(),
                    null_compute: null,
                })
            })
            .collect();
        Ok(EmuContext { graphs })
    }
}

/// Find a live graph by handle (graphs live inside live contexts).
pub fn find_graph(h: usize) -> Option<&'static EmuGraph> {
    find_graph_in(h).map(|(g, _)| g)
}

/// A live graph by handle, with the handle of the context that owns it.
pub fn find_graph_in(h: usize) -> Option<(&'static EmuGraph, usize)> {
    // The registry only tracks contexts; scan their graphs. Handles are few.
    let ctxs = registry_contexts();
    for c in ctxs {
        // SAFETY: `c` is a live EmuContext address from the registry.
        let ctx = unsafe { &*(c as *const EmuContext) };
        for g in &ctx.graphs {
            if &**g as *const EmuGraph as usize == h {
                // SAFETY: the graph lives as long as its context; callers use it only within
                // one API call, during which the application must not free the context.
                return Some((unsafe { &*(&**g as *const EmuGraph) }, c));
            }
        }
    }
    None
}

fn registry_contexts() -> Vec<usize> {
    registry::live_of(Kind::Context)
}

pub use crate::shm::{
    device_get_infrastructure, mem_de_register, mem_lookup, mem_register, release_context_mem,
};

struct Bound<'a> {
    spec: &'a TensorSpec,
    data: *mut u8,
}

fn describe(spec: &TensorSpec) -> String {
    format!(
        "{} [{:?} {}]",
        spec.name,
        spec.dims,
        dtype::name(spec.dtype)
    )
}

/// Check one caller tensor against the graph's descriptors; return the matched spec + data.
///
/// # Safety
/// `t` must point to a readable Qnn_Tensor_t.
unsafe fn bind<'a>(
    g: &'a EmuGraph,
    context: usize,
    specs: &'a [TensorSpec],
    t: *const QnnTensor,
    what: &str,
) -> Result<Bound<'a>, String> {
    // SAFETY: caller guarantees `t` is readable.
    let t = unsafe { &*t };
    if t.version != QNN_TENSOR_VERSION_1 && t.version != QNN_TENSOR_VERSION_2 {
        return Err(format!("{what} tensor has unknown version {}", t.version));
    }
    // SAFETY: version is 1 or 2, whose common prefix is V1.
    let c = unsafe { t.common() };
    let spec = specs.iter().find(|s| s.id == c.id).ok_or_else(|| {
        format!(
            "graph {}: {what} tensor id {} is not one of its {what}s",
            g.name, c.id
        )
    })?;
    if !c.name.is_null() {
        // SAFETY: a non-null name is a NUL-terminated string per the API.
        let name = unsafe { CStr::from_ptr(c.name) }.to_string_lossy();
        if name != spec.name {
            return Err(format!(
                "graph {}: tensor id {} is {}, not {name}",
                g.name, c.id, spec.name
            ));
        }
    }
    if c.data_type != spec.dtype {
        return Err(format!(
            "graph {}: {} given dtype {}",
            g.name,
            describe(spec),
            dtype::name(c.data_type)
        ));
    }
    if is_fixed_point(spec.dtype) {
        let q = c.quantize_params;
        // SAFETY: every variant of the union starts with plain numbers, so reading the
        // scale_offset member is valid whatever the tag; it is used only under SCALE_OFFSET.
        let raw = unsafe { q.encoding.scale_offset };
        let so = (q.quantization_encoding == quant_encoding::SCALE_OFFSET).then_some(raw);
        if so.is_none_or(|so| so.scale != spec.scale || so.offset != spec.offset) {
            let given = so.map_or("no scale/offset".to_string(), |so| {
                format!("scale {} offset {}", so.scale, so.offset)
            });
            return Err(format!(
                "graph {}: {} given {given}: the binary's quantization differs",
                g.name,
                describe(spec)
            ));
        }
    }
    if c.rank != spec.dims.len() as u32 || c.dimensions.is_null() {
        return Err(format!(
            "graph {}: {} given rank {}",
            g.name,
            describe(spec),
            c.rank
        ));
    }
    // SAFETY: `dimensions` is non-null with `rank` entries per the API.
    let dims = unsafe { std::slice::from_raw_parts(c.dimensions, c.rank as usize) };
    if dims != spec.dims.as_slice() {
        return Err(format!(
            "graph {}: {} given dims {dims:?}",
            g.name,
            describe(spec)
        ));
    }
    let data = match c.mem_type {
        mem_type::RAW => {
            // SAFETY: RAW tensors carry a client buffer.
            let cb = unsafe { c.mem.client_buf };
            if cb.data.is_null() || cb.data_size as usize != spec.bytes() {
                return Err(format!(
                    "graph {}: {} needs a {}-byte buffer, got {} bytes",
                    g.name,
                    describe(spec),
                    spec.bytes(),
                    cb.data_size
                ));
            }
            cb.data as *mut u8
        }
        mem_type::MEMHANDLE => {
            // SAFETY: MEMHANDLE tensors carry a registered handle.
            let h = unsafe { c.mem.mem_handle };
            crate::exec::mem_lookup(h as usize, context, spec.bytes())
                .map_err(|why| format!("graph {}: {} has {why}", g.name, spec.name))?
        }
        other => {
            return Err(format!(
                "graph {}: {} has unsupported memType {other}",
                g.name, spec.name
            ))
        }
    };
    Ok(Bound { spec, data })
}

pub unsafe extern "C" fn graph_execute(
    graph: QnnGraphHandle,
    inputs: *const QnnTensor,
    n_in: u32,
    outputs: *mut QnnTensor,
    n_out: u32,
    _profile: QnnProfileHandle,
    _signal: QnnSignalHandle,
) -> QnnErrorHandle {
    let Some((g, context)) = find_graph_in(graph as usize) else {
        return E_GRAPH_INVALID_HANDLE;
    };
    if knobs::get().delay_ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(knobs::get().delay_ms));
    }
    if let Some(code) = knobs::injected_failure("graphExecute") {
        log(
            log_level::ERROR,
            &format!(
                "qnn-emu: injected graphExecute failure {code} in {}",
                g.name
            ),
        );
        return code;
    }
    if n_in as usize != g.inputs.len()
        || n_out as usize != g.outputs.len()
        || inputs.is_null()
        || outputs.is_null()
    {
        log(
            log_level::ERROR,
            &format!(
                "qnn-emu: graph {} takes {} inputs and {} outputs, got {n_in} and {n_out}",
                g.name,
                g.inputs.len(),
                g.outputs.len()
            ),
        );
        return E_GRAPH_INVALID_ARGUMENT;
    }
    let mut ins = HashMap::new();
    let mut outs = HashMap::new();
    for i in 0..n_in as usize {
        // SAFETY: the caller passes `n_in` contiguous tensors (stride = our sizeof, 144).
        match unsafe { bind(g, context, &g.inputs, inputs.add(i), "input") } {
            Ok(b) => {
                ins.insert(b.spec.name.as_str(), b);
            }
            Err(e) => {
                log(log_level::ERROR, &format!("qnn-emu: {e}"));
                return E_GRAPH_INVALID_TENSOR;
            }
        }
    }
    for i in 0..n_out as usize {
        // SAFETY: as above for outputs.
        match unsafe { bind(g, context, &g.outputs, outputs.add(i), "output") } {
            Ok(b) => {
                outs.insert(b.spec.name.as_str(), b);
            }
            Err(e) => {
                log(log_level::ERROR, &format!("qnn-emu: {e}"));
                return E_GRAPH_INVALID_TENSOR;
            }
        }
    }
    if ins.len() != g.inputs.len() || outs.len() != g.outputs.len() {
        log(
            log_level::ERROR,
            &format!("qnn-emu: graph {}: a tensor was passed twice", g.name),
        );
        return E_GRAPH_INVALID_TENSOR;
    }
    if knobs::get().trace.is_some() {
        trace_execute(g, inputs, n_in, outputs, n_out, &ins);
    }
    match run(g, &ins, &outs) {
        Ok(()) => 0,
        Err(e) => {
            log(log_level::ERROR, &format!("qnn-emu: graph {}: {e}", g.name));
            E_GRAPH_INVALID_TENSOR
        }
    }
}

fn read(b: &Bound<'_>) -> Vec<f32> {
    // SAFETY: `bind` checked the buffer is non-null and exactly `bytes()` long.
    let bytes = unsafe { std::slice::from_raw_parts(b.data, b.spec.bytes()) };
    to_f32(b.spec, bytes)
}

fn write(b: &Bound<'_>, vals: &[f32]) {
    // SAFETY: as in `read`; output buffers are writable by contract.
    let bytes = unsafe { std::slice::from_raw_parts_mut(b.data, b.spec.bytes()) };
    from_f32(b.spec, vals, bytes);
}

fn run(
    g: &EmuGraph,
    ins: &HashMap<&str, Bound<'_>>,
    outs: &HashMap<&str, Bound<'_>>,
) -> Result<(), String> {
    let kind_idx = match g.kind {
        GraphKind::Prefill => 0,
        GraphKind::Decode => 1,
        GraphKind::Lmhead => 2,
        GraphKind::Genie => 3,
    };
    let kind_name = ["prefill", "decode", "lmhead", "genie"][kind_idx];
    let nan = knobs::nan_now(kind_name, kind_idx);
    if g.null_compute || nan {
        for (i, o) in g.outputs.iter().enumerate() {
            let mut v = vec![if nan { f32::NAN } else { 0.0 }; o.elems()];
            let logits = g.kind == GraphKind::Lmhead || o.name == "logits";
            if !nan && logits && i == 0 && knobs::get().null_logits_noise {
                // Realistic-looking logits for sampling benchmarks: deterministic noise in
                // [-8, 8) that changes every execute.
                let mut rng = crate::writer::Rng::new(knobs::next_noise_seed());
                v.iter_mut().for_each(|x| *x = rng.uniform(8.0));
            }
            if !nan && logits && i == 0 {
                // Deterministic logits: favour a token that depends on nothing but the graph.
                v[(o.elems() / 7).min(o.elems() - 1)] = 1.0;
            }
            write(&outs[o.name.as_str()], &v);
        }
        return Ok(());
    }
    let w = &g.weights;
    let c = &w.cfg;
    match g.kind {
        GraphKind::Lmhead => {
            // One row, or (a verify head) `seq` rows at once; an int32 output takes each
            // row's argmax (the first of equal maxima) instead of its logits.
            let x = read(ins.values().next().ok_or("no input")?);
            let out = outs.values().next().ok_or("no output")?;
            let ids = out.spec.dtype == qnn_sys::dtype::INT_32;
            let mut y = Vec::new();
            for row in x.chunks(c.hidden) {
                let n = if g.norm {
                    w.final_norm(row)
                } else {
                    row.to_vec()
                };
                crate::calib::record("y_norm", &n);
                let logits = w.project(&n);
                if ids {
                    let mut best = 0;
                    for (i, v) in logits.iter().enumerate() {
                        if *v > logits[best] {
                            best = i;
                        }
                    }
                    y.push(best as f32);
                } else {
                    y.extend_from_slice(&logits);
                }
            }
            write(out, &y);
        }
        GraphKind::Genie => run_genie(g, ins, outs)?,
        GraphKind::Prefill | GraphKind::Decode => {
            let decode = g.kind == GraphKind::Decode;
            let rows = if decode { 1 } else { g.seq };
            let get = |n: &str| {
                ins.get(n)
                    .map(read)
                    .ok_or_else(|| format!("missing input {n}"))
            };
            let x = get("x")?;
            let cos = get("cos")?;
            let sin = get("sin")?;
            let mask = get("cmask")?;
            let kinds = crate::model::layer_kinds(c)?;
            let has_past = (0..c.n_layers)
                .any(|i| kinds[i].has_kv() && ins.contains_key(format!("past_k_{i}").as_str()));
            let mut past_store = Vec::new();
            let mut conv_past = Vec::new();
            for (i, kind) in kinds.iter().enumerate() {
                if has_past && kind.has_kv() {
                    past_store.push(Some((
                        get(&format!("past_k_{i}"))?,
                        get(&format!("past_v_{i}"))?,
                    )));
                } else {
                    past_store.push(None);
                }
                let state = format!("past_conv_{i}");
                conv_past.push(if *kind == crate::model::LayerKind::Conv && decode {
                    let v = get(&state)?;
                    if v.len() != c.hidden * c.conv_width.unwrap_or(3) {
                        return Err(format!("{state} has {} elements", v.len()));
                    }
                    Some(v)
                } else {
                    None
                });
            }
            let past: Vec<KvView<'_>> = past_store
                .iter()
                .map(|kv| KvView {
                    past_k: kv.as_ref().map(|(k, _)| k.as_slice()),
                    past_v: kv.as_ref().map(|(_, v)| v.as_slice()),
                    ctx: g.ctx,
                    layout: g.layout,
                })
                .collect();
            let expect_mask = if decode {
                g.ctx
            } else if has_past {
                rows * (g.ctx + rows)
            } else {
                rows * rows
            };
            if mask.len() != expect_mask {
                return Err(format!(
                    "cmask has {} elements, expected {expect_mask}",
                    mask.len()
                ));
            }
            let opt = |n: &str| ins.get(n).map(read);
            let local_rope = match (opt("cos_local"), opt("sin_local")) {
                (Some(a), Some(b)) => Some((a, b)),
                (None, None) => None,
                _ => return Err("cos_local and sin_local come together".into()),
            };
            let local_mask = opt("cmask_local");
            if local_mask.as_ref().is_some_and(|m| m.len() != expect_mask) {
                return Err(format!(
                    "cmask_local has {expect_mask} elements in this graph"
                ));
            }
            if kinds.contains(&crate::model::LayerKind::Sliding) && local_mask.is_none() {
                return Err("sliding_attention layers need the cmask_local input".into());
            }
            let out = w.run_layers(
                LayerIo {
                    x: x.clone(),
                    rows,
                    cos: &cos,
                    sin: &sin,
                    mask: &mask,
                    local_rope: local_rope
                        .as_ref()
                        .map(|(a, b)| (a.as_slice(), b.as_slice())),
                    local_mask: local_mask.as_deref(),
                    self_visible: decode,
                    conv_past: &conv_past,
                },
                &past,
            );
            for (i, (bx, present)) in out.conv_bx.iter().zip(&out.conv_present).enumerate() {
                if let Some(b) = outs.get(format!("conv_bx_{i}").as_str()) {
                    if b.spec.elems() != bx.len() {
                        return Err(format!(
                            "conv_bx_{i} holds {} values, the layer gives {}",
                            b.spec.elems(),
                            bx.len()
                        ));
                    }
                    write(b, bx);
                }
                if let Some(b) = outs.get(format!("present_conv_{i}").as_str()) {
                    if b.spec.elems() != present.len() {
                        return Err(format!(
                            "present_conv_{i} holds {} values, the layer gives {}",
                            b.spec.elems(),
                            present.len()
                        ));
                    }
                    write(b, present);
                }
            }
            let out_y = if g.final_norm {
                w.final_norm(&out.y)
            } else {
                out.y.clone()
            };
            write(&outs["y"], &out_y);
            if knobs::get().calibrate.is_some() {
                // Only the rows holding real tokens (non-zero x) count for the ranges.
                let h = c.hidden;
                let kd = c.n_kv_heads * c.head_dim;
                let live: Vec<usize> = (0..rows)
                    .filter(|&r| x[r * h..(r + 1) * h].iter().any(|v| *v != 0.0))
                    .collect();
                let pick = |v: &[f32], w: usize| {
                    live.iter()
                        .flat_map(|&r| v[r * w..(r + 1) * w].to_vec())
                        .collect::<Vec<f32>>()
                };
                crate::calib::record("x", &pick(&x, h));
                crate::calib::record("y", &pick(&out.y, h));
                for (i, (k, v)) in out.new_k.iter().zip(&out.new_v).enumerate() {
                    if k.is_empty() {
                        continue;
                    }
                    crate::calib::record(&format!("k_{i}"), &pick(k, kd));
                    crate::calib::record(&format!("v_{i}"), &pick(v, kd));
                }
            }
            for (i, (k, v)) in out.new_k.iter().zip(&out.new_v).enumerate() {
                if k.is_empty() {
                    continue;
                }
                let (k, v) = match g.layout {
                    KvLayout::PosMajor => (k.clone(), v.clone()),
                    KvLayout::HeadMajor => (
                        to_head_major(k, rows, c.n_kv_heads, c.head_dim),
                        to_head_major(v, rows, c.n_kv_heads, c.head_dim),
                    ),
                };
                if let Some(b) = outs.get(format!("new_k_{i}").as_str()) {
                    write(b, &k);
                }
                if let Some(b) = outs.get(format!("new_v_{i}").as_str()) {
                    write(b, &v);
                }
            }
        }
    }
    Ok(())
}

/// A Genie-named graph (FORMAT.md): AR = `seq` rows, `ctx` past slots.
fn run_genie(
    g: &EmuGraph,
    ins: &HashMap<&str, Bound<'_>>,
    outs: &HashMap<&str, Bound<'_>>,
) -> Result<(), String> {
    let w = &g.weights;
    let c = &w.cfg;
    let (ar, past, h, hd, nkv) = (g.seq, g.ctx, c.hidden, c.head_dim, c.n_kv_heads);
    let half = hd / 2;
    if hd == 0 || hd % 2 != 0 || ar == 0 {
        return Err(format!(
            "AR {ar} and head_dim {hd} cannot run (AR >= 1, even head_dim)"
        ));
    }
    // Every input with the element count the math below indexes by.
    let get_n = |n: &str, want: usize| {
        let v = ins
            .get(n)
            .map(read)
            .ok_or_else(|| format!("missing input {n}"))?;
        if v.len() != want {
            return Err(format!("{n} has {} elements, expected {want}", v.len()));
        }
        Ok(v)
    };
    let ids = get_n("input_ids", ar)?;
    let embd = w.embd.as_ref().ok_or("no token_embd.weight")?;
    let mut x = Vec::with_capacity(ar * h);
    for &id in &ids {
        let id = id as usize;
        if id >= c.vocab {
            return Err(format!("input_ids holds {id}, vocab is {}", c.vocab));
        }
        x.extend_from_slice(&embd[id * h..(id + 1) * h]);
    }
    // Genie's RoPE inputs hold half a row; the rotate-half table repeats it.
    let full = |v: Vec<f32>| -> Vec<f32> {
        v.chunks(half)
            .flat_map(|r| r.iter().chain(r.iter()).copied().collect::<Vec<f32>>())
            .collect()
    };
    let cos = full(get_n("position_ids_cos", ar * half)?);
    let sin = full(get_n("position_ids_sin", ar * half)?);
    let mask = get_n("attention_mask", ar * (past + ar))?;
    let mut store = Vec::new();
    for i in 0..c.n_layers {
        // Keys come transposed, [n_kv, head_dim, past]: back to [n_kv, past, head_dim].
        let kt = get_n(&format!("past_key_{i}_in"), nkv * hd * past)?;
        let mut k = vec![0f32; kt.len()];
        for hh in 0..nkv {
            for d in 0..hd {
                for p in 0..past {
                    k[(hh * past + p) * hd + d] = kt[(hh * hd + d) * past + p];
                }
            }
        }
        store.push((k, get_n(&format!("past_value_{i}_in"), nkv * past * hd)?));
    }
    let views: Vec<KvView<'_>> = store
        .iter()
        .map(|(k, v)| KvView {
            past_k: Some(k),
            past_v: Some(v),
            ctx: past,
            layout: KvLayout::HeadMajor,
        })
        .collect();
    let out = w.run_layers(
        LayerIo {
            x,
            rows: ar,
            cos: &cos,
            sin: &sin,
            mask: &mask,
            local_rope: None,
            local_mask: None,
            self_visible: false,
            conv_past: &[],
        },
        &views,
    );
    let normed = w.final_norm(&out.y);
    let lb = outs.get("logits").ok_or("missing output logits")?;
    let rows = lb.spec.elems() / c.vocab.max(1);
    if rows == 0 || rows > ar || rows * c.vocab != lb.spec.elems() {
        return Err(format!(
            "logits has {} elements for AR {ar}",
            lb.spec.elems()
        ));
    }
    let mut logits = Vec::with_capacity(rows * c.vocab);
    for r in ar - rows..ar {
        logits.extend(w.project(&normed[r * h..(r + 1) * h]));
    }
    write(lb, &logits);
    for (i, (k, v)) in out.new_k.iter().zip(&out.new_v).enumerate() {
        let mut kt = vec![0f32; k.len()];
        for r in 0..ar {
            for hh in 0..nkv {
                for d in 0..hd {
                    kt[(hh * hd + d) * ar + r] = k[(r * nkv + hh) * hd + d];
                }
            }
        }
        if let Some(b) = outs.get(format!("past_key_{i}_out").as_str()) {
            write(b, &kt);
        }
        if let Some(b) = outs.get(format!("past_value_{i}_out").as_str()) {
            write(b, &to_head_major(v, ar, nkv, hd));
        }
    }
    Ok(())
}

/// Snapshots of each graph's inputs at its previous execute (tracing only).
fn snapshots() -> &'static std::sync::Mutex<HashMap<String, Vec<Vec<u8>>>> {
    static S: std::sync::OnceLock<std::sync::Mutex<HashMap<String, Vec<Vec<u8>>>>> =
        std::sync::OnceLock::new();
    S.get_or_init(Default::default)
}

/// Record memTypes and how many input bytes changed since this graph's previous execute.
fn trace_execute(
    g: &EmuGraph,
    inputs: *const QnnTensor,
    n_in: u32,
    outputs: *mut QnnTensor,
    n_out: u32,
    ins: &HashMap<&str, Bound<'_>>,
) {
    let (mut raw, mut mh) = (0u64, 0u64);
    let all = (0..n_in as usize)
        // SAFETY: `graph_execute` already read these tensors.
        .map(|i| unsafe { &*inputs.add(i) })
        // SAFETY: as above, for outputs.
        .chain((0..n_out as usize).map(|i| unsafe { &*outputs.add(i) }));
    for t in all {
        // SAFETY: versions were validated by `bind`.
        match unsafe { t.common() }.mem_type {
            mem_type::RAW => raw += 1,
            mem_type::MEMHANDLE => mh += 1,
            _ => {}
        }
    }
    let now: Vec<Vec<u8>> = g
        .inputs
        .iter()
        .map(|s| {
            let b = &ins[s.name.as_str()];
            // SAFETY: `bind` checked the buffer holds `bytes()` readable bytes.
            unsafe { std::slice::from_raw_parts(b.data, b.spec.bytes()) }.to_vec()
        })
        .collect();
    let mut snaps = snapshots().lock().unwrap_or_else(|e| e.into_inner());
    let changed = snaps.get(&g.name).map(|prev| {
        prev.iter()
            .zip(&now)
            .map(|(a, b)| a.iter().zip(b).filter(|(x, y)| x != y).count() as u64)
            .sum::<u64>()
    });
    snaps.insert(g.name.clone(), now);
    drop(snaps);
    crate::registry::exec_stat(&g.name, |st| {
        st.executes += 1;
        st.raw_args += raw;
        st.memhandle_args += mh;
        if let Some(c) = changed {
            st.changed_bytes.push(c);
            st.max_changed_bytes = st.max_changed_bytes.max(c);
        }
    });
}

fn is_fixed_point(dt: u32) -> bool {
    matches!(
        dt,
        dtype::UFIXED_POINT_8
            | dtype::UFIXED_POINT_16
            | dtype::SFIXED_POINT_8
            | dtype::SFIXED_POINT_16
    )
}
