//! The bundle manifest: serde mirror of the JSON, then validation into a resolved
//! [`Manifest`] whose paths are joined to the artifacts root. Schema 1 names the graphs by
//! role under `artifacts.contexts` and finds tensors by name; schema 2 writes the plan out
//! (`plan.steps`, see [`steps`]). Both become the same [`Manifest`].

use super::declared::Declared;
use crate::error::{Error, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub mod layers;
pub mod rope;
pub mod steps;

pub use rope::{check_scaling, RopeScaling};

/// The newest schema this version reads (it reads every one from 1).
pub const SCHEMA_VERSION: u32 = 2;

#[derive(Debug, Clone, Deserialize)]
pub struct ModelSection {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub family: Option<String>,
    /// Missing in the LFM2 schema-v1 form, whose `model.name` says `lfm...`.
    #[serde(default)]
    pub arch: Option<String>,
    #[serde(default)]
    pub dsp_arch: Option<String>,
    #[serde(default)]
    pub soc_model: Option<u32>,
    /// Parameter count, for benchmark tables (optional).
    #[serde(default)]
    pub n_params: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct Params {
    pub hidden: usize,
    pub vocab: usize,
    pub n_layers: usize,
    /// Optional in the LFM2 schema-v1 form (it gives `kv_dim`); the host never needs it.
    #[serde(default)]
    pub n_heads: Option<usize>,
    /// Or `kv_dim` / `head_dim` (LFM2 schema-v1); filled in by validation.
    #[serde(default)]
    pub n_kv_heads: usize,
    #[serde(default)]
    pub kv_dim: Option<usize>,
    pub head_dim: usize,
    pub max_ctx: usize,
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    pub eos_token_id: OneOrMany,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContextRef {
    /// The context binary; may be omitted when `contexts.shared` holds the graph.
    #[serde(default)]
    pub bin: Option<String>,
    #[serde(default)]
    pub graph: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Contexts {
    #[serde(default)]
    pub prefill: Option<ContextRef>,
    #[serde(default)]
    pub decode: Option<ContextRef>,
    pub lmhead: ContextRef,
    /// A verify graph: a few rows with past inputs over the decode cache, so speculative
    /// decoding checks several drafted tokens in one execute (`--spec`).
    #[serde(default)]
    pub verify: Option<ContextRef>,
    /// A verify head: the lm-head over all of a verify's rows in one execute (K x vocab
    /// logits, or K argmax ids), so a verify does not run the one-row head per row.
    #[serde(default)]
    pub verify_head: Option<ContextRef>,
    /// One binary holding the prefill and decode graphs (weights shared).
    #[serde(default)]
    pub shared: Option<ContextRef>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum EmbedDtype {
    #[default]
    F16,
    F32,
}

impl EmbedDtype {
    pub fn size(self) -> usize {
        match self {
            EmbedDtype::F16 => 2,
            EmbedDtype::F32 => 4,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum EmbedRef {
    File(String),
    Full {
        file: String,
        #[serde(default)]
        dtype: EmbedDtype,
    },
}

#[derive(Debug, Clone, Deserialize)]
pub struct Artifacts {
    /// Schema 1's graphs by role (schema 2 names them in `plan.steps`).
    #[serde(default)]
    pub contexts: Option<Contexts>,
    pub embed: EmbedRef,
    pub tokenizer: String,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct Plan {
    #[serde(default)]
    pub op: Option<String>,
    #[serde(default)]
    pub ar: Option<usize>,
    /// Tensor names by role for bundles whose graphs use other names: keys `x`, `cos`,
    /// `sin`, `cmask`, `y`, `past_k`, `past_v`, `new_k`, `new_v`; per-layer names use `{i}`
    /// (e.g. `"past_k": "layers.{i}.k_cache"`).
    #[serde(default)]
    pub io: BTreeMap<String, String>,
    /// Schema 2: the steps, each tensor with its plan kind.
    #[serde(default)]
    pub steps: Option<Vec<steps::RawStep>>,
    /// Graph names by role (`prefill`, `decode`, `lmhead`), as LFM2 schema-v1 bundles
    /// give them; `artifacts.contexts.<role>.graph` wins when both are set.
    #[serde(default)]
    pub params: BTreeMap<String, serde_json::Value>,
}

impl Plan {
    /// The tensor name of `role` (layer `i` for per-layer roles): `plan.io` or the default
    /// LFM2-contract name (`x`, `past_k_<i>`, ...).
    pub fn tensor_name(&self, role: &str, i: Option<usize>) -> String {
        let pattern = self.io.get(role).cloned().unwrap_or_else(|| {
            if i.is_some() {
                format!("{role}_{{i}}")
            } else {
                role.to_string()
            }
        });
        match i {
            Some(i) => pattern.replace("{i}", &i.to_string()),
            None => pattern,
        }
    }
}

/// Keys this version reads, per object (for the unknown-key note at -v).
const KNOWN_KEYS: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "schema_version",
            "model",
            "params",
            "artifacts",
            "plan",
            "chat",
            "source",
            "layers",
        ],
    ),
    (
        "model",
        &[
            "name",
            "family",
            "arch",
            "dsp_arch",
            "soc_model",
            "n_params",
        ],
    ),
    (
        "params",
        &[
            "hidden",
            "vocab",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "max_ctx",
            "rope_theta",
            "rope_scaling",
            "bos_token_id",
            "eos_token_id",
            "kv_dim",
        ],
    ),
    (
        "layers",
        &["types", "sliding_window", "rope", "masks", "state"],
    ),
    ("artifacts", &["contexts", "embed", "tokenizer"]),
    (
        "artifacts.contexts",
        &["prefill", "decode", "lmhead", "verify", "shared"],
    ),
    ("plan", &["op", "ar", "io", "params", "steps"]),
];

/// JSON paths of keys qhx does not read (they are ignored).
pub fn unknown_keys(doc: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for (path, known) in KNOWN_KEYS {
        let found = path
            .split('.')
            .filter(|p| !p.is_empty())
            .try_fold(doc, |v, part| v.get(part));
        if let Some(obj) = found.and_then(|v| v.as_object()) {
            for k in obj.keys().filter(|k| !known.contains(&k.as_str())) {
                out.push(if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                });
            }
        }
    }
    out
}

#[derive(Debug, Clone, Deserialize)]
struct RawManifest {
    schema_version: u32,
    model: ModelSection,
    params: Params,
    artifacts: Artifacts,
    #[serde(default)]
    plan: Plan,
    #[serde(default)]
    chat: Option<serde_json::Value>,
    #[serde(default)]
    layers: Option<layers::RawLayers>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
    Lfm2,
}

impl Arch {
    pub const ALL: [Arch; 5] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Gemma3,
        Arch::Lfm2,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Lfm2 => "lfm2",
        }
    }
}

/// A context binary to load and the graph to take from it.
#[derive(Debug, Clone)]
pub struct GraphRef {
    pub bin: PathBuf,
    pub graph: Option<String>,
    /// Tensor names by role for this graph alone (schema 2's step I/O); empty in schema 1,
    /// where `plan.io` and the default names apply to every graph.
    pub io: BTreeMap<String, String>,
}

/// What a graph of the bundle is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphRole {
    Prefill,
    Verify,
    Decode,
    LmHead,
    VerifyHead,
}

impl GraphRole {
    /// The manifest key (`artifacts.contexts.<key>`).
    pub fn as_str(self) -> &'static str {
        match self {
            GraphRole::Prefill => "prefill",
            GraphRole::Verify => "verify",
            GraphRole::Decode => "decode",
            GraphRole::LmHead => "lmhead",
            GraphRole::VerifyHead => "verify_head",
        }
    }

    /// Words that mark a graph name as this role when a binary holds several graphs.
    pub(crate) fn name_words(self) -> &'static [&'static str] {
        match self {
            GraphRole::Prefill => &["prefill", "pf", "ar128", "full"],
            GraphRole::Verify => &["verify", "spec"],
            GraphRole::Decode => &["decode", "dec", "ar1"],
            GraphRole::LmHead => &["lmhead", "lm_head", "lmh"],
            GraphRole::VerifyHead => &["verify_head", "vhead"],
        }
    }
}

