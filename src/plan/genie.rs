//! Genie bundles into a [`Plan`]: the graphs of every context binary grouped as Genie groups
//! them (variants by tokens-per-step AR and context CL, splits of one variant by sorted
//! graph name), every tensor given a source or sink by Genie's naming rules, and the shapes
//! checked against each other, the config (`kv-dim`) and the tokenizer.
//!
//! Each variant is a step whose past inputs are a cache of their own ("SMART_MASK": past
//! rows left-aligned, the step's new rows appended at slot n_past), fed left-padded so the
//! last real token is always the last row; its mask covers CL-AR past slots then its own AR
//! columns.

use super::{
    dims4, Admit, At, KvTensor, LayerKv, MaskSpec, MaskStyle, Pad, Plan, RopeSpec, Sink, Source,
    Split, Step,
};
use crate::bundle::genie::Resolved;
use crate::error::{Error, Result};
use crate::kv::{KvLayout, KvShape};
use crate::qnn::{GraphDesc, TensorDesc};
use std::collections::BTreeMap;
use std::path::Path;

/// What the graphs say about the model: K/V heads, head dim and vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub n_kv: usize,
    pub head_dim: usize,
    pub vocab: usize,
}

/// A K/V tensor name: it contains `key` or `value` and ends `_in` / `_out`; the layer is
/// the last number in it (`past_key_12_in` -> 12). Returns (is_key, layer).
pub fn kv_name(name: &str, input: bool) -> Option<(bool, usize)> {
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
    Some((is_key, layer))
}

/// The source of a Genie input named `name` (K/V widths and the mask geometry are filled
/// in once the variant's shapes are known).
pub(crate) fn input_source(name: &str) -> Option<Source> {
    let masked = MaskSpec {
        past: 0,
        own: true,
        style: MaskStyle::Genie,
        persistent: false,
        window: None,
    };
    match name {
        "input_ids" => Some(Source::TokenIds),
        "attention_mask" => Some(Source::Mask(masked)),
        "position_ids_cos" => Some(Source::Cos { width: 0, table: 0 }),
        "position_ids_sin" => Some(Source::Sin { width: 0, table: 0 }),
        _ => kv_name(name, true).map(|(key, l)| {
            if key {
                Source::PastKey(l)
            } else {
                Source::PastValue(l)
            }
        }),
    }
}

