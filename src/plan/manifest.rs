//! qhx manifest bundles into a [`Plan`]: an optional prefill graph (P rows; with past inputs
//! it reads the decode cache in place), an optional verify graph (a few rows over the decode
//! cache, for speculative decoding and short continuations), a one-row decode graph whose
//! past inputs are the cache, and an lm-head graph that maps a hidden row to logits. Tensors are found
//! by role name (`plan.io` may rename them); every shape is checked against the params.

use super::{
    Admit, At, Head, KvTensor, LayerKv, LayerState, MaskSpec, MaskStyle, Pad, Plan, RopeSpec, Sink,
    Source, Split, Step,
};
use crate::bundle::manifest::layers::{LayerType, StateNames};
use crate::bundle::manifest::GraphRole;
use crate::bundle::manifest::{GraphRef, Manifest};
use crate::error::{Error, Result};
use crate::kv::KvShape;
use crate::ops::embed::EmbedTable;
use crate::qnn::{GraphDesc, TensorDesc};

/// The graphs of one rung of a manifest bundle (see [`Manifest::ladder`]).
pub struct RungGraphs<G> {
    pub prefill: Option<(G, GraphDesc)>,
    pub verify: Option<(G, GraphDesc)>,
    pub decode: (G, GraphDesc),
}

/// The graphs of a manifest bundle, picked by role (see `model::pick_graph`): the
/// largest rung's, the smaller rungs' (smallest first) and the lm-head.
pub struct Graphs<G> {
    pub prefill: Option<(G, GraphDesc)>,
    pub verify: Option<(G, GraphDesc)>,
    pub decode: (G, GraphDesc),
    pub ladder: Vec<RungGraphs<G>>,
    pub lmhead: (G, GraphDesc),
    pub verify_head: Option<(G, GraphDesc)>,
}