/// A validated manifest with artifact paths resolved against the artifacts root.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub path: PathBuf,
    pub schema_version: u32,
    pub name: String,
    pub arch: Arch,
    pub dsp_arch: Option<String>,
    pub soc_model: Option<u32>,
    pub n_params: Option<u64>,
    pub params: Params,
    pub eos: Vec<u32>,
    pub prefill: Option<GraphRef>,
    /// The speculative-decoding verify graph, when the bundle has one.
    pub verify: Option<GraphRef>,
    pub decode: GraphRef,
    /// The smaller rungs of a context ladder, smallest first (schema 2); `prefill`,
    /// `verify` and `decode` above are the largest rung's.
    pub ladder: Vec<steps::Rung>,
    pub lmhead: GraphRef,
    /// The verify head, when the bundle has one (`--verify-head`).
    pub verify_head: Option<GraphRef>,
    pub embed: PathBuf,
    pub embed_dtype: EmbedDtype,
    pub tokenizer: PathBuf,
    pub plan: Plan,
    /// What each layer needs (types, RoPE tables, masks, state); all global attention
    /// when the manifest has no `layers`.
    pub layers: layers::Layers,
    pub chat: Option<serde_json::Value>,
    /// Keys present in the file that this version ignores.
    pub unknown_keys: Vec<String>,
}

impl Manifest {
    /// Every graph reference, ladder rungs first, then prefill, verify, decode and the
    /// lm-head (the order binaries are listed and loaded in).
    pub fn graph_refs(&self) -> Vec<&GraphRef> {
        let mut v = Vec::new();
        for r in &self.ladder {
            v.extend(r.prefill.iter().chain(&r.verify).chain([&r.decode]));
        }
        v.extend(self.prefill.iter().chain(&self.verify));
        v.extend([&self.decode, &self.lmhead]);
        v.extend(&self.verify_head);
        v
    }

