//! Loading a bundle: libraries, context binaries, graph discovery and validation of every
//! graph tensor against the manifest. Bindings are built from the binaries' descriptors.

use crate::error::{Error, Result};
use crate::kv::KvShape;
use crate::manifest::{GraphRef, Manifest};
use crate::ops::embed::EmbedTable;
use crate::qnn::{self, BinaryInfo, Context, Graph, GraphDesc, Runtime, TensorDesc};
use crate::tokenizer::Tokenizer;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Tensor positions of a prefill or decode graph, resolved by name once.
#[derive(Debug, Clone)]
pub struct LayerIo {
    pub x: usize,
    pub cos: usize,
    pub sin: usize,
    pub mask: usize,
    pub y: usize,
    /// Per layer (input index of past K, input index of past V), when the graph has them.
    pub past: Vec<(usize, usize)>,
    /// Per layer (output index of new K, output index of new V).
    pub new: Vec<(usize, usize)>,
    /// Rows per execute (P for prefill, 1 for decode).
    pub rows: usize,
    /// KV capacity of the past inputs (C), 0 without past.
    pub ctx: usize,
    pub past_shape: Option<KvShape>,
    pub new_shape: KvShape,
}

pub struct LoadedGraph {
    pub graph: Graph,
    pub desc: GraphDesc,
}

pub struct Model {
    pub manifest: Manifest,
    pub rt: Arc<Runtime>,
    pub prefill: Option<(LoadedGraph, LayerIo)>,
    pub decode: (LoadedGraph, LayerIo),
    pub lmhead: LoadedGraph,
    pub embed: EmbedTable,
    pub tokenizer: Tokenizer,
    /// End tokens: the manifest's eos ids plus the tokenizer's well-known end tokens.
    pub eos: Vec<u32>,
    /// Effective context length: min(manifest max_ctx, decode graph capacity).
    pub max_ctx: usize,
    pub load_ms: f64,
    /// Per context binary: (file, ms to create).
    pub context_ms: Vec<(PathBuf, f64)>,
    /// Host bytes a decode step writes into graph inputs: one embedding row, one RoPE row
    /// (cos + sin), one mask slot, one K and one V row per layer, and the lm-head input.
    /// Derived once from the descriptors; it has no C term.
    pub decode_step_bytes: usize,
    /// Why rpcmem is not in use (None when it is loaded).
    pub rpcmem_note: Option<String>,
}

fn role_words(role: &str) -> &'static [&'static str] {
    match role {
        "prefill" => &["prefill", "pf", "ar128", "full"],
        "decode" => &["decode", "dec", "ar1"],
        _ => &["lmhead", "lm_head", "lmh"],
    }
}

