//! The manifest's optional `layers` section: what each layer needs from the host when the
//! layers are not all alike. A layer is `full_attention` (the default: every cached
//! position, the global RoPE table, `cmask`), `sliding_attention` (a window of positions,
//! with its own RoPE table and mask input) or `conv` (LFM2's short convolution: no K/V, a
//! recurrent state the host carries from step to step).
//!
//! ```json
//! "layers": {
//!   "types": ["sliding_attention", "full_attention", "conv"],
//!   "sliding_window": 512,
//!   "rope":  {"sliding_attention": {"theta": 10000.0, "cos": "cos_local", "sin": "sin_local"}},
//!   "masks": {"sliding_attention": "cmask_local"},
//!   "state": {"conv": {"past": "past_conv_{i}", "present": "present_conv_{i}",
//!                      "seed": "conv_bx_{i}", "width": 3}}
//! }
//! ```
//!
//! Without `types`, a bundle whose decode graph has `past_conv_<i>` inputs is read as the
//! LFM2 contract: layer i is `conv` when the graph has `past_conv_<i>`, else attention.

use super::rope::{check_scaling, RopeScaling};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LayerType {
    Full,
    Sliding,
    Conv,
}

impl LayerType {
    pub const ALL: [LayerType; 3] = [LayerType::Full, LayerType::Sliding, LayerType::Conv];

    pub fn name(self) -> &'static str {
        match self {
            LayerType::Full => "full_attention",
            LayerType::Sliding => "sliding_attention",
            LayerType::Conv => "conv",
        }
    }

    fn parse(s: &str) -> Option<LayerType> {
        Self::ALL.into_iter().find(|t| t.name() == s)
    }

    pub fn is_attention(self) -> bool {
        self != LayerType::Conv
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRope {
    pub theta: f64,
    #[serde(default)]
    pub scaling: Option<RopeScaling>,
    #[serde(default)]
    pub cos: Option<String>,
    #[serde(default)]
    pub sin: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawState {
    pub past: String,
    pub present: String,
    #[serde(default)]
    pub seed: Option<String>,
    pub width: usize,
}

/// `layers` as written.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawLayers {
    #[serde(default)]
    pub types: Option<Vec<String>>,
    #[serde(default)]
    pub sliding_window: Option<usize>,
    #[serde(default)]
    pub rope: BTreeMap<String, RawRope>,
    #[serde(default)]
    pub masks: BTreeMap<String, String>,
    #[serde(default)]
    pub state: BTreeMap<String, RawState>,
}

/// A RoPE table and the graph inputs it feeds.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeKind {
    pub theta: f64,
    pub scaling: Option<RopeScaling>,
    pub cos: String,
    pub sin: String,
}

/// Names of a recurrent state's tensors (`{i}` = the layer number).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateNames {
    pub past: String,
    pub present: String,
    pub seed: Option<String>,
    pub width: usize,
}

/// `layers`, checked against the params: per type, its RoPE table, mask and state.
#[derive(Debug, Clone)]
pub struct Layers {
    /// One per layer; `None`: from the graphs (all attention, or the LFM2 contract).
    pub types: Option<Vec<LayerType>>,
    pub window: Option<usize>,
    /// Index 0 is the global table (params.rope_theta / rope_scaling, `cos` / `sin`,
    /// unless `rope.full_attention` says otherwise).
    pub ropes: Vec<RopeKind>,
    rope_of: BTreeMap<LayerType, usize>,
    masks: BTreeMap<LayerType, String>,
    pub conv_state: StateNames,
}

impl Layers {
    /// The index into [`Layers::ropes`] of a layer type's table.
    pub fn rope_of(&self, t: LayerType) -> usize {
        self.rope_of.get(&t).copied().unwrap_or(0)
    }

    /// The mask input name pattern of an attention type (`cmask` unless renamed).
    pub fn mask_of(&self, t: LayerType) -> Option<&str> {
        self.masks.get(&t).map(String::as_str)
    }

    /// The layers' own types, or all attention when the manifest does not list them.
    pub fn type_of(&self, i: usize) -> LayerType {
        self.types
            .as_ref()
            .and_then(|t| t.get(i).copied())
            .unwrap_or(LayerType::Full)
    }
}

