//! `genie_config.json`, the bundle description of Qualcomm's Genie (AI Hub LLM bundles).
//! Parsed as strictly as Genie itself parses it: an unknown key is an error, so a config
//! that qhx accepts is one Genie accepts too (and a typo is caught here, not on a phone).

use super::declared::{Declared, Sampling};
use crate::error::{Error, Result};
use crate::sampler::SamplerConfig;
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenieConfig {
    pub dialog: Dialog,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Dialog {
    pub version: u32,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub max_num_tokens: Option<usize>,
    #[serde(default)]
    pub stop_sequence: Option<StopSequence>,
    pub context: Context,
    pub tokenizer: Tokenizer,
    #[serde(default)]
    pub sampler: Option<Sampler>,
    pub engine: Engine,
    #[serde(default)]
    pub debug: Option<serde_json::Value>,
    /// `type: "lade"`'s lookahead settings (optional even then, as in Genie).
    #[serde(default)]
    pub lade: Option<Lade>,
}

/// Genie's `dialog.lade` block.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Lade {
    pub version: u32,
    #[serde(default)]
    pub update_mode: Option<String>,
    #[serde(default)]
    pub window: Option<usize>,
    #[serde(default)]
    pub ngram: Option<usize>,
    #[serde(default)]
    pub gcap: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopSequence {
    One(String),
    Many(Vec<String>),
}

impl StopSequence {
    pub fn list(&self) -> Vec<String> {
        match self {
            StopSequence::One(s) => vec![s.clone()],
            StopSequence::Many(v) => v.clone(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Ids {
    One(i64),
    Many(Vec<i64>),
}

impl Ids {
    /// The non-negative ids (Genie uses -1 for "none").
    pub fn list(&self) -> Vec<u32> {
        let v = match self {
            Ids::One(i) => vec![*i],
            Ids::Many(v) => v.clone(),
        };
        v.into_iter()
            .filter_map(|i| u32::try_from(i).ok())
            .collect()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Context {
    pub version: u32,
    pub size: usize,
    pub n_vocab: usize,
    #[serde(default)]
    pub bos_token: Option<i64>,
    pub eos_token: Ids,
    #[serde(default)]
    pub eot_token: Option<i64>,
    #[serde(default)]
    pub pad_token: Option<i64>,
    #[serde(default)]
    pub n_embd: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tokenizer {
    pub version: u32,
    pub path: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Sampler {
    pub version: u32,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub temp: Option<f32>,
    #[serde(default)]
    pub top_k: Option<usize>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub greedy: Option<bool>,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub token_penalty: Option<TokenPenalty>,
}

impl Sampler {
    /// `greedy: true` is argmax whatever else is set. Otherwise each value maps onto the
    /// same-named qhx setting; a missing one is neutral (temp 1, no top-k, top-p 1, no
    /// penalty, a random seed). `token-penalty.penalize-last-n` is the penalty's window.
    fn sampling(&self) -> Result<Sampling, String> {
        if let Some(t) = self.kind.as_deref().filter(|t| *t != "basic") {
            return Err(format!(
                "dialog.sampler.type {t:?} is not supported (only \"basic\")"
            ));
        }
        let greedy = self.greedy == Some(true);
        let pen = self.token_penalty.as_ref();
        let d = SamplerConfig::default();
        let config = SamplerConfig {
            temp: if greedy {
                0.0
            } else {
                self.temp.unwrap_or(1.0)
            },
            top_k: self.top_k.unwrap_or(0),
            top_p: self.top_p.unwrap_or(1.0),
            min_p: 0.0,
            repeat_penalty: pen.and_then(|p| p.repetition_penalty).unwrap_or(1.0),
            // A Genie 0 keeps its earlier qhx meaning, the whole history (qhx's own 0 is off).
            repeat_last_n: match pen.and_then(|p| p.penalize_last_n) {
                Some(0) => crate::sampler::WHOLE_CONTEXT,
                Some(n) => n,
                None => d.repeat_last_n,
            },
            seed: self.seed,
        };
        config.check(|k| match k {
            "repeat-penalty" => "dialog.sampler.token-penalty.repetition-penalty".into(),
            k => format!("dialog.sampler.{k}"),
        })?;
        let mut ignored = Vec::new();
        for (k, v) in [
            ("presence-penalty", pen.and_then(|p| p.presence_penalty)),
            ("frequency-penalty", pen.and_then(|p| p.frequency_penalty)),
        ] {
            if let Some(v) = v.filter(|v| *v != 0.0) {
                ignored.push(format!("dialog.sampler.token-penalty.{k} {v}"));
            }
        }
        Ok(Sampling { config, ignored })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TokenPenalty {
    #[serde(default)]
    pub penalize_last_n: Option<usize>,
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Engine {
    pub version: u32,
    #[serde(default)]
    pub n_threads: Option<u32>,
    pub backend: Backend,
    pub model: Model,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    pub version: u32,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub extensions: Option<PathBuf>,
    #[serde(rename = "QnnHtp")]
    pub qnn_htp: Option<QnnHtp>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct QnnHtp {
    pub version: u32,
    #[serde(default)]
    pub spill_fill_bufsize: Option<u64>,
    #[serde(default)]
    pub use_mmap: Option<bool>,
    #[serde(default)]
    pub mmap_budget: Option<u64>,
    #[serde(default)]
    pub poll: Option<bool>,
    #[serde(default)]
    pub cpu_mask: Option<String>,
    #[serde(default)]
    pub kv_dim: Option<usize>,
    #[serde(default)]
    pub pos_id_dim: Option<usize>,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub allow_async_init: Option<bool>,
    #[serde(default)]
    pub enable_graph_switching: Option<bool>,
    #[serde(default)]
    pub kv_update_method: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Model {
    pub version: u32,
    #[serde(rename = "type")]
    pub kind: String,
    pub binary: Binary,
    #[serde(default)]
    pub positional_encoding: Option<PositionalEncoding>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Binary {
    pub version: u32,
    pub ctx_bins: Vec<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PositionalEncoding {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub rope_dim: Option<usize>,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RopeScaling {
    pub rope_type: String,
    #[serde(default)]
    pub factor: Option<f64>,
    #[serde(default)]
    pub low_freq_factor: Option<f64>,
    #[serde(default)]
    pub high_freq_factor: Option<f64>,
    #[serde(default)]
    pub original_max_position_embeddings: Option<f64>,
}

/// Whether a manifest-position file is a Genie config: a JSON object whose only top-level
/// key is `dialog`.
pub fn looks_like_genie(doc: &serde_json::Value) -> bool {
    doc.as_object()
        .is_some_and(|o| o.len() == 1 && o.contains_key("dialog"))
}

/// What qhx takes from a Genie config, checked and with paths resolved.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub cfg: GenieConfig,
    pub ctx_bins: Vec<PathBuf>,
    pub tokenizer: PathBuf,
    /// Context length the dialog may use (`context.size`).
    pub ctx_size: usize,
    pub vocab: usize,
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    pub pad: Option<u32>,
    /// Head dim (`kv-dim`), when given.
    pub kv_dim: Option<usize>,
    pub rope_theta: f64,
    /// llama3 scaling in the runtime's own terms.
    pub rope_scaling: Option<super::manifest::RopeScaling>,
    pub rope_dim: Option<usize>,
    pub stop: Vec<String>,
    pub max_num_tokens: Option<usize>,
    /// The config's `sampler` block, when it has one.
    pub sampling: Option<Sampling>,
    /// `type: "lade"`: lookahead decoding with the config's values (qhx's defaults for
    /// the ones it leaves out).
    pub lookahead: Option<super::declared::Lookahead>,
}

impl Resolved {
    /// What the config declares, in the shape a manifest's is given too (a Genie config
    /// carries no chat template of its own).
    pub fn declared(&self) -> Declared {
        let mut files: Vec<(&'static str, PathBuf)> = self
            .ctx_bins
            .iter()
            .map(|b| ("context binary", b.clone()))
            .collect();
        files.push(("tokenizer", self.tokenizer.clone()));
        Declared {
            files,
            paths_hint: "Genie config paths resolve against the artifacts root",
            max_ctx: self.ctx_size,
            eos: self.eos.clone(),
            tokenizer: self.tokenizer.clone(),
            vocab: self.vocab,
            bos: self.bos,
            sampling: self.sampling.clone(),
            stops: self.stop.clone(),
            template: None,
            lookahead: self.lookahead.clone(),
        }
    }
}

/// A `lade` dialog's lookahead, checked as Genie checks it (version 1, a known update
/// mode, an n-gram of two or more).
fn lade(l: Option<&Lade>) -> std::result::Result<super::declared::Lookahead, String> {
    let d = crate::speculative::LookaheadConfig::default();
    let Some(l) = l else {
        return Ok(super::declared::Lookahead {
            config: d,
            update_mode: None,
        });
    };
    if l.version != 1 {
        return Err(format!(
            "dialog.lade.version {} is not supported (only 1)",
            l.version
        ));
    }
    if let Some(m) = l.update_mode.as_deref() {
        if !["FWD_MAX_HIT", "FWD_LEVEL", "ALWAYS_FWD_ONE"].contains(&m) {
            return Err(format!(
                "dialog.lade.update-mode {m:?} is not one of FWD_MAX_HIT, FWD_LEVEL, ALWAYS_FWD_ONE"
            ));
        }
    }
    let positive = |v: Option<usize>, k: &str, min: usize, def: usize| match v {
        Some(n) if n < min => Err(format!("dialog.lade.{k} {n} is below {min}")),
        Some(n) => Ok(n),
        None => Ok(def),
    };
    Ok(super::declared::Lookahead {
        config: crate::speculative::LookaheadConfig {
            window: positive(l.window, "window", 1, d.window)?,
            ngram: positive(l.ngram, "ngram", 2, d.ngram)?,
            gcap: positive(l.gcap, "gcap", 1, d.gcap)?,
        },
        update_mode: l.update_mode.clone(),
    })
}

impl GenieConfig {
    /// Parse and check `bytes` (the file at `path`); relative paths resolve against `root`.
    pub fn resolve(bytes: &[u8], path: &Path, root: &Path) -> Result<Resolved> {
        let bad = |msg: String| Error::Manifest {
            path: path.to_path_buf(),
            msg,
        };
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let cfg: GenieConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let at = e.path().to_string();
            let inner = e.into_inner();
            bad(if at == "." || at.is_empty() {
                format!("not a Genie config: {inner}")
            } else {
                format!("Genie config {at}: {inner}")
            })
        })?;
        let d = &cfg.dialog;
        if d.kind != "basic" && d.kind != "lade" {
            return Err(bad(format!(
                "dialog.type {:?} is not supported (\"basic\" or \"lade\")",
                d.kind
            )));
        }
        let lookahead = match (d.kind.as_str(), &d.lade) {
            ("lade", l) => Some(lade(l.as_ref()).map_err(&bad)?),
            (_, Some(_)) => {
                return Err(bad(format!(
                    "dialog.lade is for dialog.type \"lade\", not {:?}",
                    d.kind
                )))
            }
            _ => None,
        };
        let be = &d.engine.backend;
        if be.kind != "QnnHtp" {
            return Err(bad(format!(
                "dialog.engine.backend.type {:?} is not supported (only \"QnnHtp\")",
                be.kind
            )));
        }
        if d.engine.model.kind != "binary" {
            return Err(bad(format!(
                "dialog.engine.model.type {:?} is not supported (only \"binary\")",
                d.engine.model.kind
            )));
        }
        if d.engine.model.binary.ctx_bins.is_empty() {
            return Err(bad("dialog.engine.model.binary.ctx-bins is empty".into()));
        }
        let htp = be.qnn_htp.as_ref();
        let pe = d.engine.model.positional_encoding.as_ref();
        if let Some(pe) = pe {
            if pe.kind != "rope" {
                return Err(bad(format!(
                    "positional-encoding type {:?} is not supported (only rope)",
                    pe.kind
                )));
            }
        }
        let rope_theta = pe
            .and_then(|p| p.rope_theta)
            .or(htp.and_then(|h| h.rope_theta))
            .unwrap_or(10000.0);
        let rope_scaling = match pe.and_then(|p| p.rope_scaling.as_ref()) {
            None => None,
            Some(s) if s.rope_type == "default" => None,
            Some(s) if s.rope_type == "llama3" => {
                let need = |v: Option<f64>, k: &str| {
                    v.ok_or_else(|| bad(format!("rope-scaling llama3 needs {k}")))
                };
                Some(super::manifest::RopeScaling {
                    rope_type: "llama3".into(),
                    factor: need(s.factor, "factor")?,
                    low_freq_factor: need(s.low_freq_factor, "low-freq-factor")?,
                    high_freq_factor: need(s.high_freq_factor, "high-freq-factor")?,
                    original_max_position_embeddings: need(
                        s.original_max_position_embeddings,
                        "original-max-position-embeddings",
                    )?,
                })
            }
            Some(s) => {
                return Err(bad(format!(
                    "rope-scaling type {:?} is not supported (default or llama3)",
                    s.rope_type
                )))
            }
        };
        let eos = d.context.eos_token.list();
        let resolve = |p: &Path| {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                root.join(p)
            }
        };
        let sampling = d
            .sampler
            .as_ref()
            .map(Sampler::sampling)
            .transpose()
            .map_err(bad)?;
        Ok(Resolved {
            lookahead,
            ctx_bins: d
                .engine
                .model
                .binary
                .ctx_bins
                .iter()
                .map(|p| resolve(p))
                .collect(),
            tokenizer: resolve(&d.tokenizer.path),
            ctx_size: d.context.size,
            vocab: d.context.n_vocab,
            bos: d.context.bos_token.and_then(|i| u32::try_from(i).ok()),
            eos,
            pad: d.context.pad_token.and_then(|i| u32::try_from(i).ok()),
            kv_dim: htp.and_then(|h| h.kv_dim),
            rope_theta,
            rope_scaling,
            rope_dim: pe.and_then(|p| p.rope_dim),
            stop: d
                .stop_sequence
                .as_ref()
                .map(|s| s.list())
                .unwrap_or_default(),
            max_num_tokens: d.max_num_tokens,
            sampling,
            cfg,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> serde_json::Value {
        serde_json::json!({"dialog": {
            "version": 1, "type": "basic", "max-num-tokens": 200,
            "context": {"version": 1, "size": 128, "n-vocab": 1000, "bos-token": 1,
                        "eos-token": [2, 3]},
            "tokenizer": {"version": 1, "path": "tokenizer.json"},
            "sampler": {"version": 1, "seed": 42, "temp": 0.8, "top-k": 40, "top-p": 0.95},
            "engine": {"version": 1, "n-threads": 3,
                "backend": {"version": 1, "type": "QnnHtp",
                    "QnnHtp": {"version": 1, "spill-fill-bufsize": 0, "use-mmap": true,
                               "mmap-budget": 0, "poll": true, "cpu-mask": "0xe0",
                               "kv-dim": 16, "allow-async-init": false}},
                "model": {"version": 1, "type": "binary",
                    "binary": {"version": 1, "ctx-bins": ["a.bin", "b.bin"]},
                    "positional-encoding": {"type": "rope", "rope-dim": 8,
                        "rope-theta": 500000,
                        "rope-scaling": {"rope-type": "llama3", "factor": 8.0,
                            "low-freq-factor": 1.0, "high-freq-factor": 4.0,
                            "original-max-position-embeddings": 8192}}}}}})
    }

    fn resolve(v: &serde_json::Value) -> Result<Resolved> {
        GenieConfig::resolve(
            v.to_string().as_bytes(),
            Path::new("/b/genie_config.json"),
            Path::new("/b"),
        )
    }

    #[test]
    fn a_full_config_resolves() {
        let v = sample();
        assert!(looks_like_genie(&v));
        let r = resolve(&v).unwrap();
        assert_eq!(
            r.ctx_bins,
            vec![PathBuf::from("/b/a.bin"), "/b/b.bin".into()]
        );
        assert_eq!(r.tokenizer, PathBuf::from("/b/tokenizer.json"));
        assert_eq!((r.ctx_size, r.vocab, r.bos), (128, 1000, Some(1)));
        assert_eq!(r.eos, vec![2, 3]);
        assert_eq!(r.kv_dim, Some(16));
        assert_eq!(r.rope_theta, 500000.0);
        assert_eq!(r.rope_scaling.unwrap().factor, 8.0);
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_path() {
        let mut v = sample();
        v["dialog"]["engine"]["backend"]["QnnHtp"]["kv-dims"] = 16.into();
        let e = resolve(&v).unwrap_err().to_string();
        assert!(
            e.contains("dialog.engine.backend.QnnHtp") && e.contains("kv-dims"),
            "{e}"
        );
        let mut v = sample();
        v["dialog"]["contxt"] = serde_json::json!({});
        assert!(resolve(&v).unwrap_err().to_string().contains("contxt"));
    }

    #[test]
    fn unsupported_kinds_are_named() {
        let mut v = sample();
        v["dialog"]["engine"]["backend"]["type"] = "QnnGpu".into();
        assert!(resolve(&v).unwrap_err().to_string().contains("QnnGpu"));
        let mut v = sample();
        v["dialog"]["engine"]["model"]["positional-encoding"]["rope-scaling"]["rope-type"] =
            "longrope".into();
        assert!(resolve(&v).unwrap_err().to_string().contains("longrope"));
        assert!(!looks_like_genie(&serde_json::json!({"model": {}})));
    }

    #[test]
    fn the_sampler_block_maps_onto_qhx_settings() {
        let r = resolve(&sample()).unwrap();
        let s = r.sampling.unwrap();
        let want = SamplerConfig {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            seed: Some(42),
            ..Default::default()
        };
        assert_eq!(s.config, want);
        assert!(s.ignored.is_empty());
        // greedy wins over the other values; penalties map, unsupported ones are named.
        let mut v = sample();
        v["dialog"]["sampler"]["greedy"] = true.into();
        v["dialog"]["sampler"]["token-penalty"] = serde_json::json!({
            "penalize-last-n": 32, "repetition-penalty": 1.2, "presence-penalty": 0.5});
        let s = resolve(&v).unwrap().sampling.unwrap();
        assert!(s.config.is_greedy());
        assert_eq!((s.config.repeat_penalty, s.config.repeat_last_n), (1.2, 32));
        assert_eq!(
            s.ignored,
            ["dialog.sampler.token-penalty.presence-penalty 0.5"]
        );
        // Missing values are neutral; no block, no sampling.
        let mut v = sample();
        v["dialog"]["sampler"] = serde_json::json!({"version": 1});
        let s = resolve(&v).unwrap().sampling.unwrap();
        assert_eq!(
            (s.config.temp, s.config.top_k, s.config.top_p),
            (1.0, 0, 1.0)
        );
        assert_eq!(s.config.seed, None);
        let mut v = sample();
        v["dialog"].as_object_mut().unwrap().remove("sampler");
        assert!(resolve(&v).unwrap().sampling.is_none());
    }

    #[test]
    fn bad_sampler_values_name_their_key() {
        for (key, val, named) in [
            ("top-p", serde_json::json!(0.0), "dialog.sampler.top-p"),
            ("temp", serde_json::json!(-1.0), "dialog.sampler.temp"),
            ("type", serde_json::json!("custom"), "dialog.sampler.type"),
        ] {
            let mut v = sample();
            v["dialog"]["sampler"][key] = val;
            let e = resolve(&v).unwrap_err().to_string();
            assert!(e.contains(named), "{e}");
        }
        let mut v = sample();
        v["dialog"]["sampler"]["token-penalty"] = serde_json::json!({"repetition-penalty": 0.0});
        let e = resolve(&v).unwrap_err().to_string();
        assert!(
            e.contains("dialog.sampler.token-penalty.repetition-penalty"),
            "{e}"
        );
    }
}