    /// What the manifest declares, in the shape a Genie config's is given too.
    pub fn declared(&self) -> Declared {
        let mut files = vec![("tokenizer", self.tokenizer.clone())];
        files.push(("embedding table", self.embed.clone()));
        for r in &self.ladder {
            for g in r.prefill.iter().chain(&r.verify).chain([&r.decode]) {
                files.push(("context-ladder binary", g.bin.clone()));
            }
        }
        if let Some(r) = &self.prefill {
            files.push(("prefill binary", r.bin.clone()));
        }
        if let Some(r) = &self.verify {
            files.push(("verify binary", r.bin.clone()));
        }
        files.push(("decode binary", self.decode.bin.clone()));
        files.push(("lm-head binary", self.lmhead.bin.clone()));
        if let Some(r) = &self.verify_head {
            files.push(("verify-head binary", r.bin.clone()));
        }
        let template = self
            .chat
            .as_ref()
            .and_then(|c| c.get("template"))
            .and_then(|t| t.as_str())
            .map(|t| (t.to_string(), self.path.clone()));
        Declared {
            files,
            paths_hint: "artifact paths resolve against the artifacts root",
            max_ctx: self.params.max_ctx,
            eos: self.eos.clone(),
            tokenizer: self.tokenizer.clone(),
            vocab: self.params.vocab,
            bos: self.params.bos_token_id,
            sampling: None,
            stops: Vec::new(),
            template,
            lookahead: None,
        }
    }