/// Check `raw` against `n_layers`, `max_ctx` and the global RoPE; every mistake is one
/// message naming its JSON path.
pub fn resolve(
    raw: Option<&RawLayers>,
    n_layers: usize,
    max_ctx: usize,
    global: RopeKind,
) -> Result<Layers, String> {
    let empty = RawLayers::default();
    let raw = raw.unwrap_or(&empty);
    let types = match &raw.types {
        None => None,
        Some(v) => {
            if v.len() != n_layers {
                return Err(format!(
                    "layers.types: lists {} layers but params.n_layers is {n_layers}",
                    v.len()
                ));
            }
            let mut out = Vec::with_capacity(v.len());
            for (i, s) in v.iter().enumerate() {
                let t = LayerType::parse(s).ok_or_else(|| {
                    format!(
                        "layers.types[{i}]: {s:?} is not one of \"full_attention\", \"sliding_attention\", \"conv\""
                    )
                })?;
                out.push(t);
            }
            Some(out)
        }
    };
    // Types the layers use; without a list, keys may only name attention defaults.
    let used = |t: LayerType| match &types {
        Some(v) => v.contains(&t),
        None => t == LayerType::Full,
    };
    let key_type = |section: &str, key: &str| -> Result<LayerType, String> {
        let t = LayerType::parse(key).ok_or_else(|| {
            format!(
                "layers.{section}.{key}: not a layer type (\"full_attention\", \"sliding_attention\", \"conv\")"
            )
        })?;
        if !used(t) {
            return Err(format!(
                "layers.{section}.{key}: no layer is of that type (layers.types does not list it)"
            ));
        }
        Ok(t)
    };
    let window = raw.sliding_window;
    if used(LayerType::Sliding) {
        match window {
            None => {
                return Err(
                    "layers.sliding_window: missing; sliding_attention layers need it".into(),
                )
            }
            Some(0) => return Err("layers.sliding_window: must be positive".into()),
            Some(w) if w > max_ctx => {
                return Err(format!(
                    "layers.sliding_window: {w} is larger than params.max_ctx {max_ctx} (a window that never slides is a full_attention layer)"
                ))
            }
            _ => {}
        }
    } else if window.is_some() {
        return Err("layers.sliding_window: no layer is a sliding_attention layer".into());
    }
    let mut ropes = vec![global];
    let mut rope_of = BTreeMap::new();
    for (key, r) in &raw.rope {
        let t = key_type("rope", key)?;
        if !t.is_attention() {
            return Err(format!("layers.rope.{key}: conv layers take no RoPE"));
        }
        if !(r.theta.is_finite() && r.theta > 0.0) {
            return Err(format!(
                "layers.rope.{key}.theta: {} must be a positive number",
                r.theta
            ));
        }
        if let Some(s) = &r.scaling {
            check_scaling(s).map_err(|m| format!("layers.rope.{key}.scaling: {m}"))?;
        }
        let kind = RopeKind {
            theta: r.theta,
            scaling: r.scaling.clone(),
            cos: r.cos.clone().unwrap_or_else(|| "cos".into()),
            sin: r.sin.clone().unwrap_or_else(|| "sin".into()),
        };
        if t == LayerType::Full {
            ropes[0] = kind;
            continue;
        }
        if kind.cos == ropes[0].cos || kind.sin == ropes[0].sin {
            if kind != ropes[0] {
                return Err(format!(
                    "layers.rope.{key}: its table differs from the global one but feeds the same inputs ({:?}, {:?}); name its own cos / sin",
                    kind.cos, kind.sin
                ));
            }
            continue;
        }
        rope_of.insert(t, ropes.len());
        ropes.push(kind);
    }
    let mut masks = BTreeMap::new();
    for (key, name) in &raw.masks {
        let t = key_type("masks", key)?;
        if !t.is_attention() {
            return Err(format!("layers.masks.{key}: conv layers take no mask"));
        }
        if name.is_empty() {
            return Err(format!("layers.masks.{key}: empty tensor name"));
        }
        masks.insert(t, name.clone());
    }
    let mut conv_state = StateNames {
        past: "past_conv_{i}".into(),
        present: "present_conv_{i}".into(),
        seed: Some("conv_bx_{i}".into()),
        width: 3,
    };
    for (key, s) in &raw.state {
        let t = key_type("state", key)?;
        if t != LayerType::Conv {
            return Err(format!(
                "layers.state.{key}: only conv layers carry a recurrent state"
            ));
        }
        for (field, name) in [("past", Some(&s.past)), ("present", Some(&s.present))]
            .into_iter()
            .chain([("seed", s.seed.as_ref())])
        {
            if let Some(n) = name {
                if !n.contains("{i}") {
                    return Err(format!(
                        "layers.state.{key}.{field}: {n:?} is per layer; it needs `{{i}}` where the layer number goes"
                    ));
                }
            }
        }
        if s.width == 0 {
            return Err(format!("layers.state.{key}.width: must be positive"));
        }
        conv_state = StateNames {
            past: s.past.clone(),
            present: s.present.clone(),
            seed: s.seed.clone(),
            width: s.width,
        };
    }
    Ok(Layers {
        types,
        window,
        ropes,
        rope_of,
        masks,
        conv_state,
    })
}
