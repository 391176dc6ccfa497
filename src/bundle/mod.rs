//! A bundle as the command line sees it: a qhx manifest bundle or a Qualcomm Genie bundle
//! (`genie_config.json`), told apart by the file given in the manifest position.

pub mod declared;
pub mod genie;
pub mod manifest;

pub use declared::{Declared, Sampling};

use crate::chat::{BundleIds, ChatTemplate};
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use manifest::Manifest;
use std::path::{Path, PathBuf};

/// The bundle description, read and checked before anything is loaded: what it declares,
/// in one shape for a qhx manifest and a Genie config alike, and the description itself,
/// which only the loader reads.
#[derive(Debug)]
pub struct Spec {
    /// The manifest or `genie_config.json`.
    pub path: PathBuf,
    /// The artifacts root its relative paths resolve against.
    pub root: PathBuf,
    pub declared: Declared,
    source: Source,
}

/// The description a [`Spec`] was read from; the loader is picked by it.
#[derive(Debug)]
pub enum Source {
    Manifest(Box<Manifest>),
    Genie(Box<genie::Resolved>),
}

impl Spec {
    /// The description itself, which only the loader reads.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// Read `path`: a Genie config (one top-level `dialog` object) or a qhx manifest.
    pub fn load(path: &Path, root: &Path) -> Result<Spec> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let is_genie = serde_json::from_slice::<serde_json::Value>(&bytes)
            .is_ok_and(|v| genie::looks_like_genie(&v));
        let (declared, source) = if is_genie {
            let cfg = genie::GenieConfig::resolve(&bytes, path, root)?;
            (cfg.declared(), Source::Genie(Box::new(cfg)))
        } else {
            let m = Manifest::parse(&bytes, path, root)?;
            (m.declared(), Source::Manifest(Box::new(m)))
        };
        Ok(Spec {
            path: path.to_path_buf(),
            root: root.to_path_buf(),
            declared,
            source,
        })
    }

    /// Every file the bundle names exists: checked before anything loads, so a missing
    /// binary costs milliseconds, not a backend start.
    pub fn check_files(&self) -> Result<()> {
        for (what, p) in &self.declared.files {
            if !p.is_file() {
                return Err(Error::File {
                    path: p.clone(),
                    msg: format!("{what} not found ({})", self.declared.paths_hint),
                });
            }
        }
        Ok(())
    }

    /// The context length the description allows (the graphs may shorten it at load).
    pub fn max_ctx(&self) -> usize {
        self.declared.max_ctx
    }

    /// The end tokens the description declares (the tokenizer may add well-known ones).
    pub fn declared_eos(&self) -> &[u32] {
        &self.declared.eos
    }

    /// The tokenizer file.
    pub fn tokenizer_path(&self) -> &Path {
        &self.declared.tokenizer
    }

    /// Rows of the token space (ids must be below it).
    pub fn vocab(&self) -> usize {
        self.declared.vocab
    }

    /// BOS prepended to a raw text prompt.
    pub fn bos(&self) -> Option<u32> {
        self.declared.bos
    }

    /// The sampling the bundle itself asks for (a Genie config's `sampler` block).
    pub fn sampling(&self) -> Option<&Sampling> {
        self.declared.sampling.as_ref()
    }

    /// Lookahead decoding the bundle itself asks for (a Genie `lade` dialog).
    pub fn lookahead(&self) -> Option<&declared::Lookahead> {
        self.declared.lookahead.as_ref()
    }

    /// Stop strings the bundle itself declares (Genie's stop-sequence).
    pub fn stops(&self) -> Vec<String> {
        self.declared.stops.clone()
    }

    /// The token vocabulary structured output constrains: the tokenizer's pieces over the
    /// model's vocab, with the bundle's end token as the grammar's end.
    pub fn grammar_vocab(&self) -> Result<crate::grammar::Vocab> {
        let eos = *self.declared_eos().first().ok_or_else(|| Error::Manifest {
            path: self.path.clone(),
            msg: "structured output needs the bundle's end token (params.eos_token_id)".into(),
        })?;
        crate::grammar::Vocab::load(self.tokenizer_path(), self.vocab(), eos)
    }

    /// The chat template: the description's own, else the tokenizer's.
    pub fn chat_template(&self, tok: Option<&Tokenizer>) -> Result<ChatTemplate> {
        let d = &self.declared;
        let ids = BundleIds {
            bos: d.bos,
            eos: d.eos.first().copied(),
        };
        let genie = matches!(self.source, Source::Genie(_));
        ChatTemplate::from_sources(
            d.template.clone(),
            &self.path,
            genie,
            &d.tokenizer,
            ids,
            tok,
        )
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