    /// Read, parse and validate `path`; artifact names resolve against `root`.
    pub fn load(path: &Path, root: &Path) -> Result<Manifest> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::parse(&bytes, path, root)
    }

    pub fn parse(bytes: &[u8], path: &Path, root: &Path) -> Result<Manifest> {
        let err = |msg: String| Error::Manifest {
            path: path.to_path_buf(),
            msg,
        };
        if bytes.iter().all(|b| b.is_ascii_whitespace()) {
            return Err(err("file is empty".into()));
        }
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let raw: RawManifest = serde_path_to_error::deserialize(de).map_err(|e| {
            // serde_path_to_error writes `?` for a position it could not name (e.g. at
            // the end of a truncated file): no path then.
            let at = e.path().to_string();
            let at = at.trim_end_matches('?').trim_end_matches('.');
            let inner = e.into_inner();
            if at.is_empty() {
                err(inner.to_string())
            } else {
                err(format!("{at}: {inner}"))
            }
        })?;
        if !(1..=SCHEMA_VERSION).contains(&raw.schema_version) {
            return Err(err(format!(
                "schema_version: {} is not supported (this qhx reads 1 to {SCHEMA_VERSION})",
                raw.schema_version
            )));
        }
        let mut raw = raw;
        let arch = match raw.model.arch.as_deref() {
            Some(a) => Arch::ALL
                .into_iter()
                .find(|x| x.as_str() == a)
                .ok_or_else(|| {
                    let names: Vec<&str> = Arch::ALL.iter().map(|x| x.as_str()).collect();
                    err(format!("model.arch: {a:?} is not one of {names:?}"))
                })?,
            // LFM2's schema-v1 manifests name the model, not the architecture.
            None if raw.model.name.to_ascii_lowercase().starts_with("lfm") => Arch::Lfm2,
            None => return Err(err("model: missing field `arch`".into())),
        };
        let p = &mut raw.params;
        // Only the LFM2 schema-v1 form (it gives kv_dim) leaves the head count out.
        if p.n_heads.is_none() && p.kv_dim.is_none() {
            return Err(err("params: missing field `n_heads`".into()));
        }
        if p.n_kv_heads == 0 {
            match p.kv_dim {
                Some(k) if p.head_dim > 0 && k > 0 && k % p.head_dim == 0 => {
                    p.n_kv_heads = k / p.head_dim
                }
                Some(k) => {
                    return Err(err(format!(
                        "params.kv_dim: {k} is not a positive multiple of head_dim {}",
                        p.head_dim
                    )))
                }
                None => {
                    return Err(err(
                        "params: missing field `n_kv_heads` (or `kv_dim`)".into()
                    ))
                }
            }
        }
        // LFM2 schema-v1 gives BOS as `chat.bos: [id]`.
        if p.bos_token_id.is_none() {
            p.bos_token_id = raw
                .chat
                .as_ref()
                .and_then(|c| c.get("bos"))
                .and_then(|b| b.as_array().and_then(|a| a.first()).or(Some(b)))
                .and_then(|v| v.as_u64())
                .and_then(|v| u32::try_from(v).ok());
        }
        let p = &raw.params;
        for (name, v) in [
            ("hidden", p.hidden),
            ("vocab", p.vocab),
            ("n_layers", p.n_layers),
            ("n_heads", p.n_heads.unwrap_or(p.n_kv_heads)),
            ("n_kv_heads", p.n_kv_heads),
            ("head_dim", p.head_dim),
            ("max_ctx", p.max_ctx),
        ] {
            if v == 0 {
                return Err(err(format!("params.{name}: must be positive")));
            }
        }
        if let Some(k) = p.kv_dim {
            if k != p.n_kv_heads * p.head_dim {
                return Err(err(format!(
                    "params.kv_dim: {k} is not n_kv_heads {} x head_dim {}",
                    p.n_kv_heads, p.head_dim
                )));
            }
        }
        if let Some(nh) = p.n_heads {
            if !nh.is_multiple_of(p.n_kv_heads) {
                return Err(err(format!(
                    "params.n_heads: {nh} is not a multiple of n_kv_heads {}",
                    p.n_kv_heads
                )));
            }
        }
        if !p.head_dim.is_multiple_of(2) {
            return Err(err(format!(
                "params.head_dim: {} must be even for RoPE",
                p.head_dim
            )));
        }
        if !(p.rope_theta.is_finite() && p.rope_theta > 0.0) {
            return Err(err(format!(
                "params.rope_theta: {} must be a positive number",
                p.rope_theta
            )));
        }
        if let Some(s) = &p.rope_scaling {
            check_scaling(s).map_err(|m| err(format!("params.rope_scaling: {m}")))?;
        }
        let layers = layers::resolve(
            raw.layers.as_ref(),
            p.n_layers,
            p.max_ctx,
            layers::RopeKind {
                theta: p.rope_theta,
                scaling: p.rope_scaling.clone(),
                cos: "cos".into(),
                sin: "sin".into(),
            },
        )
        .map_err(err)?;
        let eos = match &p.eos_token_id {
            OneOrMany::One(e) => vec![*e],
            OneOrMany::Many(v) => v.clone(),
        };
        for &e in &eos {
            if e as usize >= p.vocab {
                return Err(err(format!(
                    "params.eos_token_id: {e} is outside the vocabulary ({})",
                    p.vocab
                )));
            }
        }
        if let Some(b) = p.bos_token_id {
            if b as usize >= p.vocab {
                return Err(err(format!(
                    "params.bos_token_id: {b} is outside the vocabulary ({})",
                    p.vocab
                )));
            }
        }
        let resolve = |name: &str, field: &str| -> Result<PathBuf> {
            if name.is_empty() {
                return Err(err(format!("{field}: empty file name")));
            }
            Ok(root.join(name))
        };
        let (prefill, verify, decode, ladder, lmhead, verify_head) = if raw.schema_version >= 2 {
            if raw.artifacts.contexts.is_some() {
                return Err(err(
                    "artifacts.contexts: schema_version 2 names its graphs in plan.steps, not here"
                        .into(),
                ));
            }
            if !raw.plan.io.is_empty() {
                return Err(err(
                    "plan.io: schema_version 2 names each step's tensors in plan.steps".into(),
                ));
            }
            let Some(st) = &raw.plan.steps else {
                return Err(err("plan: missing field `steps` (schema_version 2)".into()));
            };
            let bin = |name: &str, field: &str| {
                resolve(name, field).map_err(|e| match e {
                    Error::Manifest { msg, .. } => msg,
                    other => other.to_string(),
                })
            };
            let st = steps::resolve(st, &bin).map_err(err)?;
            (
                st.prefill,
                st.verify,
                st.decode,
                st.ladder,
                st.head,
                st.verify_head,
            )
        } else {
            if raw.plan.steps.is_some() {
                return Err(err("plan.steps: needs schema_version 2".into()));
            }
            let Some(c) = &raw.artifacts.contexts else {
                return Err(err("artifacts: missing field `contexts`".into()));
            };
            let shared = match &c.shared {
                Some(sh) => Some(match &sh.bin {
                    Some(b) => resolve(b, "artifacts.contexts.shared.bin")?,
                    None => {
                        return Err(err("artifacts.contexts.shared: missing field `bin`".into()))
                    }
                }),
                None => None,
            };
            let gref = |r: &ContextRef, field: &str, may_share: bool| -> Result<GraphRef> {
                let bin = match (&r.bin, &shared) {
                    (Some(b), _) => resolve(b, &format!("{field}.bin"))?,
                    (None, Some(sh)) if may_share => sh.clone(),
                    _ => return Err(err(format!("{field}: missing field `bin`"))),
                };
                // `plan.params.<role>` names the graph in LFM2 schema-v1 manifests.
                let role = field.rsplit('.').next().unwrap_or(field);
                let named = raw
                    .plan
                    .params
                    .get(role)
                    .and_then(|v| v.as_str())
                    .map(str::to_string);
                Ok(GraphRef {
                    bin,
                    graph: r.graph.clone().or(named),
                    io: BTreeMap::new(),
                })
            };
            // LFM2 shared-v1 lists only `shared` and `lmhead`: the prefill and decode graphs
            // are in the shared binary, named by `plan.params`.
            let in_shared = ContextRef {
                bin: None,
                graph: None,
            };
            let decode = match (&c.decode, &shared) {
                (Some(d), _) => gref(d, "artifacts.contexts.decode", true)?,
                (None, Some(_)) => gref(&in_shared, "artifacts.contexts.decode", true)?,
                (None, None) => {
                    return Err(err("artifacts.contexts: missing field `decode`".into()))
                }
            };
            let prefill = match (&c.prefill, &shared) {
                (Some(r), _) => Some(gref(r, "artifacts.contexts.prefill", true)?),
                (None, Some(_)) if raw.plan.params.contains_key("prefill") => {
                    Some(gref(&in_shared, "artifacts.contexts.prefill", true)?)
                }
                _ => None,
            };
            let verify = c
                .verify
                .as_ref()
                .map(|r| gref(r, "artifacts.contexts.verify", true))
                .transpose()?;
            let lmhead = gref(&c.lmhead, "artifacts.contexts.lmhead", false)?;
            let verify_head = c
                .verify_head
                .as_ref()
                .map(|r| gref(r, "artifacts.contexts.verify_head", false))
                .transpose()?;
            if verify_head.is_some() && verify.is_none() {
                return Err(err(
                    "artifacts.contexts.verify_head: a verify head needs a verify graph (artifacts.contexts.verify)".into(),
                ));
            }
            (prefill, verify, decode, Vec::new(), lmhead, verify_head)
        };
        let (embed_name, embed_dtype) = match &raw.artifacts.embed {
            EmbedRef::File(f) => (f.as_str(), EmbedDtype::F16),
            EmbedRef::Full { file, dtype } => (file.as_str(), *dtype),
        };
        Ok(Manifest {
            path: path.to_path_buf(),
            schema_version: raw.schema_version,
            name: raw.model.name.clone(),
            arch,
            dsp_arch: raw.model.dsp_arch.clone(),
            soc_model: raw.model.soc_model,
            n_params: raw.model.n_params,
            eos,
            prefill,
            verify,
            decode,
            ladder,
            lmhead,
            verify_head,
            embed: resolve(embed_name, "artifacts.embed")?,
            embed_dtype,
            tokenizer: resolve(&raw.artifacts.tokenizer, "artifacts.tokenizer")?,
            plan: raw.plan.clone(),
            layers,
            chat: raw.chat.clone(),
            unknown_keys: serde_json::from_slice(bytes)
                .map(|v| unknown_keys(&v))
                .unwrap_or_default(),
            params: raw.params,
        })
    }

    /// The name of `graph`'s tensor of `role` (layer `i` for per-layer roles): the step's
    /// own (schema 2), else `plan.io`'s or the default name (schema 1).
    pub fn tensor_name(&self, graph: &GraphRef, role: &str, i: Option<usize>) -> String {
        match (graph.io.get(role), i) {
            (Some(p), Some(i)) => p.replace("{i}", &i.to_string()),
            (Some(p), None) => p.clone(),
            (None, _) => self.plan.tensor_name(role, i),
        }
    }

    /// K = n_kv_heads * head_dim, the per-position width of one layer's K or V.
    pub fn kv_dim(&self) -> usize {
        self.params.n_kv_heads * self.params.head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"schema_version":1,
      "model":{"name":"m","arch":"llama"},
      "params":{"hidden":8,"vocab":32,"n_layers":2,"n_heads":2,"n_kv_heads":1,"head_dim":4,
                "max_ctx":16,"rope_theta":10000.0,"eos_token_id":[2,3]},
      "artifacts":{"contexts":{"decode":{"bin":"d.bin"},"lmhead":{"bin":"l.bin","graph":"lm"}},
                   "embed":"e.bin","tokenizer":"tokenizer.json"},
      "future_key": {"ignored": true}}"#;

    fn parse(s: &str) -> Result<Manifest> {
        Manifest::parse(s.as_bytes(), Path::new("m.json"), Path::new("/root"))
    }

    #[test]
    fn parses_and_resolves_paths() {
        let m = parse(GOOD).unwrap();
        assert_eq!(m.arch, Arch::Llama);
        assert_eq!(m.eos, vec![2, 3]);
        assert_eq!(m.decode.bin, PathBuf::from("/root/d.bin"));
        assert_eq!(m.lmhead.graph.as_deref(), Some("lm"));
        assert_eq!(m.embed_dtype, EmbedDtype::F16);
        assert!(m.prefill.is_none());
        assert_eq!(m.kv_dim(), 4);
        assert_eq!(m.unknown_keys, vec!["future_key".to_string()]);
        assert_eq!(m.plan.tensor_name("past_k", Some(3)), "past_k_3");
        assert_eq!(m.plan.tensor_name("x", None), "x");
    }

    #[test]
    fn plan_io_renames_roles_and_shared_supplies_bins() {
        let s = GOOD.replace(
            r#""contexts":{"decode":{"bin":"d.bin"}"#,
            r#""contexts":{"shared":{"bin":"s.bin"},"prefill":{"graph":"pf"},"decode":{"graph":"dec"}"#,
        );
        let s = s.replace(
            r#""future_key""#,
            r#""plan":{"io":{"past_k":"layers.{i}.k","x":"embeds"}},"future_key""#,
        );
        let m = parse(&s).unwrap();
        assert_eq!(m.decode.bin, PathBuf::from("/root/s.bin"));
        assert_eq!(
            m.prefill.as_ref().unwrap().bin,
            PathBuf::from("/root/s.bin")
        );
        assert_eq!(m.lmhead.bin, PathBuf::from("/root/l.bin"));
        assert_eq!(m.plan.tensor_name("past_k", Some(2)), "layers.2.k");
        assert_eq!(m.plan.tensor_name("x", None), "embeds");
        assert_eq!(m.plan.tensor_name("new_v", Some(0)), "new_v_0");
        // Without `shared`, a context without `bin` is an error naming the field.
        let bad = GOOD.replace(r#"{"bin":"d.bin"}"#, r#"{"graph":"d"}"#);
        assert!(parse(&bad)
            .unwrap_err()
            .to_string()
            .contains("artifacts.contexts.decode: missing field `bin`"));
    }

    #[test]
    fn missing_field_names_its_json_path() {
        let bad = GOOD.replace(r#""hidden":8,"#, "");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(
            e.contains("m.json") && e.contains("params") && e.contains("hidden"),
            "{e}"
        );
    }

    #[test]
    fn wrong_type_names_its_json_path() {
        let bad = GOOD.replace(r#""max_ctx":16"#, r#""max_ctx":"16""#);
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("params.max_ctx"), "{e}");
    }

    #[test]
    fn rejects_bad_values() {
        for (from, to, needle) in [
            (
                r#""schema_version":1"#,
                r#""schema_version":3"#,
                "schema_version: 3 is not supported",
            ),
            (r#""n_kv_heads":1"#, r#""n_kv_heads":0"#, "n_kv_heads"),
            (r#""head_dim":4"#, r#""head_dim":3"#, "head_dim"),
            (r#""arch":"llama""#, r#""arch":"gpt""#, "model.arch"),
            (
                r#""eos_token_id":[2,3]"#,
                r#""eos_token_id":99"#,
                "eos_token_id",
            ),
            (
                r#""rope_theta":10000.0"#,
                r#""rope_theta":-1"#,
                "rope_theta",
            ),
        ] {
            let e = parse(&GOOD.replace(from, to)).unwrap_err().to_string();
            assert!(e.contains(needle), "{from} -> {e}");
        }
        assert!(parse("").unwrap_err().to_string().contains("empty"));
        assert!(parse("{").is_err());
    }

    /// `GOOD` with three layers described by a `layers` section (Gemma 3 style: sliding
    /// layers with their own RoPE base and mask, then a global one).
    fn with_layers(layers: &str) -> String {
        GOOD.replace(r#""n_layers":2"#, r#""n_layers":3"#).replace(
            r#""future_key": {"ignored": true}"#,
            &format!(r#""layers": {layers}"#),
        )
    }

    const GEMMA_LAYERS: &str = r#"{"types":["sliding_attention","sliding_attention","full_attention"],
        "sliding_window":8,
        "rope":{"sliding_attention":{"theta":10000.0,"cos":"cos_local","sin":"sin_local"}},
        "masks":{"sliding_attention":"cmask_local"}}"#;

    #[test]
    fn layers_section_gives_each_type_its_rope_and_mask() {
        let m = parse(&with_layers(GEMMA_LAYERS)).unwrap();
        let l = &m.layers;
        use layers::LayerType::*;
        assert_eq!(l.types.as_deref(), Some(&[Sliding, Sliding, Full][..]));
        assert_eq!(l.window, Some(8));
        assert_eq!(l.ropes.len(), 2);
        assert_eq!(l.rope_of(Full), 0);
        assert_eq!(l.rope_of(Sliding), 1);
        assert_eq!(l.ropes[1].theta, 10000.0);
        assert_eq!(l.ropes[1].cos, "cos_local");
        assert_eq!(l.mask_of(Sliding), Some("cmask_local"));
        assert!(m.unknown_keys.is_empty(), "{:?}", m.unknown_keys);
        // Without the section every layer is global attention with params' RoPE.
        let plain = parse(GOOD).unwrap();
        assert!(plain.layers.types.is_none());
        assert_eq!(plain.layers.ropes.len(), 1);
        assert_eq!(plain.layers.ropes[0].theta, 10000.0);
    }

    /// The bad-input catalogue's manifest half: each mistake in `layers` is one line naming
    /// its JSON path.
    #[test]
    fn layers_mistakes_are_named() {
        for (layers, needle) in [
            (
                GEMMA_LAYERS.replace(r#""full_attention"]"#, r#""full_attention","conv"]"#),
                "layers.types: lists 4 layers but params.n_layers is 3",
            ),
            (
                GEMMA_LAYERS.replace(r#""sliding_window":8"#, r#""sliding_window":64"#),
                "layers.sliding_window: 64 is larger than params.max_ctx 16",
            ),
            (
                GEMMA_LAYERS.replace(r#""sliding_window":8,"#, ""),
                "layers.sliding_window: missing",
            ),
            (
                GEMMA_LAYERS
                    .replace(
                        r#""sliding_attention","sliding_attention""#,
                        r#""full_attention","full_attention""#,
                    )
                    .replace(r#""sliding_window":8,"#, ""),
                "layers.rope.sliding_attention: no layer is of that type",
            ),
            (
                GEMMA_LAYERS.replace(r#"["sliding_attention","#, r#"["slidng","#),
                r#"layers.types[0]: "slidng" is not one of"#,
            ),
            (
                GEMMA_LAYERS.replace(r#""cos":"cos_local","#, r#""cos":"cos","#),
                "layers.rope.sliding_attention: its table differs from the global one but feeds the same inputs",
            ),
            (
                GEMMA_LAYERS.replace(r#""theta":10000.0"#, r#""theta":0"#),
                "layers.rope.sliding_attention.theta: 0 must be a positive number",
            ),
            (
                GEMMA_LAYERS.replace(
                    r#""masks":{"#,
                    r#""state":{"sliding_attention":{"past":"p{i}","present":"q{i}","width":3}},"masks":{"#,
                ),
                "layers.state.sliding_attention: only conv layers carry a recurrent state",
            ),
            (
                r#"{"types":["conv","full_attention","conv"],"state":{"conv":{"past":"pc","present":"nc{i}","width":3}}}"#.to_string(),
                "layers.state.conv.past: \"pc\" is per layer",
            ),
            (
                r#"{"types":["conv","full_attention","conv"],"rope":{"conv":{"theta":1.0}}}"#.to_string(),
                "layers.rope.conv: conv layers take no RoPE",
            ),
            (
                GEMMA_LAYERS.replace(r#""masks""#, r#""maks""#),
                "unknown field `maks`",
            ),
        ] {
            let e = parse(&with_layers(&layers)).unwrap_err().to_string();
            assert!(e.contains(needle), "{layers}\n-> {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }

    /// LFM2's schema-v1 form (third-party runner's parser): no `model.arch`, `kv_dim`
    /// instead of head counts, graph names under `plan.params`, BOS as `chat.bos`.
    #[test]
    fn lfm2_schema_v1_form_reads() {
        let s = r#"{"schema_version":1,
          "model":{"name":"lfm2-5-230m","family":"llm","dsp_arch":"v79"},
          "params":{"hidden":8,"vocab":32,"n_layers":2,"max_ctx":16,"kv_dim":4,"head_dim":4,
                    "rope_theta":1000000.0,"eos_token_id":7},
          "artifacts":{"contexts":{"prefill":{"bin":"pf.bin"},"decode":{"bin":"dec.bin"},
                                   "lmhead":{"bin":"lmh.bin"}},
                       "embed":"lfm_embed_f16.bin","tokenizer":"tokenizer.json"},
          "plan":{"params":{"prefill":"lfm230_pf_512_w8","decode":"lfm230_dec_512_w8","lmhead":"lfm230_lmh_w8"}},
          "chat":{"bos":[1]}}"#;
        let m = parse(s).unwrap();
        assert_eq!(m.arch, Arch::Lfm2);
        assert_eq!(m.params.n_kv_heads, 1);
        assert_eq!(m.params.bos_token_id, Some(1));
        assert_eq!(m.decode.graph.as_deref(), Some("lfm230_dec_512_w8"));
        assert_eq!(m.lmhead.graph.as_deref(), Some("lfm230_lmh_w8"));
        assert!(m.unknown_keys.is_empty(), "{:?}", m.unknown_keys);
        let e = parse(&s.replace(r#""kv_dim":4"#, r#""kv_dim":6"#)).unwrap_err();
        assert!(
            e.to_string()
                .contains("params.kv_dim: 6 is not a positive multiple of head_dim 4"),
            "{e}"
        );
        // shared-v1: one binary for prefill and decode, graphs named by plan.params.
        let shared = s.replace(
            r#""prefill":{"bin":"pf.bin"},"decode":{"bin":"dec.bin"},"#,
            r#""shared":{"bin":"lfm_2048_shared.bin"},"#,
        );
        let m = parse(&shared).unwrap();
        assert_eq!(m.decode.bin, PathBuf::from("/root/lfm_2048_shared.bin"));
        let pre = m.prefill.as_ref().unwrap();
        assert_eq!(pre.bin, PathBuf::from("/root/lfm_2048_shared.bin"));
        assert_eq!(pre.graph.as_deref(), Some("lfm230_pf_512_w8"));
        let e = parse(&s.replace(r#""name":"lfm2-5-230m""#, r#""name":"x""#)).unwrap_err();
        assert!(e.to_string().contains("model: missing field `arch`"), "{e}");
    }

    /// The schema 1 `GOOD` bundle with a chunked prefill, written as schema 2 steps.
    const V2: &str = r#"{"schema_version":2,
      "model":{"name":"m","arch":"llama"},
      "params":{"hidden":8,"vocab":32,"n_layers":2,"n_heads":2,"n_kv_heads":1,"head_dim":4,
                "max_ctx":16,"rope_theta":10000.0,"eos_token_id":[2,3]},
      "artifacts":{"embed":"e.bin","tokenizer":"tokenizer.json"},
      "plan":{"steps":[
        {"role":"prefill","bin":"s.bin","graph":"pf",
         "inputs":{"h":"embedding","rc":"rope_cos","rs":"rope_sin","m":"mask","k{i}":"past_key","v{i}":"past_value"},
         "outputs":{"out":"hidden","nk{i}":"new_key","nv{i}":"new_value"}},
        {"role":"decode","bin":"s.bin","graph":"dec",
         "inputs":{"h":"embedding","rc":"rope_cos","rs":"rope_sin","m":"mask","k{i}":"past_key","v{i}":"past_value"},
         "outputs":{"out":"hidden","nk{i}":"new_key","nv{i}":"new_value"}},
        {"role":"head","bin":"l.bin","inputs":{"hid":"hidden"},"outputs":{"lg":"logits"}}]}}"#;

    #[test]
    fn schema_2_steps_give_each_graph_its_tensor_names() {
        let m = parse(V2).unwrap();
        assert_eq!(m.schema_version, 2);
        let pre = m.prefill.as_ref().unwrap();
        assert_eq!(pre.bin, PathBuf::from("/root/s.bin"));
        assert_eq!(pre.graph.as_deref(), Some("pf"));
        assert_eq!(m.decode.bin, PathBuf::from("/root/s.bin"));
        assert_eq!(m.tensor_name(&m.decode, "past_k", Some(7)), "k7");
        assert_eq!(m.tensor_name(&m.decode, "cmask", None), "m");
        assert_eq!(m.tensor_name(pre, "new_v", Some(1)), "nv1");
        assert_eq!(m.tensor_name(&m.lmhead, "x", None), "hid");
        assert_eq!(m.tensor_name(&m.lmhead, "y", None), "lg");
        assert!(m.unknown_keys.is_empty(), "{:?}", m.unknown_keys);
        // A prefill from an empty cache declares no past; the schema 1 defaults still
        // apply to schema 1 graphs.
        let no_past = V2.replacen(r#","k{i}":"past_key","v{i}":"past_value""#, "", 1);
        assert_eq!(parse(&no_past).unwrap().prefill.unwrap().io.len(), 7);
        let v1 = parse(GOOD).unwrap();
        assert_eq!(v1.tensor_name(&v1.decode, "past_k", Some(7)), "past_k_7");
    }

    /// A verify step sits between prefill and decode, over the decode cache (its past
    /// kinds are required, unlike a prefill's), and is absent when not listed.
    #[test]
    fn schema_2_takes_a_verify_step() {
        let dec = r#"{"role":"decode","bin":"s.bin","graph":"dec","#;
        let verify = r#"{"role":"verify","bin":"s.bin","graph":"vf",
         "inputs":{"vh":"embedding","rc":"rope_cos","rs":"rope_sin","m":"mask","k{i}":"past_key","v{i}":"past_value"},
         "outputs":{"out":"hidden","nk{i}":"new_key","nv{i}":"new_value"}},"#;
        let with = V2.replacen(dec, &format!("{verify}{dec}"), 1);
        let m = parse(&with).unwrap();
        let v = m.verify.as_ref().unwrap();
        assert_eq!(v.graph.as_deref(), Some("vf"));
        assert_eq!(m.tensor_name(v, "x", None), "vh");
        assert_eq!(m.prefill.as_ref().unwrap().graph.as_deref(), Some("pf"));
        assert!(parse(V2).unwrap().verify.is_none());
        let no_past = with.replacen(
            r#""m":"mask","k{i}":"past_key","v{i}":"past_value"},
         "outputs":{"out":"hidden","nk{i}":"new_key","nv{i}":"new_value"}},{"role":"decode""#,
            r#""m":"mask"},
         "outputs":{"out":"hidden","nk{i}":"new_key","nv{i}":"new_value"}},{"role":"decode""#,
            1,
        );
        assert_ne!(no_past, with);
        let e = parse(&no_past).unwrap_err().to_string();
        assert!(
            e.contains(r#"plan.steps[1].inputs: no tensor is given the "past_key" kind"#),
            "{e}"
        );
        // Verify before prefill is out of order.
        let swapped = with
            .replacen(r#""role":"prefill""#, r#""role":"PRE""#, 1)
            .replacen(r#""role":"verify""#, r#""role":"prefill""#, 1)
            .replacen(r#""role":"PRE""#, r#""role":"verify""#, 1);
        let e = parse(&swapped).unwrap_err().to_string();
        assert!(
            e.contains(r#"roles are ["verify", "prefill", "decode", "head"]"#),
            "{e}"
        );
    }

    #[test]
    fn schema_2_mistakes_are_named() {
        let decode_in = r#""k{i}":"past_key","v{i}":"past_value"},
         "outputs":{"out":"hidden","nk{i}":"new_key","nv{i}":"new_value"}},
        {"role":"head""#;
        for (from, to, needle) in [
            (
                r#""artifacts":{"embed""#,
                r#""artifacts":{"contexts":{"lmhead":{"bin":"l.bin"}},"embed""#,
                "artifacts.contexts: schema_version 2 names its graphs in plan.steps",
            ),
            (
                r#""plan":{"steps""#,
                r#""plan":{"io":{},"stepz""#,
                "missing field `steps`",
            ),
            (
                r#""role":"prefill""#,
                r#""role":"head""#,
                r#"roles are ["head", "decode", "head"]"#,
            ),
            (
                r#""h":"embedding""#,
                r#""h":"conv_state""#,
                r#"plan.steps[0].inputs.h: "conv_state" is a plan kind this qhx does not feed"#,
            ),
            (
                r#""h":"embedding""#,
                r#""h":"embeding""#,
                r#"plan.steps[0].inputs.h: "embeding" is not one of ["embedding""#,
            ),
            (
                r#""k{i}":"past_key""#,
                r#""k":"past_key""#,
                "plan.steps[0].inputs.k: a \"past_key\" tensor is per layer",
            ),
            (
                r#""rc":"rope_cos""#,
                r#""rc{i}":"rope_cos""#,
                "`{i}` has no meaning",
            ),
            (
                r#""rs":"rope_sin""#,
                r#""rs":"rope_cos""#,
                "plan.steps[0].inputs: two tensors are given the \"rope_cos\" kind",
            ),
            (
                decode_in,
                r#""k{i}":"past_key"},
         "outputs":{"out":"hidden","nk{i}":"new_key","nv{i}":"new_value"}},
        {"role":"head""#,
                "plan.steps[1].inputs: no tensor is given the \"past_value\" kind",
            ),
            (
                r#""lg":"logits""#,
                r#""lg":"hidden""#,
                r#"plan.steps[2].outputs.lg: "hidden" is not one of ["logits"]"#,
            ),
            (
                r#""bin":"l.bin""#,
                r#""bin":"""#,
                "plan.steps[2].bin: empty file name",
            ),
            (r#""graph":"pf""#, r#""grph":"pf""#, "unknown field `grph`"),
        ] {
            assert!(V2.contains(from), "{from}");
            let e = parse(&V2.replacen(from, to, 1)).unwrap_err().to_string();
            assert!(e.contains(needle), "{from} -> {e}");
        }
        // Steps need schema 2, and schema 1 still needs its contexts.
        let e = parse(&V2.replace(r#""schema_version":2"#, r#""schema_version":1"#));
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("plan.steps: needs schema_version 2"));
        let e = parse(&GOOD.replace(
            r#""contexts":{"decode":{"bin":"d.bin"},"lmhead":{"bin":"l.bin","graph":"lm"}},"#,
            "",
        ));
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("artifacts: missing field `contexts`"));
    }
}
