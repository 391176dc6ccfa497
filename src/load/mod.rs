//! Loading a described bundle onto the backend: one loader per description kind
//! ([`manifest`], [`genie`]), both filling the one [`Model`] that everything above runs.

pub mod genie;
pub mod manifest;
mod model;

pub use model::{open_runtime, About, ContextLoad, LoadOptions, Model};

use crate::bundle::{Source, Spec};
use crate::error::Result;
use crate::qnn::Runtime;
use crate::tokenizer::Tokenizer;
use std::path::Path;
use std::sync::Arc;

/// The device's HTP arch (e.g. 79), from a backend opened only to ask.
pub fn device_arch(backend: &Path, system: &Path) -> Result<Option<u32>> {
    Ok(Runtime::new(backend, system, 0)?.device_facts.dsp_arch)
}

/// A loaded bundle: contexts created, tokenizer ready, graphs resolved into a plan.
/// Cheap to clone: the model is shared (`Arc`), and every engine made from it holds
/// its own reference, so sessions may outlive the `Loaded` value and move between threads.
#[derive(Clone)]
pub struct Loaded(pub Arc<Model>);

impl Loaded {
    /// Load with the loader of the description's kind: the one place that asks it.
    pub fn load(spec: &Spec, backend: &Path, system: &Path, opts: &LoadOptions) -> Result<Loaded> {
        let model = match spec.source() {
            Source::Manifest(m) => manifest::load((**m).clone(), backend, system, opts)?,
            Source::Genie(cfg) => genie::load(&spec.path, (**cfg).clone(), backend, system, opts)?,
        };
        Ok(Loaded(Arc::new(model)))
    }

    /// Load onto an open runtime (its libraries, backend, device, performance vote and
    /// rpcmem), as several models share one backend: the C API's one runtime per process.
    /// `opts.runtime` is replaced by `rt`; its library paths and clock settings are unused.
    pub fn load_on(spec: &Spec, rt: &Arc<Runtime>, opts: &LoadOptions) -> Result<Loaded> {
        let opts = LoadOptions {
            runtime: Some(Arc::clone(rt)),
            ..opts.clone()
        };
        // With a runtime given, the loaders open no library: the paths are not read.
        Loaded::load(spec, Path::new(""), Path::new(""), &opts)
    }

    /// The loaded model.
    pub fn model(&self) -> &Arc<Model> {
        &self.0
    }

    /// The resolved graph plan (what the runner executes).
    pub fn plan(&self) -> &Arc<crate::plan::Plan> {
        &self.0.plan
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.0.tokenizer
    }

    pub fn eos(&self) -> Vec<u32> {
        self.0.eos.clone()
    }

    pub fn max_ctx(&self) -> usize {
        self.0.max_ctx
    }

    pub fn rt(&self) -> &Arc<Runtime> {
        &self.0.rt
    }

    pub fn context_ms(&self) -> &[model::ContextStat] {
        &self.0.context_ms
    }

    pub fn warnings(&self) -> &[String] {
        &self.0.warnings
    }

    pub fn rpcmem_note(&self) -> Option<&str> {
        self.0.rpcmem_note.as_deref()
    }
}
