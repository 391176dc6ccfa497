//! Schema 2's `plan.steps`: the bundle's graphs written as the plan the runtime resolves
//! them into. Each step names its binary and graph and says, per graph tensor, which plan
//! source feeds it or which sink takes it; no tensor is found by a naming convention.
//! Resolved here into the same [`GraphRef`]s a schema 1 manifest gives (with each
//! tensor's name per role), so one resolver, `plan::manifest`, checks both.

use super::GraphRef;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One `plan.steps[]` entry as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStep {
    /// `prefill`, `verify`, `decode` or `head`.
    pub role: String,
    pub bin: String,
    #[serde(default)]
    pub graph: Option<String>,
    /// Tensor name → source kind.
    pub inputs: BTreeMap<String, String>,
    /// Tensor name → sink kind.
    pub outputs: BTreeMap<String, String>,
}

/// Plan sources a stack step (prefill, decode) reads, with the schema 1 role name each
/// maps to and whether it is per layer (its tensor name then holds `{i}`).
const STACK_SOURCES: &[(&str, &str, bool)] = &[
    ("embedding", "x", false),
    ("rope_cos", "cos", false),
    ("rope_sin", "sin", false),
    ("mask", "cmask", false),
    ("past_key", "past_k", true),
    ("past_value", "past_v", true),
];
const STACK_SINKS: &[(&str, &str, bool)] = &[
    ("hidden", "y", false),
    ("new_key", "new_k", true),
    ("new_value", "new_v", true),
];
const HEAD_SOURCES: &[(&str, &str, bool)] = &[("hidden", "x", false)];
const HEAD_SINKS: &[(&str, &str, bool)] = &[("logits", "y", false)];
/// A verify head gives each row's logits, or (computed in the graph) each row's argmax.
const VERIFY_HEAD_SINKS: &[(&str, &str, bool)] =
    &[("logits", "y", false), ("argmax", "ids", false)];

/// Kinds the plan describes but this version does not feed on manifest bundles yet (a
/// bundle using one is refused by name, not as a typo).
const NOT_YET: &[&str] = &[
    "token_ids",
    "position_ids",
    "conv_state",
    "new_conv_state",
    "sliding_mask",
];

/// The graphs of one context rung: a decode graph with the prefill and verify graphs over
/// the same cache capacity (each optional).
#[derive(Debug, Clone)]
pub struct Rung {
    pub prefill: Option<GraphRef>,
    pub verify: Option<GraphRef>,
    pub decode: GraphRef,
}

/// The graphs of `plan.steps`: the largest rung's prefill and verify (each optional) and
/// decode, the smaller rungs of a context ladder (ascending), and the head.
pub struct Steps {
    pub prefill: Option<GraphRef>,
    pub verify: Option<GraphRef>,
    pub decode: GraphRef,
    pub ladder: Vec<Rung>,
    pub head: GraphRef,
    /// The verify head (a last `verify_head` step), when the bundle has one.
    pub verify_head: Option<GraphRef>,
}

/// Indices of one rung's (prefill, verify, decode) steps.
type RungAt = (Option<usize>, Option<usize>, usize);

/// Split the roles into rungs, each `[prefill,] [verify,] decode`, then `head`.
fn rung_groups(roles: &[&str]) -> Option<Vec<RungAt>> {
    let (last, body) = roles.split_last()?;
    if *last != "head" {
        return None;
    }
    let mut groups = Vec::new();
    let (mut pre, mut ver) = (None, None);
    for (k, r) in body.iter().enumerate() {
        match *r {
            "prefill" if pre.is_none() && ver.is_none() => pre = Some(k),
            "verify" if ver.is_none() => ver = Some(k),
            "decode" => groups.push((pre.take(), ver.take(), k)),
            _ => return None,
        }
    }
    (pre.is_none() && ver.is_none() && !groups.is_empty()).then_some(groups)
}

