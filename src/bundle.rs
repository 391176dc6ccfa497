//! A bundle as the command line sees it: a qhx manifest bundle or a Qualcomm Genie bundle
//! (`genie_config.json`), told apart by the file given in the manifest position.

use crate::chat::{BundleIds, ChatTemplate};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::genie::{self, GenieModel};
use crate::manifest::Manifest;
use crate::model::{LoadOptions, Model};
use crate::qnn::Runtime;
use crate::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The bundle description, read and checked before anything is loaded.
#[derive(Debug)]
pub enum Spec {
    Manifest(Box<Manifest>),
    Genie {
        config: PathBuf,
        root: PathBuf,
        cfg: Box<genie::Resolved>,
    },
}

impl Spec {
    /// Read `path`: a Genie config (one top-level `dialog` object) or a qhx manifest.
    pub fn load(path: &Path, root: &Path) -> Result<Spec> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let is_genie = serde_json::from_slice::<serde_json::Value>(&bytes)
            .is_ok_and(|v| genie::looks_like_genie(&v));
        if is_genie {
            let cfg = genie::GenieConfig::resolve(&bytes, path, root)?;
            Ok(Spec::Genie {
                config: path.to_path_buf(),
                root: root.to_path_buf(),
                cfg: Box::new(cfg),
            })
        } else {
            Ok(Spec::Manifest(Box::new(Manifest::parse(
                &bytes, path, root,
            )?)))
        }
    }

    /// Every file the bundle names exists: checked before anything loads, so a missing
    /// binary costs milliseconds, not a backend start.
    pub fn check_files(&self) -> Result<()> {
        let (files, hint): (Vec<(&str, &PathBuf)>, &str) = match self {
            Spec::Manifest(m) => {
                let mut v = vec![("tokenizer", &m.tokenizer), ("embedding table", &m.embed)];
                for (what, r) in m
                    .prefill
                    .iter()
                    .map(|r| ("prefill binary", r))
                    .chain([("decode binary", &m.decode), ("lm-head binary", &m.lmhead)])
                {
                    v.push((what, &r.bin));
                }
                (v, "artifact paths resolve against the artifacts root")
            }
            Spec::Genie { cfg, .. } => {
                let mut v: Vec<(&str, &PathBuf)> =
                    cfg.ctx_bins.iter().map(|b| ("context binary", b)).collect();
                v.push(("tokenizer", &cfg.tokenizer));
                (v, "Genie config paths resolve against the artifacts root")
            }
        };
        for (what, p) in files {
            if !p.is_file() {
                return Err(Error::File {
                    path: p.clone(),
                    msg: format!("{what} not found ({hint})"),
                });
            }
        }
        Ok(())
    }

    /// The context length the description allows (the graphs may shorten it at load).
    pub fn max_ctx(&self) -> usize {
        match self {
            Spec::Manifest(m) => m.params.max_ctx,
            Spec::Genie { cfg, .. } => cfg.ctx_size,
        }
    }

    /// The end tokens the description declares (the tokenizer may add well-known ones).
    pub fn declared_eos(&self) -> &[u32] {
        match self {
            Spec::Manifest(m) => &m.eos,
            Spec::Genie { cfg, .. } => &cfg.eos,
        }
    }

    /// The tokenizer file.
    pub fn tokenizer_path(&self) -> &Path {
        match self {
            Spec::Manifest(m) => &m.tokenizer,
            Spec::Genie { cfg, .. } => &cfg.tokenizer,
        }
    }

    /// Rows of the token space (ids must be below it).
    pub fn vocab(&self) -> usize {
        match self {
            Spec::Manifest(m) => m.params.vocab,
            Spec::Genie { cfg, .. } => cfg.vocab,
        }
    }

    /// BOS prepended to a raw text prompt (Genie prepends its bos-token to every query).
    pub fn bos(&self) -> Option<u32> {
        match self {
            Spec::Manifest(m) => m.params.bos_token_id,
            Spec::Genie { cfg, .. } => cfg.bos,
        }
    }

    /// The sampling the bundle itself asks for (a Genie config's `sampler` block).
    pub fn sampling(&self) -> Option<&genie::config::Sampling> {
        match self {
            Spec::Manifest(_) => None,
            Spec::Genie { cfg, .. } => cfg.sampling.as_ref(),
        }
    }

    /// Stop strings the bundle itself declares (Genie's stop-sequence).
    pub fn stops(&self) -> Vec<String> {
        match self {
            Spec::Manifest(_) => Vec::new(),
            Spec::Genie { cfg, .. } => cfg.stop.clone(),
        }
    }

    /// The chat template: the manifest's, else the tokenizer's (Genie configs carry none).
    pub fn chat_template(&self, tok: Option<&Tokenizer>) -> Result<ChatTemplate> {
        match self {
            Spec::Manifest(m) => ChatTemplate::for_bundle(m, tok),
            Spec::Genie { config, cfg, .. } => ChatTemplate::from_sources(
                None,
                config,
                &cfg.tokenizer,
                BundleIds {
                    bos: cfg.bos,
                    eos: cfg.eos.first().copied(),
                },
                tok,
            ),
        }
    }
}

/// What a directory given in the manifest's place holds.
#[derive(Debug, PartialEq, Eq)]
pub enum BundleDir {
    /// The bundle description to read: the alphabetically first `.json` that is a qhx
    /// manifest or a Genie config.
    File(PathBuf),
    /// One subdirectory per HTP arch (`v73/`, `v79/`, …), each a bundle of its own.
    PerArch(Vec<(u32, PathBuf)>),
}

