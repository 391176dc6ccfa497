//! A Genie bundle loaded through QNN: its graphs discovered from the binaries' own metadata
//! and grouped the way Genie groups them (variants by tokens-per-step AR and context CL,
//! splits of one variant by sorted graph name), with every tensor given a role.

use super::config::{GenieConfig, Resolved};
use crate::error::{Error, Result};
use crate::model::{open_runtime, LoadOptions};
use crate::qnn::{self, Context, Graph, GraphDesc, Runtime, TensorDesc};
use crate::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// What a graph tensor is for, by Genie's naming rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    InputIds,
    Mask,
    Cos,
    Sin,
    /// `past_key_{L}_in`: [n_kv, 1, head_dim, past] (keys transposed).
    PastKey(usize),
    /// `past_value_{L}_in`: [n_kv, 1, past, head_dim].
    PastValue(usize),
    /// `past_key_{L}_out`: [n_kv, 1, head_dim, AR].
    KeyOut(usize),
    /// `past_value_{L}_out`: [n_kv, 1, AR, head_dim].
    ValueOut(usize),
    Logits,
    /// Passed between splits: an input with the name of an earlier split's output, or an
    /// output a later split reads.
    Link,
}

/// The layer of a K/V tensor name: it contains `key` or `value` and ends `_in` / `_out`; the
/// layer is the last number in it (`past_key_12_in` -> 12).
fn kv_role(name: &str, input: bool) -> Option<Role> {
    let n = name.to_ascii_lowercase();
    let stem = if input {
        n.strip_suffix("_in")?
    } else {
        n.strip_suffix("_out")?
    };
    let is_key = stem.contains("key");
    if !is_key && !stem.contains("value") {
        return None;
    }
    let digits: String = stem
        .chars()
        .rev()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    let layer: usize = digits.chars().rev().collect::<String>().parse().ok()?;
    Some(match (is_key, input) {
        (true, true) => Role::PastKey(layer),
        (false, true) => Role::PastValue(layer),
        (true, false) => Role::KeyOut(layer),
        (false, false) => Role::ValueOut(layer),
    })
}

fn input_role(name: &str) -> Option<Role> {
    match name {
        "input_ids" => Some(Role::InputIds),
        "attention_mask" => Some(Role::Mask),
        "position_ids_cos" => Some(Role::Cos),
        "position_ids_sin" => Some(Role::Sin),
        _ => kv_role(name, true),
    }
}

/// Dims right-aligned to rank 4 (Genie reads every tensor as [batch, height, width, channel]).
pub fn dims4(t: &TensorDesc) -> [usize; 4] {
    let mut d = [1usize; 4];
    for (slot, v) in d.iter_mut().rev().zip(t.dims.iter().rev()) {
        *slot = *v as usize;
    }
    if t.dims.len() > 4 {
        d[0] = t.dims[..t.dims.len() - 3]
            .iter()
            .map(|&x| x as usize)
            .product();
    }
    d
}

/// One graph of a variant, with the role of each input and output. `G` is the graph handle
/// (`()` when only the metadata is checked, see [`check_graphs`]).
pub struct Split<G = Graph> {
    pub graph: G,
    pub desc: GraphDesc,
    pub inputs: Vec<Role>,
    pub outputs: Vec<Role>,
    /// For each `Link` input: (split, output) that produces it.
    pub links: Vec<(usize, usize, usize)>,
}

/// Where one layer's K/V tensors are: (split, tensor index).
#[derive(Debug, Clone, Copy)]
pub struct KvAt {
    pub key_in: (usize, usize),
    pub value_in: (usize, usize),
    pub key_out: (usize, usize),
    pub value_out: (usize, usize),
}

/// Graphs sharing one (AR, CL): one model, run split by split.
pub struct Variant<G = Graph> {
    pub ar: usize,
    pub cl: usize,
    /// Past slots the graph reads (CL - AR).
    pub past: usize,
    pub splits: Vec<Split<G>>,
    pub layers: Vec<KvAt>,
    pub input_ids: (usize, usize),
    pub masks: Vec<(usize, usize)>,
    pub cos: Vec<(usize, usize)>,
    pub sin: Vec<(usize, usize)>,
    pub logits: (usize, usize),
    /// Rows of the logits tensor: AR, or 1 (last token only).
    pub logit_rows: usize,
}