impl<G> Graphs<G> {
    /// The graph of each role the manifest names, each found by `find` (a loaded graph,
    /// or metadata alone).
    pub fn pick(
        m: &Manifest,
        mut find: impl FnMut(&GraphRef, GraphRole) -> Result<(G, GraphDesc)>,
    ) -> Result<Graphs<G>> {
        let ladder = m
            .ladder
            .iter()
            .map(|r| {
                pick_rung(
                    (r.prefill.as_ref(), r.verify.as_ref(), &r.decode),
                    &mut find,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let top = pick_rung(
            (m.prefill.as_ref(), m.verify.as_ref(), &m.decode),
            &mut find,
        )?;
        Ok(Graphs {
            prefill: top.prefill,
            verify: top.verify,
            decode: top.decode,
            ladder,
            lmhead: find(&m.lmhead, GraphRole::LmHead)?,
            verify_head: m
                .verify_head
                .as_ref()
                .map(|r| find(r, GraphRole::VerifyHead))
                .transpose()?,
        })
    }
}

/// One rung's (prefill, verify, decode) graphs, each found by `find`.
fn pick_rung<G>(
    (prefill, verify, decode): (Option<&GraphRef>, Option<&GraphRef>, &GraphRef),
    find: &mut impl FnMut(&GraphRef, GraphRole) -> Result<(G, GraphDesc)>,
) -> Result<RungGraphs<G>> {
    Ok(RungGraphs {
        prefill: prefill.map(|g| find(g, GraphRole::Prefill)).transpose()?,
        verify: verify.map(|g| find(g, GraphRole::Verify)).transpose()?,
        decode: find(decode, GraphRole::Decode)?,
    })
}

/// One rung's steps, resolved: (prefill, verify, decode).
type RungSteps<G> = (Option<Step<G>>, Option<Step<G>>, Step<G>);

/// Resolve one rung's graphs into steps, checking that its prefill and verify read its
/// decode cache as they must.
fn rung_steps<G>(
    m: &Manifest,
    types: &[LayerType],
    refs: (Option<&GraphRef>, Option<&GraphRef>, &GraphRef),
    g: RungGraphs<G>,
) -> Result<RungSteps<G>> {
    let decode = stack_step(m, types, refs.2, g.decode.0, g.decode.1, Stack::Decode)?;
    if let Some(w) = m.layers.window {
        if w > decode.past {
            return Err(Error::graph(
                decode.name(),
                format!(
                    "layers.sliding_window {w} is larger than the decode cache C={}",
                    decode.past
                ),
            ));
        }
    }
    let prefill = match g.prefill {
        Some((graph, desc)) => {
            let r = refs.0.unwrap_or(refs.2);
            Some(stack_step(m, types, r, graph, desc, Stack::Prefill)?)
        }
        None => None,
    };
    let verify = match g.verify {
        Some((graph, desc)) => {
            let r = refs.1.unwrap_or(refs.2);
            let v = stack_step(m, types, r, graph, desc, Stack::Verify)?;
            if let Some(pre) = &prefill {
                if pre.rows <= v.rows {
                    return Err(Error::graph(
                        v.name(),
                        format!(
                            "a verify graph takes fewer rows than the prefill graph ({} rows), this one {}",
                            pre.rows, v.rows
                        ),
                    ));
                }
            }
            Some(v)
        }
        None => None,
    };
    for st in prefill.iter().chain(&verify) {
        check_prefill_shares_cache(st, &decode)?;
    }
    Ok((prefill, verify, decode))
}

/// Resolve and check a manifest bundle's graphs against its params. Steps are ordered
/// prefills, verifies, decodes, each group by rung (smallest cache first), so the runner's
/// first admitting step is the smallest rung that holds the position.
pub fn resolve<G>(m: &Manifest, g: Graphs<G>, embed: Option<EmbedTable>) -> Result<Plan<G>> {
    for d in g
        .ladder
        .iter()
        .flat_map(|r| r.prefill.iter().chain(&r.verify).chain([&r.decode]))
        .chain(g.prefill.iter())
        .chain(&g.verify)
        .map(|(_, d)| d)
        .chain([&g.decode.1, &g.lmhead.1])
    {
        super::check_dtypes(d)?;
    }
    let p = &m.params;
    let types = layer_types(m, &g.decode.1)?;
    let mut rungs = Vec::new();
    for (r, rg) in m.ladder.iter().zip(g.ladder) {
        let refs = (r.prefill.as_ref(), r.verify.as_ref(), &r.decode);
        rungs.push(rung_steps(m, &types, refs, rg)?);
    }
    let top = RungGraphs {
        prefill: g.prefill,
        verify: g.verify,
        decode: g.decode,
    };
    let refs = (m.prefill.as_ref(), m.verify.as_ref(), &m.decode);
    rungs.push(rung_steps(m, &types, refs, top)?);
    check_ladder(&rungs)?;
    let n = rungs.len();
    let (mut prefills, mut verifies, mut decodes) = (Vec::new(), Vec::new(), Vec::new());
    for (pre, ver, dec) in rungs {
        prefills.extend(pre);
        verifies.extend(ver);
        decodes.push(dec);
    }
    // A prefill without past inputs (an AR=P window from an empty cache) runs first of all.
    prefills.sort_by_key(|s| s.past);
    let mut steps: Vec<Step<G>> = prefills.into_iter().chain(verifies).collect();
    // Steps with past inputs read their rung's decode cache in place.
    let first_decode = steps.len();
    for st in &mut steps {
        if st.has_past() {
            let k = decodes
                .iter()
                .position(|d| d.past == st.past)
                .expect("rung_steps checked each reads its decode cache");
            st.cache_owner = Some(first_decode + k);
        }
    }
    steps.extend(decodes);
    debug_assert_eq!(steps.len() - first_decode, n);
    check_lmhead(m, &g.lmhead.1)?;
    let verify_head = match g.verify_head {
        Some((graph, desc)) => {
            let want = steps
                .iter()
                .filter(|s| s.has_past() && s.rows > 1)
                .map(|s| s.rows)
                .min()
                .unwrap_or(2);
            let (rows, ids) = check_verify_head(m, &desc, want)?;
            Some(super::VerifyHead {
                graph,
                desc,
                rows,
                ids,
            })
        }
        None => None,
    };
    let ctx = steps.last().map_or(0, |s| s.past);
    Ok(Plan {
        verify_head,
        steps,
        head: Some(Head {
            graph: g.lmhead.0,
            desc: g.lmhead.1,
        }),
        n_layers: p.n_layers,
        n_kv: p.n_kv_heads,
        head_dim: p.head_dim,
        vocab: p.vocab,
        ropes: m
            .layers
            .ropes
            .iter()
            .map(|r| RopeSpec {
                theta: r.theta,
                head_dim: p.head_dim,
                scaling: r.scaling.clone(),
            })
            .collect(),
        embed,
        pad_id: 0,
        max_ctx: p.max_ctx.min(ctx),
    })
}

/// A context ladder's rungs: caches strictly growing, one prefill without past inputs at
/// most (it starts from an empty cache whatever the rung), and every rung's decode graph
/// taking the same tensors but for the cache length.
fn check_ladder<G>(rungs: &[RungSteps<G>]) -> Result<()> {
    for w in rungs.windows(2) {
        let (a, b) = (&w[0].2, &w[1].2);
        if a.past >= b.past {
            return Err(Error::graph(
                b.name(),
                format!(
                    "context ladder rungs must grow: its cache holds {} positions, the rung before {}",
                    b.past, a.past
                ),
            ));
        }
        if a.layers.len() != b.layers.len() || a.states.len() != b.states.len() {
            return Err(Error::graph(
                b.name(),
                format!("has other layers than the rung before ({})", a.name()),
            ));
        }
    }
    let windows = rungs
        .iter()
        .filter_map(|r| r.0.as_ref())
        .filter(|p| !p.has_past())
        .count();
    if windows > 1 {
        return Err(Error::graph(
            rungs[0].2.name(),
            "a context ladder has one prefill without past inputs at most (it starts every rung)",
        ));
    }
    if rungs.len() > 1 && rungs.iter().any(|r| !r.2.states.is_empty()) {
        return Err(Error::graph(
            rungs[0].2.name(),
            "a context ladder cannot carry conv layers' state from rung to rung yet",
        ));
    }
    Ok(())
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

/// What a stack graph (transformer layers, hidden rows out) is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stack {
    /// P rows, from an empty cache or (with past inputs) over the decode cache.
    Prefill,
    /// A few rows over the decode cache (past inputs required), any two or more at a time:
    /// a speculative verify, or a short continuation.
    Verify,
    /// One row; its past inputs are the cache.
    Decode,
}

/// Each layer's type: the manifest's `layers.types`, else read off the decode graph (a
/// layer with a conv-state input is a conv layer: the LFM2 contract), else all global
/// attention.
fn layer_types(m: &Manifest, decode: &GraphDesc) -> Result<Vec<LayerType>> {
    let n = m.params.n_layers;
    if let Some(t) = &m.layers.types {
        return Ok(t.clone());
    }
    let has = |name: String| decode.inputs.iter().any(|t| t.name == name);
    let state = &m.layers.conv_state.past;
    if !(0..n).any(|i| has(state.replace("{i}", &i.to_string()))) {
        return Ok(vec![LayerType::Full; n]);
    }
    (0..n)
        .map(|i| {
            let k = m.tensor_name(&m.decode, "past_k", Some(i));
            let c = state.replace("{i}", &i.to_string());
            match (has(k.clone()), has(c.clone())) {
                (true, false) => Ok(LayerType::Full),
                (false, true) => Ok(LayerType::Conv),
                (true, true) => Err(Error::graph(
                    &decode.name,
                    format!("layer {i} has both {k:?} and {c:?}: attention or conv?"),
                )),
                (false, false) => Err(Error::graph(
                    &decode.name,
                    format!(
                        "layer {i} of params.n_layers={n} has neither {k:?} nor {c:?} (the manifest's layer count does not match the graph)"
                    ),
                )),
            }
        })
        .collect()
}

/// A prefill, verify or decode graph as a one-split step.
fn stack_step<G>(
    m: &Manifest,
    types: &[LayerType],
    r: &GraphRef,
    graph: G,
    g: GraphDesc,
    kind: Stack,
) -> Result<Step<G>> {
    let decode = kind == Stack::Decode;
    let p = &m.params;
    let (h, hd, k) = (p.hidden, p.head_dim, m.kv_dim());
    let gn = g.name.as_str();
    // Tensor names by role: the step's own (schema 2), else `plan.io` or the defaults.
    let nm = |role: &str, i: Option<usize>| m.tensor_name(r, role, i);
    let mut inputs = vec![Source::Unfed; g.inputs.len()];
    let mut outputs = vec![Sink::Other; g.outputs.len()];
    let (x, xt) = find(&g.inputs, &nm("x", None), gn, "input")?;
    let rows = xt.elems() / h;
    if rows == 0 || xt.elems() != rows * h {
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
    if kind == Stack::Verify && rows < 2 {
        return Err(Error::graph(
            gn,
            format!(
                "verify input {} must hold two or more rows of hidden={h}",
                xt.describe()
            ),
        ));
    }
    inputs[x] = Source::Embedding;
    // One RoPE pair per table the attention layers use.
    let mut tables: Vec<usize> = types
        .iter()
        .filter(|t| t.is_attention())
        .map(|&t| m.layers.rope_of(t))
        .collect();
    tables.sort_unstable();
    tables.dedup();
    for table in tables {
        let (cn, sn) = if table == 0 {
            (nm("cos", None), nm("sin", None))
        } else {
            let rk = &m.layers.ropes[table];
            (rk.cos.clone(), rk.sin.clone())
        };
        let (cos, ct) = find(&g.inputs, &cn, gn, "input")?;
        let (sin, st) = find(&g.inputs, &sn, gn, "input")?;
        for t in [ct, st] {
            if t.elems() != rows * hd {
                return Err(Error::graph(
                    gn,
                    format!("input {} should be {rows} x head_dim={hd}", t.describe()),
                ));
            }
        }
        inputs[cos] = Source::Cos { width: hd, table };
        inputs[sin] = Source::Sin { width: hd, table };
    }
    let (y, yt) = find(&g.outputs, &nm("y", None), gn, "output")?;
    if yt.elems() != rows * h {
        return Err(Error::graph(
            gn,
            format!("output {} should be {rows} x hidden={h}", yt.describe()),
        ));
    }
    outputs[y] = Sink::Hidden;
    let mut layers = Vec::new();
    let mut states = Vec::new();
    let mut past_rows: Option<usize> = None;
    let kv_at = |t: &TensorDesc, at: At, want_rows: Option<usize>, msg: &dyn Fn() -> String| {
        KvShape::from_dims(&t.dims, p.n_kv_heads, hd)
            .filter(|s| want_rows.map_or(s.rows > 0, |r| s.rows == r))
            .map(|shape| KvTensor { at, shape })
            .ok_or_else(|| Error::graph(gn, msg()))
    };
    let cs = &m.layers.conv_state;
    for (i, &ty) in types.iter().enumerate() {
        // A layer the graph has no tensor of at all: the manifest counts more layers.
        let per_layer = [
            nm("new_k", Some(i)),
            nm("past_k", Some(i)),
            cs.past.replace("{i}", &i.to_string()),
            cs.present.replace("{i}", &i.to_string()),
            cs.seed
                .as_deref()
                .unwrap_or("{i}")
                .replace("{i}", &i.to_string()),
        ];
        if !g
            .inputs
            .iter()
            .chain(&g.outputs)
            .any(|t| per_layer.contains(&t.name))
        {
            return Err(Error::graph(
                gn,
                format!(
                    "has no tensor of layer {i} (e.g. {:?}), but the manifest lists {} layers: the layer list is longer than the graph's layers",
                    per_layer[0],
                    types.len()
                ),
            ));
        }
        if ty == LayerType::Conv {
            states.push(state_io(
                &g,
                cs,
                i,
                rows,
                h,
                kind,
                &mut inputs,
                &mut outputs,
            )?);
            continue;
        }
        let (nk, nkt) = find(&g.outputs, &nm("new_k", Some(i)), gn, "output")?;
        let (nv, nvt) = find(&g.outputs, &nm("new_v", Some(i)), gn, "output")?;
        let new_msg =
            |t: &TensorDesc| format!("output {} should hold {rows} rows of K={k}", t.describe());
        let new_key = kv_at(nkt, (0, nk), Some(rows), &|| new_msg(nkt))?;
        let new_value = kv_at(nvt, (0, nv), Some(rows), &|| new_msg(nvt))?;
        outputs[nk] = Sink::NewKey(i);
        outputs[nv] = Sink::NewValue(i);
        let has_past = g.inputs.iter().any(|t| t.name == nm("past_k", Some(i)));
        let (mut past_key, mut past_value) = (None, None);
        if has_past || kind != Stack::Prefill {
            let (pk, pkt) = find(&g.inputs, &nm("past_k", Some(i)), gn, "input")?;
            let (pv, pvt) = find(&g.inputs, &nm("past_v", Some(i)), gn, "input")?;
            for (t, at, slot) in [(pkt, pk, &mut past_key), (pvt, pv, &mut past_value)] {
                let kt = kv_at(t, (0, at), None, &|| {
                    format!(
                        "input {} should be [C, K={k}] or [n_kv, C, head_dim]",
                        t.describe()
                    )
                })?;
                if let Some(prev) = past_rows {
                    if prev != kt.shape.rows {
                        return Err(Error::graph(
                            gn,
                            format!(
                                "input {} disagrees on the cache length C={prev}",
                                t.describe()
                            ),
                        ));
                    }
                }
                past_rows = Some(kt.shape.rows);
                *slot = Some(kt);
            }
            inputs[pk] = Source::PastKey(i);
            inputs[pv] = Source::PastValue(i);
        }
        layers.push(LayerKv {
            past_key,
            past_value,
            new_key,
            new_value,
        });
    }
    // A graph with more layers than the manifest says would run with unfed caches.
    let n = p.n_layers;
    for extra in [
        nm("new_k", Some(n)),
        nm("past_k", Some(n)),
        cs.past.replace("{i}", &n.to_string()),
    ] {
        if g.inputs.iter().chain(&g.outputs).any(|t| t.name == extra) {
            return Err(Error::graph(
                gn,
                format!(
                    "has tensor {extra:?}, a layer beyond params.n_layers={n} (the manifest's layer count does not match the graph)"
                ),
            ));
        }
    }
    if !states.is_empty() && past_rows.is_some() && kind != Stack::Decode {
        return Err(Error::graph(
            gn,
            "reads the cache, but conv layers' state has no rows to roll back or seed from a chunk: models with recurrent layers run prefill from an empty cache and decode only",
        ));
    }
    let ctx = past_rows.unwrap_or(0);
    let want_mask = if decode {
        ctx
    } else if ctx > 0 {
        rows * (ctx + rows)
    } else {
        rows * rows
    };
    // One mask per attention type: `cmask` for global layers, its own for sliding ones.
    let mut mask_types: Vec<LayerType> =
        types.iter().copied().filter(|t| t.is_attention()).collect();
    mask_types.sort_unstable();
    mask_types.dedup();
    for ty in mask_types {
        let name = match (ty, m.layers.mask_of(ty)) {
            (_, Some(n)) => n.to_string(),
            (LayerType::Sliding, None) => "cmask_local".to_string(),
            _ => nm("cmask", None),
        };
        let (mask, mt) = find(&g.inputs, &name, gn, "input")?;
        if mt.elems() != want_mask {
            return Err(Error::graph(
                gn,
                format!("input {} should have {want_mask} elements", mt.describe()),
            ));
        }
        if inputs[mask] != Source::Unfed {
            return Err(Error::graph(
                gn,
                format!("input {name:?} is given two roles (a mask shared by two layer types?)"),
            ));
        }
        inputs[mask] = Source::Mask(MaskSpec {
            past: ctx,
            own: !decode,
            style: MaskStyle::Additive,
            persistent: decode,
            window: (ty == LayerType::Sliding)
                .then_some(m.layers.window)
                .flatten(),
        });
    }
    let admit = match kind {
        // Any two tokens or more, padded: the drafts of a verify vary in number.
        Stack::Verify => Admit::Chunk { min_tokens: 2 },
        _ if decode || ctx > 0 => Admit::WholeRows,
        _ => Admit::FromEmpty,
    };
    if kind == Stack::Verify && !states.is_empty() {
        return Err(Error::graph(
            gn,
            "a verify graph cannot run a model with conv layers: their state cannot be rolled back to a rejected draft",
        ));
    }
    Ok(Step {
        rows,
        past: ctx,
        pad: Pad::Right,
        admit,
        cache_owner: None,
        splits: vec![Split {
            graph,
            desc: g,
            inputs,
            outputs,
        }],
        layers,
        states,
    })
}

/// A conv layer's state tensors in one step: decode reads `past` and writes `present`
/// ([channels, width] each, same dtype); a prefill writes the `seed` rows.
#[allow(clippy::too_many_arguments)]
fn state_io(
    g: &GraphDesc,
    cs: &StateNames,
    i: usize,
    rows: usize,
    h: usize,
    kind: Stack,
    inputs: &mut [Source],
    outputs: &mut [Sink],
) -> Result<LayerState> {
    let gn = g.name.as_str();
    let name = |p: &str| p.replace("{i}", &i.to_string());
    let mut st = LayerState {
        layer: i,
        past: None,
        present: None,
        seed: None,
        width: cs.width,
        channels: h,
    };
    if kind == Stack::Decode {
        let (a, at) = find(&g.inputs, &name(&cs.past), gn, "input")?;
        let (b, bt) = find(&g.outputs, &name(&cs.present), gn, "output")?;
        for t in [at, bt] {
            if t.elems() != h * cs.width {
                return Err(Error::graph(
                    gn,
                    format!(
                        "state tensor {} should hold hidden={h} x width={}",
                        t.describe(),
                        cs.width
                    ),
                ));
            }
        }
        if at.dtype != bt.dtype || at.quant != bt.quant {
            return Err(Error::graph(
                gn,
                format!(
                    "state {} and {} differ in dtype or quantization: the state is carried as it is",
                    bt.describe(),
                    at.describe()
                ),
            ));
        }
        inputs[a] = Source::StatePast(i);
        outputs[b] = Sink::StatePresent(i);
        st.past = Some((0, a));
        st.present = Some((0, b));
    } else {
        let Some(seed) = &cs.seed else {
            return Err(Error::graph(
                gn,
                format!("conv layer {i} has no seed tensor (layers.state.conv.seed) to start its state from"),
            ));
        };
        let (sd, t) = find(&g.outputs, &name(seed), gn, "output")?;
        if t.elems() < rows * h || t.elems() % rows != 0 {
            return Err(Error::graph(
                gn,
                format!(
                    "state seed {} should hold {rows} rows of at least hidden={h}",
                    t.describe()
                ),
            ));
        }
        outputs[sd] = Sink::StateSeed(i);
        st.seed = Some((0, sd));
    }
    Ok(st)
}

/// A verify head maps K hidden rows to K x vocab logits or K argmax ids (int32), K at least
/// the verify step's rows. Returns (K, ids).
fn check_verify_head(m: &Manifest, d: &GraphDesc, verify_rows: usize) -> Result<(usize, bool)> {
    let bad = |msg: String| Err(Error::graph(&d.name, msg));
    if d.inputs.len() != 1 || d.outputs.len() != 1 {
        return bad(format!(
            "a verify head has one input and one output, this one has {} and {}",
            d.inputs.len(),
            d.outputs.len()
        ));
    }
    let (x, y) = (&d.inputs[0], &d.outputs[0]);
    let h = m.params.hidden;
    if x.elems() % h != 0 || x.elems() < h * verify_rows {
        return bad(format!(
            "input {} should hold K >= {verify_rows} (the verify rows) hidden={h} rows",
            x.describe()
        ));
    }
    let rows = x.elems() / h;
    let ids = y.dtype == qnn_sys::dtype::INT_32;
    let want = if ids { rows } else { rows * m.params.vocab };
    if y.elems() != want {
        return bad(format!(
            "output {} should hold {}",
            y.describe(),
            if ids {
                format!("{rows} argmax ids (int32)")
            } else {
                format!("{rows} x vocab={} logits", m.params.vocab)
            }
        ));
    }
    Ok((rows, ids))
}

/// An lm-head maps one hidden state to vocab logits.
fn check_lmhead(m: &Manifest, d: &GraphDesc) -> Result<()> {
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
    // Schema 2 names the head's tensors; schema 1 takes its one input and output as they are.
    for (role, t, side) in [("x", &d.inputs[0], "input"), ("y", &d.outputs[0], "output")] {
        if let Some(want) = m.lmhead.io.get(role) {
            if &t.name != want {
                return Err(Error::graph(
                    &d.name,
                    format!(
                        "{side} is {}, but the manifest's plan.steps names it {want:?}",
                        t.describe()
                    ),
                ));
            }
        }
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
    Ok(())
}

/// A chunked prefill or a verify reads the decode cache in place: same capacity, layout,
/// dtype and scale.
fn check_prefill_shares_cache<G>(pre: &Step<G>, dec: &Step<G>) -> Result<()> {
    let name = pre.name().to_string();
    if pre.past > 0 && pre.past != dec.past {
        return Err(Error::graph(
            &name,
            format!(
                "past inputs hold {} positions but the decode cache holds {}",
                pre.past, dec.past
            ),
        ));
    }
    for (lp, ld) in pre.layers.iter().zip(&dec.layers) {
        let pairs = [(lp.past_key, ld.past_key), (lp.past_value, ld.past_value)];
        for (a, b) in pairs {
            let (Some(a), Some(b)) = (a, b) else { continue };
            let (ta, tb) = (pre.input_desc(a.at), dec.input_desc(b.at));
            if ta.dims != tb.dims || ta.dtype != tb.dtype || ta.quant != tb.quant {
                return Err(Error::graph(
                    &name,
                    format!(
                        "input {} must match the decode cache {} (dims, dtype and quantization) to share it",
                        ta.describe(),
                        tb.describe()
                    ),
                ));
            }
        }
    }
    Ok(())
}