/// Whether `v` is a bundle description: a Genie config or a qhx manifest.
fn is_description(v: &serde_json::Value) -> bool {
    genie::looks_like_genie(v) || v.get("schema_version").is_some() && v.get("artifacts").is_some()
}

/// Look inside a bundle directory given where the manifest goes (the SDK takes a directory).
pub fn bundle_dir(dir: &Path) -> Result<BundleDir> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut jsons = Vec::new();
    let mut arches = Vec::new();
    for e in entries {
        let e = e.map_err(|e| Error::io(dir, e))?;
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            let arch = name.strip_prefix('v').and_then(|n| n.parse::<u32>().ok());
            if let Some(a) = arch.filter(|_| name.len() == 3) {
                arches.push((a, p));
            }
        } else if name.ends_with(".json") {
            jsons.push(p);
        }
    }
    jsons.sort();
    for p in &jsons {
        let is_bundle = std::fs::read(p)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| is_description(&v));
        if is_bundle {
            return Ok(BundleDir::File(p.clone()));
        }
    }
    if !arches.is_empty() {
        arches.sort();
        return Ok(BundleDir::PerArch(arches));
    }
    Err(Error::File {
        path: dir.to_path_buf(),
        msg: format!(
            "is a directory with no bundle in it (looked for a qhx manifest or genie_config.json among {} .json file{} and for arch directories v73/ … v81/)",
            jsons.len(),
            if jsons.len() == 1 { "" } else { "s" }
        ),
    })
}

/// The arch directory of a per-arch bundle that matches the device's HTP arch.
pub fn pick_arch(dir: &Path, arches: &[(u32, PathBuf)], device: Option<u32>) -> Result<PathBuf> {
    let have: Vec<String> = arches.iter().map(|(a, _)| format!("v{a}")).collect();
    let Some(d) = device else {
        return Err(Error::File {
            path: dir.to_path_buf(),
            msg: format!(
                "holds one bundle per arch ({}) and the backend does not report its arch; pass the arch directory",
                have.join(", ")
            ),
        });
    };
    arches
        .iter()
        .find(|(a, _)| *a == d)
        .map(|(_, p)| p.clone())
        .ok_or_else(|| Error::File {
            path: dir.to_path_buf(),
            msg: format!(
                "has no bundle for this device's v{d} (it has {}); pass the arch directory to run another",
                have.join(", ")
            ),
        })
}

/// The device's HTP arch (e.g. 79), from a backend opened only to ask.
pub fn device_arch(backend: &Path, system: &Path) -> Result<Option<u32>> {
    Ok(Runtime::new(backend, system, 0)?.device_facts.dsp_arch)
}

/// A loaded bundle: contexts created, tokenizer ready.
/// Cheap to clone: the model is shared (`Arc`), and every [`Engine`] made from it holds
/// its own reference, so sessions may outlive the `Loaded` value and move between threads.
#[derive(Clone)]
pub enum Loaded {
    Manifest(Arc<Model>),
    Genie(Arc<GenieModel>),
}

impl Loaded {
    pub fn load(spec: &Spec, backend: &Path, system: &Path, opts: &LoadOptions) -> Result<Loaded> {
        Ok(match spec {
            Spec::Manifest(m) => {
                Loaded::Manifest(Arc::new(Model::load((**m).clone(), backend, system, opts)?))
            }
            Spec::Genie { config, root, .. } => Loaded::Genie(Arc::new(GenieModel::load(
                config, root, backend, system, opts,
            )?)),
        })
    }

    pub fn engine(&self) -> Result<Engine> {
        match self {
            Loaded::Manifest(m) => Engine::new(m),
            Loaded::Genie(g) => Engine::genie(g),
        }
    }

    /// The resolved graph plan (what the runner executes).
    pub fn plan(&self) -> &Arc<crate::plan::Plan> {
        match self {
            Loaded::Manifest(m) => &m.plan,
            Loaded::Genie(g) => &g.plan,
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        match self {
            Loaded::Manifest(m) => &m.tokenizer,
            Loaded::Genie(g) => &g.tokenizer,
        }
    }

    pub fn eos(&self) -> Vec<u32> {
        match self {
            Loaded::Manifest(m) => m.eos.clone(),
            Loaded::Genie(g) => g.eos(),
        }
    }

    pub fn max_ctx(&self) -> usize {
        match self {
            Loaded::Manifest(m) => m.max_ctx,
            Loaded::Genie(g) => g.max_ctx(),
        }
    }

    pub fn rt(&self) -> &Arc<Runtime> {
        match self {
            Loaded::Manifest(m) => &m.rt,
            Loaded::Genie(g) => &g.rt,
        }
    }

    pub fn context_ms(&self) -> &[(PathBuf, f64)] {
        match self {
            Loaded::Manifest(m) => &m.context_ms,
            Loaded::Genie(g) => &g.context_ms,
        }
    }

    pub fn warnings(&self) -> &[String] {
        match self {
            Loaded::Manifest(m) => &m.warnings,
            Loaded::Genie(g) => &g.warnings,
        }
    }

    pub fn rpcmem_note(&self) -> Option<&str> {
        match self {
            Loaded::Manifest(m) => m.rpcmem_note.as_deref(),
            Loaded::Genie(g) => g.rpcmem_note.as_deref(),
        }
    }

    /// The manifest bundle's model, when it is one.
    pub fn model(&self) -> Option<&Model> {
        match self {
            Loaded::Manifest(m) => Some(m),
            Loaded::Genie(_) => None,
        }
    }
}
