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

/// A loaded bundle: contexts created, tokenizer ready.
pub enum Loaded {
    Manifest(Box<Model>),
    Genie(Box<GenieModel>),
}

impl Loaded {
    pub fn load(spec: &Spec, backend: &Path, system: &Path, opts: &LoadOptions) -> Result<Loaded> {
        Ok(match spec {
            Spec::Manifest(m) => {
                Loaded::Manifest(Box::new(Model::load((**m).clone(), backend, system, opts)?))
            }
            Spec::Genie { config, root, .. } => Loaded::Genie(Box::new(GenieModel::load(
                config, root, backend, system, opts,
            )?)),
        })
    }

    pub fn engine(&self) -> Result<Engine<'_>> {
        match self {
            Loaded::Manifest(m) => Engine::new(m),
            Loaded::Genie(g) => Engine::genie(g),
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