pub struct GenieModel {
    pub config_path: PathBuf,
    pub cfg: Resolved,
    pub rt: Arc<Runtime>,
    pub tokenizer: Tokenizer,
    /// Largest AR first.
    pub variants: Vec<Variant>,
    pub n_kv: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub load_ms: f64,
    pub context_ms: Vec<(PathBuf, f64)>,
    /// Why rpcmem is not in use (None when it is loaded).
    pub rpcmem_note: Option<String>,
    /// Problems that did not stop the load (e.g. a refused performance vote).
    pub warnings: Vec<String>,
}

impl GenieModel {
    pub fn load(
        config_path: &Path,
        root: &Path,
        backend: &Path,
        system: &Path,
        opts: &LoadOptions,
    ) -> Result<GenieModel> {
        let t0 = Instant::now();
        let bytes = std::fs::read(config_path).map_err(|e| Error::io(config_path, e))?;
        let cfg = GenieConfig::resolve(&bytes, config_path, root)?;
        for p in cfg.ctx_bins.iter().chain([&cfg.tokenizer]) {
            if !p.is_file() {
                return Err(Error::File {
                    path: p.clone(),
                    msg: "not found (Genie config paths resolve against the artifacts root)".into(),
                });
            }
        }
        let progress = |stage: &str| {
            if let Some(p) = opts.progress {
                p(stage)
            }
        };
        if opts.cancel.is_cancelled() {
            return Err(Error::Cancelled);
        }
        // As for manifest bundles: the tokenizer parses on its own thread while the
        // contexts are created, and its errors still come first.
        let tok_path = cfg.tokenizer.clone();
        let tok_thread = std::thread::spawn(move || Tokenizer::load(&tok_path));
        let stage2 = (|| -> Result<_> {
            progress("QNN libraries");
            let (rt, rpcmem_note, warnings) = open_runtime(backend, None, system, opts)?;
            let mut graphs: Vec<(Graph, GraphDesc)> = Vec::new();
            let mut context_ms = Vec::new();
            // Contexts one after another (the real backend crashed on overlapping creations).
            let n = cfg.ctx_bins.len();
            for (k, bin) in cfg.ctx_bins.iter().enumerate() {
                if opts.cancel.is_cancelled() {
                    return Err(Error::Cancelled);
                }
                let name = bin.file_name().unwrap_or_default().to_string_lossy();
                progress(&format!("context {}/{n} ({name})", k + 1));
                let tc = Instant::now();
                graphs.extend(load_context(&rt, bin)?);
                context_ms.push((bin.clone(), tc.elapsed().as_secs_f64() * 1000.0));
            }
            Ok((rt, rpcmem_note, warnings, graphs, context_ms))
        })();
        let tokenizer = tok_thread
            .join()
            .unwrap_or_else(|_| Err(Error::ThreadPanicked("tokenizer-loading")))?;
        let (rt, rpcmem_note, warnings, graphs, context_ms) = stage2?;
        progress("graphs");
        let variants = group(graphs)?;
        let Layout {
            n_kv,
            head_dim,
            vocab,
        } = check_layout(&cfg, config_path, &variants, tokenizer.vocab_size())?;
        Ok(GenieModel {
            config_path: config_path.to_path_buf(),
            cfg,
            rt,
            tokenizer,
            variants,
            n_kv,
            head_dim,
            vocab,
            load_ms: t0.elapsed().as_secs_f64() * 1000.0,
            context_ms,
            rpcmem_note,
            warnings,
        })
    }

    /// Positions a dialog can hold: every variant must keep the cache in its past slots,
    /// and `context.size` caps it.
    pub fn max_ctx(&self) -> usize {
        let decode = self.variants.last().expect("at least one variant");
        decode.past.min(self.cfg.ctx_size)
    }

    /// End tokens: the config's eos-token(s) and eot-token.
    pub fn eos(&self) -> Vec<u32> {
        let mut e = self.cfg.eos.clone();
        if let Some(t) = self
            .cfg
            .cfg
            .dialog
            .context
            .eot_token
            .and_then(|i| u32::try_from(i).ok())
        {
            if !e.contains(&t) {
                e.push(t);
            }
        }
        e
    }

    pub fn n_layers(&self) -> usize {
        self.variants[0].layers.len()
    }

    /// QNN dtype names of the activations (the attention mask) and of the K/V cache, as the
    /// decode variant's binary declares them.
    pub fn io_dtypes(&self) -> (&'static str, &'static str) {
        let v = self.variants.last().expect("at least one variant");
        let name =
            |(split, i): (usize, usize)| qnn_sys::dtype::name(v.splits[split].desc.inputs[i].dtype);
        let act = v.masks.first().map_or("UNKNOWN", |&m| name(m));
        let kv = v.layers.first().map_or(act, |l| name(l.key_in));
        (act, kv)
    }
}