/// Resolve the graphs of a Genie bundle (any order) into a plan, with every check of
/// `genie::load` that needs only metadata.
pub fn resolve<G>(
    cfg: &Resolved,
    config_path: &Path,
    graphs: Vec<(G, GraphDesc)>,
    tokenizer_vocab: usize,
) -> Result<(Plan<G>, Layout)> {
    for (_, d) in &graphs {
        super::check_dtypes(d)?;
    }
    let mut steps = group(graphs)?;
    let layout = check_layout(cfg, config_path, &steps, tokenizer_vocab)?;
    let last = steps.len() - 1;
    for (k, s) in steps.iter_mut().enumerate() {
        finish_step(s, &layout, k == last)?;
    }
    let max_ctx = steps[last].past.min(cfg.ctx_size);
    let n_layers = steps[0].layers.len();
    let plan = Plan {
        verify_head: None,
        steps,
        head: None,
        n_layers,
        n_kv: layout.n_kv,
        head_dim: layout.head_dim,
        vocab: layout.vocab,
        ropes: vec![RopeSpec {
            theta: cfg.rope_theta,
            head_dim: layout.head_dim,
            scaling: cfg.rope_scaling.clone(),
        }],
        embed: None,
        pad_id: cfg.pad.or(cfg.eos.first().copied()).unwrap_or(0),
        max_ctx,
    };
    Ok((plan, layout))
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

/// Group graphs into steps by (AR, CL), largest AR first, splits by graph name, and
/// resolve every tensor's role.
fn group<G>(graphs: Vec<(G, GraphDesc)>) -> Result<Vec<Step<G>>> {
    let mut keyed: Vec<((usize, usize), G, GraphDesc)> = Vec::new();
    for (g, d) in graphs {
        let k = ar_cl(&d)?;
        keyed.push((k, g, d));
    }
    // Largest AR first (the prompt variant), then CL, then splits by graph name.
    keyed.sort_by(|a, b| (b.0 .0, a.0 .1, &a.2.name).cmp(&(a.0 .0, b.0 .1, &b.2.name)));
    let mut steps: Vec<(usize, usize, Step<G>)> = Vec::new();
    for ((ar, cl), graph, desc) in keyed {
        if steps.last().is_none_or(|(a, c, _)| (*a, *c) != (ar, cl)) {
            steps.push((
                ar,
                cl,
                Step {
                    rows: ar,
                    past: 0,
                    pad: Pad::Left,
                    admit: Admit::Chunk { min_tokens: 1 },
                    cache_owner: None,
                    splits: Vec::new(),
                    layers: Vec::new(),
                    states: Vec::new(),
                },
            ));
        }
        let (.., s) = steps.last_mut().expect("pushed above");
        s.splits.push(Split {
            graph,
            desc,
            inputs: Vec::new(),
            outputs: Vec::new(),
        });
    }
    let mut out = Vec::new();
    for (_, cl, mut s) in steps {
        assign_roles(&mut s, cl)?;
        out.push(s);
    }
    Ok(out)
}

fn assign_roles<G>(v: &mut Step<G>, cl: usize) -> Result<()> {
    let n = v.splits.len();
    let mut produced: Vec<(String, usize, usize)> = Vec::new();
    let mut layers: BTreeMap<usize, [Option<At>; 4]> = Default::default();
    let (mut logits, mut input_ids, mut cos, mut sin) = (false, false, false, false);
    for s in 0..n {
        let (ins, outs) = {
            let d = &v.splits[s].desc;
            (d.inputs.clone(), d.outputs.clone())
        };
        let mut sources = Vec::new();
        for (i, t) in ins.iter().enumerate() {
            let src = if let Some(&(_, ps, po)) =
                produced.iter().find(|(name, _, _)| *name == t.name)
            {
                Source::Link {
                    split: ps,
                    output: po,
                }
            } else {
                input_source(&t.name).ok_or_else(|| {
                    Error::graph(
                        &v.splits[s].desc.name,
                        format!(
                            "input {} is neither a Genie input (input_ids, attention_mask, position_ids_cos/sin, past_key/value_<L>_in) nor the output of an earlier split",
                            t.describe()
                        ),
                    )
                })?
            };
            match src {
                Source::TokenIds => input_ids = true,
                Source::Cos { .. } => cos = true,
                Source::Sin { .. } => sin = true,
                Source::PastKey(l) => layers.entry(l).or_default()[0] = Some((s, i)),
                Source::PastValue(l) => layers.entry(l).or_default()[1] = Some((s, i)),
                _ => {}
            }
            sources.push(src);
        }
        let mut sinks = Vec::new();
        for (o, t) in outs.iter().enumerate() {
            let sink = if t.name == "logits" {
                logits = true;
                Sink::Logits { rows: 0 }
            } else {
                match kv_name(&t.name, false) {
                    Some((true, l)) => {
                        layers.entry(l).or_default()[2] = Some((s, o));
                        Sink::NewKey(l)
                    }
                    Some((false, l)) => {
                        layers.entry(l).or_default()[3] = Some((s, o));
                        Sink::NewValue(l)
                    }
                    None => Sink::Other,
                }
            };
            produced.push((t.name.clone(), s, o));
            sinks.push(sink);
        }
        v.splits[s].inputs = sources;
        v.splits[s].outputs = sinks;
    }
    let gname = v.splits[0].desc.name.clone();
    if !input_ids {
        return Err(Error::graph(&gname, "no input_ids input in any split"));
    }
    if !logits {
        return Err(Error::graph(&gname, "no logits output in any split"));
    }
    if !cos || !sin {
        return Err(Error::graph(
            &gname,
            "no position_ids_cos / position_ids_sin inputs (only rope models are supported)",
        ));
    }
    let names = [
        "past_key_in",
        "past_value_in",
        "past_key_out",
        "past_value_out",
    ];
    for (want, (l, slots)) in layers.iter().enumerate() {
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
        // Genie keeps each layer's K/V input and output in one split; a bundle that does
        // not is not one Genie built, and is refused by name.
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
        // Shapes are filled in by `finish_step` once the layout is known.
        let shape = KvShape {
            layout: KvLayout::HeadMajor,
            rows: 0,
            n_kv: 0,
            head_dim: 0,
        };
        let t = |at| KvTensor { at, shape };
        v.layers.push(LayerKv {
            past_key: Some(t(key_in)),
            past_value: Some(t(value_in)),
            new_key: t(key_out),
            new_value: t(value_out),
        });
    }
    if v.layers.is_empty() {
        return Err(Error::graph(&gname, "no past_key/past_value tensors"));
    }
    let vi = v.layers[0].past_value.expect("set above").at;
    v.past = dims4(v.input_desc(vi))[2];
    // The step's own columns follow the past ones; `check_step` holds CL = past + AR.
    let _ = cl;
    Ok(())
}

/// Rows of the logits output (AR, or 1 for the last token only).
fn logit_rows<G>(v: &Step<G>) -> (At, usize) {
    let (at, _) = v.result().expect("assign_roles found a logits output");
    let ld = dims4(v.output_desc(at));
    (at, ld[0] * ld[1] * ld[2])
}

fn check_layout<G>(
    cfg: &Resolved,
    config_path: &Path,
    steps: &[Step<G>],
    tokenizer_vocab: usize,
) -> Result<Layout> {
    let Some(v0) = steps.first() else {
        return Err(Error::Manifest {
            path: config_path.to_path_buf(),
            msg: "the context binaries hold no graph".into(),
        });
    };
    let vi = v0.layers[0].past_value.expect("set by assign_roles").at;
    let vt = v0.input_desc(vi);
    let vd = dims4(vt);
    let (n_kv, head_dim) = (vd[0] * vd[1], vd[3]);
    if let Some(kv) = cfg.kv_dim {
        if kv != head_dim {
            return Err(Error::Manifest {
                path: config_path.to_path_buf(),
                msg: format!(
                    "kv-dim {kv} does not match the head dim {head_dim} of {} in graph {}",
                    vt.name, v0.splits[vi.0].desc.name
                ),
            });
        }
    }
    let (lat, _) = logit_rows(v0);
    let vocab = dims4(v0.output_desc(lat))[3];
    if tokenizer_vocab > vocab {
        return Err(Error::Tokenizer {
            path: cfg.tokenizer.clone(),
            msg: format!("has {tokenizer_vocab} tokens but the logits have {vocab}"),
        });
    }
    for v in steps {
        check_step(v, n_kv, head_dim, vocab)?;
    }
    Ok(Layout {
        n_kv,
        head_dim,
        vocab,
    })
}

/// CL of a step: the mask's last dim.
fn cl_of<G>(v: &Step<G>) -> usize {
    v.inputs_where(|s| matches!(s, Source::Mask(_)))
        .first()
        .map_or(v.rows + v.past, |&at| dims4(v.input_desc(at))[3])
}

/// Shapes that every split of a step must agree on.
fn check_step<G>(v: &Step<G>, n_kv: usize, hd: usize, vocab: usize) -> Result<()> {
    let (ar, cl) = (v.rows, cl_of(v));
    let bad = |g: &GraphDesc, t: &TensorDesc, want: String| {
        Err(Error::graph(
            &g.name,
            format!("{} should be {want} for AR={ar} CL={cl}", t.describe()),
        ))
    };
    let t_in = |at: At| (&v.splits[at.0].desc, v.input_desc(at));
    let t_out = |at: At| (&v.splits[at.0].desc, v.output_desc(at));
    if v.past + ar != cl {
        let (g, t) = t_in(v.layers[0].past_value.expect("set by assign_roles").at);
        return bad(
            g,
            t,
            format!(
                "[n_kv, 1, CL-AR={}, head_dim] (in-place K/V, past = CL, is not supported)",
                cl - ar.min(cl)
            ),
        );
    }
    for l in &v.layers {
        let (pk, pv) = (
            l.past_key.expect("set by assign_roles"),
            l.past_value.expect("set by assign_roles"),
        );
        for (pos, want) in [
            (t_in(pk.at), [n_kv, hd, v.past]),
            (t_in(pv.at), [n_kv, v.past, hd]),
            (t_out(l.new_key.at), [n_kv, hd, ar]),
            (t_out(l.new_value.at), [n_kv, ar, hd]),
        ] {
            let d = dims4(pos.1);
            if [d[0] * d[1], d[2], d[3]] != want {
                return bad(pos.0, pos.1, format!("{want:?} (n_kv, rows, cols)"));
            }
        }
    }
    for at in v.inputs_where(|s| matches!(s, Source::Mask(_))) {
        let (g, t) = t_in(at);
        if dims4(t)[2] != ar || dims4(t)[3] != cl {
            return bad(g, t, format!("[1, 1, {ar}, {cl}]"));
        }
    }
    for at in v.inputs_where(|s| matches!(s, Source::Cos { .. } | Source::Sin { .. })) {
        let (g, t) = t_in(at);
        if dims4(t)[2] != ar || dims4(t)[3] != hd / 2 {
            return bad(g, t, format!("[1, 1, {ar}, {}]", hd / 2));
        }
    }
    let (lat, rows) = logit_rows(v);
    let (g, t) = t_out(lat);
    if dims4(t)[3] != vocab || !(rows == ar || rows == 1) {
        return bad(g, t, format!("[1, 1, {ar} or 1, {vocab}]"));
    }
    for at in v.inputs_where(|s| matches!(s, Source::TokenIds)) {
        let (g, t) = t_in(at);
        if !matches!(t.dtype, qnn_sys::dtype::INT_32 | qnn_sys::dtype::UINT_32) {
            return bad(g, t, "int32".into());
        }
    }
    Ok(())
}

/// Fill in what needs the layout: K/V shapes (keys transposed), RoPE widths, the mask's
/// past columns, the logits rows, and when the step may run.
fn finish_step<G>(v: &mut Step<G>, l: &Layout, last: bool) -> Result<()> {
    let (lat, rows) = logit_rows(v);
    let past = v.past;
    let ar = v.rows;
    let shape = |layout, rows| KvShape {
        layout,
        rows,
        n_kv: l.n_kv,
        head_dim: l.head_dim,
    };
    for kv in &mut v.layers {
        for (t, layout, r) in [
            (kv.past_key.as_mut(), KvLayout::DimMajor, past),
            (kv.past_value.as_mut(), KvLayout::HeadMajor, past),
            (Some(&mut kv.new_key), KvLayout::DimMajor, ar),
            (Some(&mut kv.new_value), KvLayout::HeadMajor, ar),
        ] {
            if let Some(t) = t {
                t.shape = shape(layout, r);
            }
        }
    }
    let half = l.head_dim / 2;
    for sp in &mut v.splits {
        for src in &mut sp.inputs {
            match src {
                Source::Cos { width, .. } | Source::Sin { width, .. } => *width = half,
                Source::Mask(m) => m.past = past,
                _ => {}
            }
        }
    }
    v.splits[lat.0].outputs[lat.1] = Sink::Logits { rows };
    // A multi-row step takes chunks of two tokens or more; one token goes to the smallest.
    v.admit = Admit::Chunk {
        min_tokens: if last { 1 } else { 2 },
    };
    Ok(())
}