/// Check `steps` and turn them into graph references; `bin` resolves a file name (with
/// the JSON path for its error).
pub fn resolve(
    steps: &[RawStep],
    bin: &dyn Fn(&str, &str) -> Result<PathBuf, String>,
) -> Result<Steps, String> {
    let mut roles: Vec<&str> = steps.iter().map(|s| s.role.as_str()).collect();
    let has_vhead = roles.last() == Some(&"verify_head");
    if has_vhead {
        roles.pop();
    }
    let Some(groups) = rung_groups(&roles) else {
        return Err(format!(
            "plan.steps: roles are {roles:?}; schema_version 2 takes one or more rungs of [\"prefill\",] [\"verify\",] \"decode\" (a context ladder, smallest first), then \"head\" [, \"verify_head\"]"
        ));
    };
    let mut refs = Vec::new();
    for (k, s) in steps.iter().enumerate() {
        let at = format!("plan.steps[{k}]");
        let (srcs, sinks) = if s.role == "head" {
            (HEAD_SOURCES, HEAD_SINKS)
        } else if s.role == "verify_head" {
            (HEAD_SOURCES, VERIFY_HEAD_SINKS)
        } else {
            (STACK_SOURCES, STACK_SINKS)
        };
        let mut io = BTreeMap::new();
        io_map(&s.inputs, srcs, &format!("{at}.inputs"), &mut io)?;
        io_map(&s.outputs, sinks, &format!("{at}.outputs"), &mut io)?;
        // A prefill may start from an empty cache (no past inputs); everything else is
        // required.
        let optional: &[&str] = if s.role == "prefill" {
            &["past_k", "past_v"]
        } else {
            &[]
        };
        // A verify head has one of its sinks: logits or argmax ids.
        let one_of: &[&str] = if s.role == "verify_head" {
            if io.contains_key("y") == io.contains_key("ids") {
                return Err(format!(
                    "{at}.outputs: a verify head gives either \"logits\" or \"argmax\""
                ));
            }
            &["y", "ids"]
        } else {
            &[]
        };
        for (kind, role, _) in srcs.iter().chain(sinks) {
            if !io.contains_key(*role) && !optional.contains(role) && !one_of.contains(role) {
                let side = if srcs.iter().any(|(k, _, _)| k == kind) {
                    "inputs"
                } else {
                    "outputs"
                };
                return Err(format!("{at}.{side}: no tensor is given the {kind:?} kind"));
            }
        }
        if io.contains_key("past_k") != io.contains_key("past_v") {
            return Err(format!(
                "{at}.inputs: \"past_key\" and \"past_value\" come together"
            ));
        }
        refs.push(Some(GraphRef {
            bin: bin(&s.bin, &format!("{at}.bin"))?,
            graph: s.graph.clone(),
            io,
        }));
    }
    let mut take = |k: usize| refs[k].take().expect("each step is taken once");
    let verify_head = has_vhead.then(|| take(steps.len() - 1));
    let head = take(roles.len() - 1);
    let mut ladder: Vec<Rung> = groups
        .into_iter()
        .map(|(p, v, d)| Rung {
            prefill: p.map(&mut take),
            verify: v.map(&mut take),
            decode: take(d),
        })
        .collect();
    let top = ladder.pop().expect("at least one rung, checked above");
    if verify_head.is_some() && top.verify.is_none() {
        return Err(
            "plan.steps: a \"verify_head\" step needs a \"verify\" step on the largest rung".into(),
        );
    }
    Ok(Steps {
        verify_head,
        prefill: top.prefill,
        verify: top.verify,
        decode: top.decode,
        ladder,
        head,
    })
}

/// Tensor name → kind, as role → tensor name pattern, checking each kind is known, given
/// once, and per layer exactly when its name holds `{i}`.
fn io_map(
    given: &BTreeMap<String, String>,
    table: &[(&str, &str, bool)],
    at: &str,
    io: &mut BTreeMap<String, String>,
) -> Result<(), String> {
    for (name, kind) in given {
        let Some(&(_, role, layered)) = table.iter().find(|(k, _, _)| k == kind) else {
            let known: Vec<&str> = table.iter().map(|(k, _, _)| *k).collect();
            return Err(if NOT_YET.contains(&kind.as_str()) {
                format!(
                    "{at}.{name}: {kind:?} is a plan kind this qhx does not feed on manifest bundles yet (it runs {known:?})"
                )
            } else {
                format!("{at}.{name}: {kind:?} is not one of {known:?}")
            });
        };
        if name.contains("{i}") != layered {
            return Err(if layered {
                format!("{at}.{name}: a {kind:?} tensor is per layer; its name needs `{{i}}` where the layer number goes")
            } else {
                format!("{at}.{name}: a {kind:?} tensor is not per layer; `{{i}}` has no meaning in its name")
            });
        }
        if io.insert(role.to_string(), name.clone()).is_some() {
            return Err(format!("{at}: two tensors are given the {kind:?} kind"));
        }
    }
    Ok(())
}