/// Create the context of one binary and list its graphs; every I/O dtype must be one the
/// host can fill and read.
fn load_context(rt: &Arc<Runtime>, bin: &Path) -> Result<Vec<(Graph, GraphDesc)>> {
    let file = std::fs::File::open(bin).map_err(|e| Error::io(bin, e))?;
    let map = qnn::map_file(&file, bin)?;
    let info = qnn::read_binary_info(rt, &map, bin)?;
    let ctx: Arc<Context> = Context::from_binary(rt, &map, bin)?;
    drop(map);
    let mut graphs = Vec::new();
    for d in info.graphs {
        for t in d.inputs.iter().chain(&d.outputs) {
            if !qnn::buffer_dtype_supported(t.dtype) {
                return Err(Error::graph(
                    &d.name,
                    format!("{} has a data type the host cannot handle", t.describe()),
                ));
            }
        }
        graphs.push((ctx.graph(&d.name)?, d));
    }
    Ok(graphs)
}

/// What the graphs say about the model: K/V heads, head dim and vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub n_kv: usize,
    pub head_dim: usize,
    pub vocab: usize,
}

/// The checks of [`GenieModel::load`] on graph metadata alone (no QNN handles): group the
/// graphs of every context binary into variants, give each tensor a role, and check the
/// shapes against each other, against the config (`kv-dim`) and against the tokenizer's
/// vocabulary size.
pub fn check_graphs(
    cfg: &Resolved,
    config_path: &Path,
    graphs: Vec<GraphDesc>,
    tokenizer_vocab: usize,
) -> Result<Layout> {
    let variants = group(graphs.into_iter().map(|d| ((), d)).collect())?;
    check_layout(cfg, config_path, &variants, tokenizer_vocab)
}

fn check_layout<G>(
    cfg: &Resolved,
    config_path: &Path,
    variants: &[Variant<G>],
    tokenizer_vocab: usize,
) -> Result<Layout> {
    let Some(v0) = variants.first() else {
        return Err(Error::Manifest {
            path: config_path.to_path_buf(),
            msg: "the context binaries hold no graph".into(),
        });
    };
    let (s, i) = v0.layers[0].value_in;
    let vd = dims4(&v0.splits[s].desc.inputs[i]);
    let (n_kv, head_dim) = (vd[0] * vd[1], vd[3]);
    if let Some(kv) = cfg.kv_dim {
        if kv != head_dim {
            return Err(Error::Manifest {
                path: config_path.to_path_buf(),
                msg: format!(
                    "kv-dim {kv} does not match the head dim {head_dim} of {} in graph {}",
                    v0.splits[s].desc.inputs[i].name, v0.splits[s].desc.name
                ),
            });
        }
    }
    let (ls, li) = v0.logits;
    let ld = dims4(&v0.splits[ls].desc.outputs[li]);
    let vocab = ld[3];
    if tokenizer_vocab > vocab {
        return Err(Error::Tokenizer {
            path: cfg.tokenizer.clone(),
            msg: format!("has {tokenizer_vocab} tokens but the logits have {vocab}"),
        });
    }
    for v in variants {
        check_variant(v, n_kv, head_dim, vocab)?;
    }
    Ok(Layout {
        n_kv,
        head_dim,
        vocab,
    })
}

/// Group graphs into variants by (AR, CL), order splits by name, and resolve roles.
fn group<G>(graphs: Vec<(G, GraphDesc)>) -> Result<Vec<Variant<G>>> {
    let mut keyed: Vec<((usize, usize), G, GraphDesc)> = Vec::new();
    for (g, d) in graphs {
        let k = ar_cl(&d)?;
        keyed.push((k, g, d));
    }
    // Largest AR first (the prompt variant), then CL, then splits by graph name.
    keyed.sort_by(|a, b| (b.0 .0, a.0 .1, &a.2.name).cmp(&(a.0 .0, b.0 .1, &b.2.name)));
    let mut variants: Vec<Variant<G>> = Vec::new();
    for ((ar, cl), graph, desc) in keyed {
        if variants.last().is_none_or(|v| (v.ar, v.cl) != (ar, cl)) {
            variants.push(Variant {
                ar,
                cl,
                past: 0,
                splits: Vec::new(),
                layers: Vec::new(),
                input_ids: (0, 0),
                masks: Vec::new(),
                cos: Vec::new(),
                sin: Vec::new(),
                logits: (0, 0),
                logit_rows: 0,
            });
        }
        let v = variants.last_mut().expect("pushed above");
        v.splits.push(Split {
            graph,
            desc,
            inputs: Vec::new(),
            outputs: Vec::new(),
            links: Vec::new(),
        });
    }
    for v in &mut variants {
        assign_roles(v)?;
    }
    Ok(variants)
}