/// Choose the graph for `role` from a binary: by manifest name, else the only graph, else
/// the one whose name contains a role word.
fn pick_graph<'a>(info: &'a BinaryInfo, r: &GraphRef, role: &str) -> Result<&'a GraphDesc> {
    let names = || {
        info.graphs
            .iter()
            .map(|g| g.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(want) = &r.graph {
        return info
            .graphs
            .iter()
            .find(|g| &g.name == want)
            .ok_or_else(|| Error::File {
                path: r.bin.clone(),
                msg: format!(
                    "no graph named {want:?} for {role} (the binary has: {})",
                    names()
                ),
            });
    }
    if info.graphs.len() == 1 {
        return Ok(&info.graphs[0]);
    }
    let hits: Vec<_> = info
        .graphs
        .iter()
        .filter(|g| {
            let n = g.name.to_lowercase();
            role_words(role).iter().any(|w| n.contains(w))
        })
        .collect();
    match hits.as_slice() {
        [g] => Ok(g),
        _ => Err(Error::File {
            path: r.bin.clone(),
            msg: format!(
                "cannot tell which graph is the {role} graph (the binary has: {}); set artifacts.contexts.{role}.graph",
                names()
            ),
        }),
    }
}

fn find<'a>(
    list: &'a [TensorDesc],
    name: &str,
    graph: &str,
    what: &str,
) -> Result<(usize, &'a TensorDesc)> {
    list.iter()
        .enumerate()
        .find(|(_, t)| t.name == name)
        .ok_or_else(|| {
            Error::graph(
                graph,
                format!(
                    "has no {what} tensor named {name:?} (it has: {})",
                    list.iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
}

fn elems_of(t: &TensorDesc) -> usize {
    t.elems()
}

/// Check every tensor's dtype is one the host can convert.
fn check_dtypes(g: &GraphDesc) -> Result<()> {
    for t in g.inputs.iter().chain(&g.outputs) {
        if !qnn::buffer_dtype_supported(t.dtype) {
            return Err(Error::graph(
                &g.name,
                format!(
                    "tensor {} has dtype {}, which qhx cannot read or write",
                    t.describe(),
                    qnn_sys::dtype::name(t.dtype)
                ),
            ));
        }
        if t.bytes() > u32::MAX as usize {
            return Err(Error::graph(
                &g.name,
                format!(
                    "tensor {} exceeds the 4 GiB client-buffer limit",
                    t.describe()
                ),
            ));
        }
    }
    Ok(())
}

/// Resolve and validate the I/O of a prefill (`decode == false`) or decode graph.
fn layer_io(m: &Manifest, g: &GraphDesc, decode: bool) -> Result<LayerIo> {
    let p = &m.params;
    let (h, hd, k) = (p.hidden, p.head_dim, m.kv_dim());
    let gn = g.name.as_str();
    // Tensor names by role; `plan.io` may rename them for bundles with other conventions.
    let nm = |role: &str, i: Option<usize>| m.plan.tensor_name(role, i);
    let (x, xt) = find(&g.inputs, &nm("x", None), gn, "input")?;
    let rows = elems_of(xt) / h;
    if rows == 0 || elems_of(xt) != rows * h {
        return Err(Error::graph(
            gn,
            format!(
                "input {} is not a whole number of hidden={h} rows",
                xt.describe()
            ),
        ));
    }
    if decode && rows != 1 {
        return Err(Error::graph(
            gn,
            format!(
                "decode input {} must hold one row of hidden={h}",
                xt.describe()
            ),
        ));
    }
    let (cos, ct) = find(&g.inputs, &nm("cos", None), gn, "input")?;
    let (sin, st) = find(&g.inputs, &nm("sin", None), gn, "input")?;
    for t in [ct, st] {
        if elems_of(t) != rows * hd {
            return Err(Error::graph(
                gn,
                format!("input {} should be {rows} x head_dim={hd}", t.describe()),
            ));
        }
    }
    let (mask, mt) = find(&g.inputs, &nm("cmask", None), gn, "input")?;
    let (y, yt) = find(&g.outputs, &nm("y", None), gn, "output")?;
    if elems_of(yt) != rows * h {
        return Err(Error::graph(
            gn,
            format!("output {} should be {rows} x hidden={h}", yt.describe()),
        ));
    }
    let mut past = Vec::new();
    let mut new = Vec::new();
    let mut past_shape = None;
    let mut new_shape = None;
    for i in 0..p.n_layers {
        let (nk, nkt) = find(&g.outputs, &nm("new_k", Some(i)), gn, "output")?;
        let (nv, nvt) = find(&g.outputs, &nm("new_v", Some(i)), gn, "output")?;
        for t in [nkt, nvt] {
            let s = KvShape::from_dims(&t.dims, p.n_kv_heads, hd)
                .filter(|s| s.rows == rows)
                .ok_or_else(|| {
                    Error::graph(
                        gn,
                        format!("output {} should hold {rows} rows of K={k}", t.describe()),
                    )
                })?;
            new_shape = Some(s);
        }
        new.push((nk, nv));
        let has_past = g.inputs.iter().any(|t| t.name == nm("past_k", Some(i)));
        if has_past || decode {
            let (pk, pkt) = find(&g.inputs, &nm("past_k", Some(i)), gn, "input")?;
            let (pv, pvt) = find(&g.inputs, &nm("past_v", Some(i)), gn, "input")?;
            for t in [pkt, pvt] {
                let s = KvShape::from_dims(&t.dims, p.n_kv_heads, hd)
                    .filter(|s| s.rows > 0)
                    .ok_or_else(|| {
                        Error::graph(
                            gn,
                            format!(
                                "input {} should be [C, K={k}] or [n_kv, C, head_dim]",
                                t.describe()
                            ),
                        )
                    })?;
                if let Some(prev) = past_shape {
                    let prev: KvShape = prev;
                    if prev.rows != s.rows {
                        return Err(Error::graph(
                            gn,
                            format!(
                                "input {} disagrees on the cache length C={}",
                                t.describe(),
                                prev.rows
                            ),
                        ));
                    }
                }
                past_shape = Some(s);
            }
            past.push((pk, pv));
        }
    }
    let ctx = past_shape.map_or(0, |s| s.rows);
    let want_mask = if decode {
        ctx
    } else if ctx > 0 {
        rows * (ctx + rows)
    } else {
        rows * rows
    };
    if elems_of(mt) != want_mask {
        return Err(Error::graph(
            gn,
            format!("input {} should have {want_mask} elements", mt.describe()),
        ));
    }
    Ok(LayerIo {
        x,
        cos,
        sin,
        mask,
        y,
        past,
        new,
        rows,
        ctx,
        past_shape,
        new_shape: new_shape.expect("n_layers > 0"),
    })
}

/// End-of-turn / end-of-text tokens of common chat models (Llama-3 instruct, DeepSeek-R1,
/// ChatML): generation stops on them as on the manifest's eos ids.
pub const END_TOKENS: &[&str] = &[
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
    "<|im_end|>",
    "<|endoftext|>",
];

pub struct LoadOptions {
    pub log_level: u32,
    /// HTP performance vote held while the model is loaded.
    pub perf: qnn::PerfMode,
    /// rpcmem library for zero-copy I/O (`libcdsprpc.so` by default); None disables it.
    pub rpcmem_lib: Option<PathBuf>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            log_level: 0,
            perf: qnn::PerfMode::Burst,
            rpcmem_lib: Some(PathBuf::from(if cfg!(windows) {
                "libcdsprpc.dll"
            } else {
                "libcdsprpc.so"
            })),
        }
    }
}

impl Model {
    pub fn load(m: Manifest, backend: &Path, system: &Path, opts: &LoadOptions) -> Result<Model> {
        let t0 = Instant::now();
        // Files first: a missing artifact should not wait for the NPU.
        for (what, p) in [("tokenizer", &m.tokenizer), ("embedding table", &m.embed)] {
            if !p.is_file() {
                return Err(Error::File {
                    path: p.clone(),
                    msg: format!(
                        "{what} not found (artifact paths resolve against the artifacts root)"
                    ),
                });
            }
        }
        // The tokenizer (the slowest host part of a cold start: a 150k-token BPE) loads on
        // its own thread while the embedding is mapped and the contexts are created. Its
        // errors still take precedence, as when it loaded first.
        let tok_path = m.tokenizer.clone();
        let tok_thread = std::thread::spawn(move || Tokenizer::load(&tok_path));
        let stage2 = || -> Result<_> {
            let embed = EmbedTable::open(&m.embed, m.embed_dtype, m.params.vocab, m.params.hidden)?;
            let mut rt = Runtime::new(backend, system, opts.log_level)?;
            rt.set_perf(opts.perf)?;
            let rpcmem_note = match &opts.rpcmem_lib {
                Some(p) => rt.load_rpcmem(p).err(),
                None => Some("disabled".to_string()),
            };
            let rt = Arc::new(rt);

            // Each distinct binary once: metadata via libQnnSystem, then a context.
            let mut refs: Vec<(&str, &GraphRef)> = Vec::new();
            if let Some(p) = &m.prefill {
                refs.push(("prefill", p));
            }
            refs.push(("decode", &m.decode));
            refs.push(("lmhead", &m.lmhead));
            // Each distinct binary once, all concurrently (one thread per binary): map it, read
            // its metadata via libQnnSystem, create its context, and drop the mapping right
            // away, so peak RSS holds at most the binaries still being created.
            let mut bins: Vec<PathBuf> = Vec::new();
            for (_, r) in &refs {
                if !bins.contains(&r.bin) {
                    bins.push(r.bin.clone());
                }
            }
            let load_one = |bin: &PathBuf| -> Result<(Arc<Context>, BinaryInfo, f64)> {
                let tc = Instant::now();
                let file = std::fs::File::open(bin).map_err(|e| Error::io(bin, e))?;
                let len = file.metadata().map_err(|e| Error::io(bin, e))?.len();
                if len == 0 {
                    return Err(Error::File {
                        path: bin.clone(),
                        msg: "context binary is empty".into(),
                    });
                }
                let map = qnn::map_file(&file, bin)?;
                let info = qnn::read_binary_info(&rt, &map, bin)?;
                let ctx = Context::from_binary(&rt, &map, bin)?;
                drop(map);
                Ok((ctx, info, t0_ms(tc)))
            };
            let results: Vec<Result<(Arc<Context>, BinaryInfo, f64)>> = if bins.len() > 1 {
                std::thread::scope(|sc| {
                    let hs: Vec<_> = bins.iter().map(|b| sc.spawn(|| load_one(b))).collect();
                    hs.into_iter()
                        .map(|h| {
                            h.join().unwrap_or_else(|_| {
                                Err(Error::Input("a context-loading thread panicked".into()))
                            })
                        })
                        .collect()
                })
            } else {
                bins.iter().map(load_one).collect()
            };
            let mut contexts: HashMap<PathBuf, (Arc<Context>, BinaryInfo)> = HashMap::new();
            let mut context_ms = Vec::new();
            // The first failure in manifest order is reported; contexts already created are
            // dropped (freed) with `contexts` on return.
            for (bin, r) in bins.iter().zip(results) {
                let (ctx, info, ms) = r?;
                context_ms.push((bin.clone(), ms));
                contexts.insert(bin.clone(), (ctx, info));
            }
            Ok((embed, rt, rpcmem_note, contexts, context_ms))
        };
        let stage2 = stage2();
        let tokenizer = tok_thread.join().unwrap_or_else(|_| {
            Err(Error::Input("the tokenizer-loading thread panicked".into()))
        })?;
        if tokenizer.vocab_size() > m.params.vocab {
            return Err(Error::Tokenizer {
                path: m.tokenizer.clone(),
                msg: format!(
                    "has {} tokens but params.vocab (embedding rows) is {}",
                    tokenizer.vocab_size(),
                    m.params.vocab
                ),
            });
        }
        let (embed, rt, rpcmem_note, contexts, context_ms) = stage2?;
        let load_graph = |role: &str, r: &GraphRef| -> Result<LoadedGraph> {
            let (ctx, info) = &contexts[&r.bin];
            let desc = pick_graph(info, r, role)?.clone();
            check_dtypes(&desc)?;
            let graph = ctx.graph(&desc.name)?;
            Ok(LoadedGraph { graph, desc })
        };
        let prefill = match &m.prefill {
            Some(r) => {
                let g = load_graph("prefill", r)?;
                let io = layer_io(&m, &g.desc, false)?;
                Some((g, io))
            }
            None => None,
        };
        let dg = load_graph("decode", &m.decode)?;
        let dio = layer_io(&m, &dg.desc, true)?;
        let lmhead = load_graph("lmhead", &m.lmhead)?;
        {
            let d = &lmhead.desc;
            if d.inputs.len() != 1 || d.outputs.len() != 1 {
                return Err(Error::graph(
                    &d.name,
                    format!(
                        "an lm-head graph has one input and one output, this one has {} and {}",
                        d.inputs.len(),
                        d.outputs.len()
                    ),
                ));
            }
            if d.inputs[0].elems() != m.params.hidden {
                return Err(Error::graph(
                    &d.name,
                    format!(
                        "input {} should hold hidden={}",
                        d.inputs[0].describe(),
                        m.params.hidden
                    ),
                ));
            }
            if d.outputs[0].elems() != m.params.vocab {
                return Err(Error::graph(
                    &d.name,
                    format!(
                        "output {} should hold vocab={}",
                        d.outputs[0].describe(),
                        m.params.vocab
                    ),
                ));
            }
        }
        if let Some((pg, pio)) = &prefill {
            if pio.new_shape.rows != pio.rows {
                return Err(Error::graph(
                    &pg.desc.name,
                    "new_k/new_v rows disagree with x",
                ));
            }
            if pio.ctx > 0 && pio.ctx != dio.ctx {
                return Err(Error::graph(
                    &pg.desc.name,
                    format!(
                        "past inputs hold {} positions but the decode cache holds {}",
                        pio.ctx, dio.ctx
                    ),
                ));
            }
            // Chunked prefill reads the decode cache in place: same layout, dtype and scale.
            for (&(pk, pv), &(dk, dv)) in pio.past.iter().zip(&dio.past) {
                for (a, b) in [(pk, dk), (pv, dv)] {
                    let (ta, tb) = (&pg.desc.inputs[a], &dg.desc.inputs[b]);
                    if ta.dims != tb.dims || ta.dtype != tb.dtype || ta.quant != tb.quant {
                        return Err(Error::graph(
                            &pg.desc.name,
                            format!(
                                "input {} must match the decode cache {} (dims, dtype and quantization) to share it",
                                ta.describe(),
                                tb.describe()
                            ),
                        ));
                    }
                }
            }
        }
        let max_ctx = m.params.max_ctx.min(dio.ctx);
        let mut eos = m.eos.clone();
        for t in END_TOKENS {
            if let Some(id) = tokenizer.token_id(t) {
                if !eos.contains(&id) {
                    eos.push(id);
                }
            }
        }
        let decode_step_bytes = {
            let es = |t: &TensorDesc| qnn_sys::dtype::size_of(t.dtype).unwrap_or(0);
            let d = &dg.desc;
            let row = |i: usize| es(&d.inputs[i]) * dio.new_shape.n_kv * dio.new_shape.head_dim;
            m.params.hidden * es(&d.inputs[dio.x])
                + m.params.head_dim * (es(&d.inputs[dio.cos]) + es(&d.inputs[dio.sin]))
                + es(&d.inputs[dio.mask])
                + dio
                    .past
                    .iter()
                    .map(|&(k, v)| row(k) + row(v))
                    .sum::<usize>()
                + m.params.hidden * es(&lmhead.desc.inputs[0])
        };
        let load_ms = t0_ms(t0);
        Ok(Model {
            eos,
            manifest: m,
            rt,
            prefill,
            decode: (dg, dio),
            lmhead,
            embed,
            tokenizer,
            max_ctx,
            load_ms,
            context_ms,
            decode_step_bytes,
            rpcmem_note,
        })
    }
}

fn t0_ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}