/// Tokens per step and context length of one graph, as Genie infers them.
fn ar_cl(d: &GraphDesc) -> Result<(usize, usize)> {
    let find = |name: &str| d.inputs.iter().find(|t| t.name == name);
    let mask = find("attention_mask").ok_or_else(|| {
        Error::graph(
            &d.name,
            "no attention_mask input: not a Genie graph qhx can run (Genie needs the mask to know the context length)",
        )
    })?;
    let md = dims4(mask);
    let ar = match find("input_ids") {
        Some(t) => t.elems(),
        None => md[2],
    };
    Ok((ar, md[3]))
}

fn assign_roles<G>(v: &mut Variant<G>) -> Result<()> {
    let n = v.splits.len();
    let mut produced: Vec<(String, usize, usize)> = Vec::new();
    let mut layers: std::collections::BTreeMap<usize, [Option<(usize, usize)>; 4]> =
        Default::default();
    let mut logits = None;
    let mut input_ids = None;
    for s in 0..n {
        let (ins, outs) = {
            let d = &v.splits[s].desc;
            (d.inputs.clone(), d.outputs.clone())
        };
        let mut in_roles = Vec::new();
        let mut links = Vec::new();
        for (i, t) in ins.iter().enumerate() {
            let role = if let Some(&(_, ps, po)) =
                produced.iter().find(|(name, _, _)| *name == t.name)
            {
                links.push((i, ps, po));
                Role::Link
            } else {
                input_role(&t.name).ok_or_else(|| {
                    Error::graph(
                        &v.splits[s].desc.name,
                        format!(
                            "input {} is neither a Genie input (input_ids, attention_mask, position_ids_cos/sin, past_key/value_<L>_in) nor the output of an earlier split",
                            t.describe()
                        ),
                    )
                })?
            };
            match role {
                Role::InputIds => input_ids = Some((s, i)),
                Role::Mask => v.masks.push((s, i)),
                Role::Cos => v.cos.push((s, i)),
                Role::Sin => v.sin.push((s, i)),
                Role::PastKey(l) => layers.entry(l).or_default()[0] = Some((s, i)),
                Role::PastValue(l) => layers.entry(l).or_default()[1] = Some((s, i)),
                _ => {}
            }
            in_roles.push(role);
        }
        let mut out_roles = Vec::new();
        for (o, t) in outs.iter().enumerate() {
            let role = if t.name == "logits" {
                logits = Some((s, o));
                Role::Logits
            } else if let Some(r) = kv_role(&t.name, false) {
                match r {
                    Role::KeyOut(l) => layers.entry(l).or_default()[2] = Some((s, o)),
                    Role::ValueOut(l) => layers.entry(l).or_default()[3] = Some((s, o)),
                    _ => {}
                }
                r
            } else {
                Role::Link
            };
            produced.push((t.name.clone(), s, o));
            out_roles.push(role);
        }
        let sp = &mut v.splits[s];
        sp.inputs = in_roles;
        sp.outputs = out_roles;
        sp.links = links;
    }
    let gname = v.splits[0].desc.name.clone();
    v.input_ids =
        input_ids.ok_or_else(|| Error::graph(&gname, "no input_ids input in any split"))?;
    v.logits = logits.ok_or_else(|| Error::graph(&gname, "no logits output in any split"))?;
    if v.cos.is_empty() || v.sin.is_empty() {
        return Err(Error::graph(
            &gname,
            "no position_ids_cos / position_ids_sin inputs (only rope models are supported)",
        ));
    }
    for (want, (l, slots)) in layers.iter().enumerate() {
        let names = [
            "past_key_in",
            "past_value_in",
            "past_key_out",
            "past_value_out",
        ];
        if *l != want {
            return Err(Error::graph(
                &gname,
                format!("K/V of layer {want} is missing"),
            ));
        }
        for (k, s) in slots.iter().enumerate() {
            if s.is_none() {
                return Err(Error::graph(
                    &gname,
                    format!("layer {l} has no {} tensor", names[k]),
                ));
            }
        }
        let [Some(key_in), Some(value_in), Some(key_out), Some(value_out)] = *slots else {
            unreachable!("every slot checked above")
        };
        // The runner copies a step's new K/V rows into the past inputs within one graph's
        // bindings, so each pair must live in one split.
        for (i, o, what) in [(key_in, key_out, "key"), (value_in, value_out, "value")] {
            if i.0 != o.0 {
                let (gi, go) = (&v.splits[i.0].desc, &v.splits[o.0].desc);
                return Err(Error::graph(
                    &gi.name,
                    format!(
                        "layer {l}: past {what} input {} is in graph {} but its output {} is in graph {} (qhx needs each layer's K/V input and output in one split)",
                        gi.inputs[i.1].name, gi.name, go.outputs[o.1].name, go.name
                    ),
                ));
            }
        }
        v.layers.push(KvAt {
            key_in,
            value_in,
            key_out,
            value_out,
        });
    }
    if v.layers.is_empty() {
        return Err(Error::graph(&gname, "no past_key/past_value tensors"));
    }
    let (s, i) = v.layers[0].value_in;
    v.past = dims4(&v.splits[s].desc.inputs[i])[2];
    let (s, o) = v.logits;
    let ld = dims4(&v.splits[s].desc.outputs[o]);
    v.logit_rows = ld[0] * ld[1] * ld[2];
    Ok(())
}

/// Shapes that every split of a variant must agree on.
fn check_variant<G>(v: &Variant<G>, n_kv: usize, hd: usize, vocab: usize) -> Result<()> {
    let t_in = |(s, i): (usize, usize)| (&v.splits[s].desc, &v.splits[s].desc.inputs[i]);
    let t_out = |(s, o): (usize, usize)| (&v.splits[s].desc, &v.splits[s].desc.outputs[o]);
    let bad = |g: &GraphDesc, t: &TensorDesc, want: String| {
        Err(Error::graph(
            &g.name,
            format!(
                "{} should be {want} for AR={} CL={}",
                t.describe(),
                v.ar,
                v.cl
            ),
        ))
    };
    if v.past + v.ar != v.cl {
        let (g, t) = t_in(v.layers[0].value_in);
        return bad(
            g,
            t,
            format!(
                "[n_kv, 1, CL-AR={}, head_dim] (in-place K/V, past = CL, is not supported)",
                v.cl - v.ar.min(v.cl)
            ),
        );
    }
    for at in &v.layers {
        for (pos, want) in [
            (t_in(at.key_in), [n_kv, hd, v.past]),
            (t_in(at.value_in), [n_kv, v.past, hd]),
            (t_out(at.key_out), [n_kv, hd, v.ar]),
            (t_out(at.value_out), [n_kv, v.ar, hd]),
        ] {
            let d = dims4(pos.1);
            if [d[0] * d[1], d[2], d[3]] != want {
                return bad(pos.0, pos.1, format!("{want:?} (n_kv, rows, cols)"));
            }
        }
    }
    for &m in &v.masks {
        let (g, t) = t_in(m);
        if dims4(t)[2] != v.ar || dims4(t)[3] != v.cl {
            return bad(g, t, format!("[1, 1, {}, {}]", v.ar, v.cl));
        }
    }
    for &c in v.cos.iter().chain(&v.sin) {
        let (g, t) = t_in(c);
        if dims4(t)[2] != v.ar || dims4(t)[3] != hd / 2 {
            return bad(g, t, format!("[1, 1, {}, {}]", v.ar, hd / 2));
        }
    }
    let (g, t) = t_out(v.logits);
    if dims4(t)[3] != vocab || !(v.logit_rows == v.ar || v.logit_rows == 1) {
        return bad(g, t, format!("[1, 1, {} or 1, {vocab}]", v.ar));
    }
    let (g, t) = t_in(v.input_ids);
    if !matches!(t.dtype, qnn_sys::dtype::INT_32 | qnn_sys::dtype::UINT_32) {
        return bad(g, t, "int32".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, dtype: u32, dims: &[u32]) -> TensorDesc {
        TensorDesc {
            id: 0,
            name: name.into(),
            tensor_type: 0,
            dtype,
            dims: dims.to_vec(),
            quant: None,
            raw_quant: Default::default(),
        }
    }

    /// One graph of one layer: AR tokens, context CL, 2 K/V heads of dim 8, vocab 32.
    fn graph(name: &str, ar: u32, cl: u32) -> GraphDesc {
        let f = qnn_sys::dtype::FLOAT_32;
        let past = cl - ar;
        GraphDesc {
            name: name.into(),
            inputs: vec![
                t("input_ids", qnn_sys::dtype::INT_32, &[1, ar]),
                t("attention_mask", f, &[1, 1, ar, cl]),
                t("position_ids_cos", f, &[1, 1, ar, 4]),
                t("position_ids_sin", f, &[1, 1, ar, 4]),
                t("past_key_0_in", f, &[2, 1, 8, past]),
                t("past_value_0_in", f, &[2, 1, past, 8]),
            ],
            outputs: vec![
                t("logits", f, &[1, 1, ar, 32]),
                t("past_key_0_out", f, &[2, 1, 8, ar]),
                t("past_value_0_out", f, &[2, 1, ar, 8]),
            ],
            tensor_version: 1,
        }
    }

    fn config(kv_dim: usize) -> Resolved {
        let v = serde_json::json!({"dialog": {"version": 1, "type": "basic",
            "context": {"version": 1, "size": 64, "n-vocab": 32, "bos-token": 1, "eos-token": 2},
            "tokenizer": {"version": 1, "path": "tokenizer.json"},
            "engine": {"version": 1, "n-threads": 1,
                "backend": {"version": 1, "type": "QnnHtp", "QnnHtp": {"version": 1, "kv-dim": kv_dim}},
                "model": {"version": 1, "type": "binary",
                    "binary": {"version": 1, "ctx-bins": ["a.bin"]}}}}});
        GenieConfig::resolve(
            v.to_string().as_bytes(),
            Path::new("/b/g.json"),
            Path::new("/b"),
        )
        .unwrap()
    }

    #[test]
    fn graph_metadata_is_checked_without_qnn_handles() {
        let p = Path::new("/b/g.json");
        let graphs = vec![graph("ar1_cl64", 1, 64), graph("ar16_cl64", 16, 64)];
        let l = check_graphs(&config(8), p, graphs.clone(), 30).unwrap();
        assert_eq!(
            l,
            Layout {
                n_kv: 2,
                head_dim: 8,
                vocab: 32
            }
        );
        let e = check_graphs(&config(16), p, graphs.clone(), 30).unwrap_err();
        assert!(e.to_string().contains("kv-dim 16"), "{e}");
        let e = check_graphs(&config(8), p, graphs, 33).unwrap_err();
        assert!(e.to_string().contains("33 tokens"), "{e}");
    }

    /// Context binaries without a single graph: an error naming the config, not an index
    /// out of bounds (`load` indexed the first variant unchecked).
    #[test]
    fn no_graph_at_all_is_an_error() {
        let e = check_graphs(&config(8), Path::new("/b/g.json"), Vec::new(), 30).unwrap_err();
        assert!(e.to_string().contains("no graph"), "{e}");
    }

    /// A layer whose K/V input and output sit in different splits: a load error naming both
    /// graphs (the runner copies K/V within one split and panicked on such a bundle).
    #[test]
    fn kv_in_and_out_in_different_splits_is_a_load_error() {
        let f = qnn_sys::dtype::FLOAT_32;
        let mut a = graph("ar4_cl64_1_of_2", 4, 64);
        let k_out = a.outputs.remove(1);
        a.outputs.push(t("hidden", f, &[1, 1, 4, 16]));
        let b = GraphDesc {
            name: "ar4_cl64_2_of_2".into(),
            inputs: vec![
                t("attention_mask", f, &[1, 1, 4, 64]),
                t("hidden", f, &[1, 1, 4, 16]),
            ],
            outputs: vec![k_out],
            tensor_version: 1,
        };
        let e = check_graphs(&config(8), Path::new("/b/g.json"), vec![a, b], 30).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("past_key_0_out"), "{msg}");
        assert!(msg.contains("ar4_cl64_2_of_2"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }

    #[test]
    fn kv_names_follow_genie() {
        assert_eq!(kv_role("past_key_12_in", true), Some(Role::PastKey(12)));
        assert_eq!(kv_role("past_value_0_out", false), Some(Role::ValueOut(0)));
        assert_eq!(
            kv_role("layers_3_past_value_in", true),
            Some(Role::PastValue(3))
        );
        assert_eq!(kv_role("past_key_in", true), None);
        assert_eq!(kv_role("hidden_3_in", true), None);
        assert_eq!(kv_role("past_key_1_in", false), None);
    }
}
