//! What every loader fills: the loaded [`Model`], what it [`About`]s, the load options and
//! opening the runtime they describe.

use crate::error::Result;
use crate::plan::Plan;
use crate::qnn::{self, Runtime};
use crate::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A loaded bundle, whichever kind it was: a qhx manifest and a Genie config each have a
/// loader ([`super::manifest`], [`super::genie`]) that resolves the graphs
/// into a [`Plan`] and fills the rest; nothing after the load asks which kind it was.
/// One context's load: its binary, milliseconds to create it, resident bytes just after.
pub type ContextStat = (PathBuf, f64, Option<u64>);

pub struct Model {
    /// What the bundle is, for the banner and bench rows.
    pub about: About,
    pub rt: Arc<Runtime>,
    /// The graphs, the embedding table and how the host feeds them.
    pub plan: Arc<Plan>,
    pub tokenizer: Tokenizer,
    /// End tokens: the bundle's declared ones plus the tokenizer's well-known end tokens
    /// (manifest), or the config's eos-token(s) and eot-token (Genie).
    pub eos: Vec<u32>,
    /// BOS prepended to a raw text prompt.
    pub bos: Option<u32>,
    /// Effective context length: min(manifest max_ctx, decode graph capacity).
    pub max_ctx: usize,
    pub load_ms: f64,
    /// Per context binary: (file, ms to create).
    /// Per context binary: milliseconds to create its context, and the resident set size
    /// just after (when the system reports it).
    pub context_ms: Vec<ContextStat>,
    /// Why rpcmem is not in use (None when it is loaded).
    pub rpcmem_note: Option<String>,
    /// Problems that did not stop the load (e.g. a refused performance vote).
    pub warnings: Vec<String>,
}

impl Model {
    /// The dtype name of the decode graph's activation input (the bundle's I/O type).
    pub fn io_dtype(&self) -> &'static str {
        self.plan.io_dtypes().0
    }
}

/// What a loaded bundle is, as its loader describes it: the banner's words and the facts a
/// bench row reports. Filled once at load, so the report never asks the bundle kind.
#[derive(Debug, Clone)]
pub struct About {
    /// The manifest or `genie_config.json`.
    pub description: PathBuf,
    /// The banner's model field, e.g. `SmolLM2 (llama, v79)` or `Genie bundle <config>`.
    pub title: String,
    /// The banner's fields after the backend, e.g. `prefill P=64 | ctx 1024 | I/O FLOAT_16`.
    pub details: String,
    /// The bench table's model type, e.g. `SmolLM2 (llama)` or `<bundle dir> (genie)`.
    pub model_type: String,
    /// Files counted in the model size (embedding table and context binaries).
    pub files: Vec<PathBuf>,
    /// Parameters the bundle declares (0 when it does not say).
    pub n_params: u64,
    /// The I/O type for tables (`f16`, `ufixed16/kv ufixed8`).
    pub io_type: String,
    /// The arch and SoC the bundle was compiled for, when it says.
    pub dsp_arch: Option<String>,
    pub soc_model: Option<u32>,
    /// Description keys this version does not read (reported at -v).
    pub unused_keys: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub log_level: u32,
    /// HTP performance vote held while the model is loaded.
    pub perf: qnn::PerfMode,
    /// rpcmem library for zero-copy I/O (`libcdsprpc.so` by default); None disables it.
    pub rpcmem_lib: Option<PathBuf>,
    /// Called with a short stage description as loading proceeds (e.g. a progress line).
    pub progress: Option<fn(&str)>,
    /// How the contexts of a multi-binary bundle are created.
    pub context_load: ContextLoad,
    /// Checked before the backend starts and between contexts: a cancelled load stops
    /// with [`Error::Cancelled`], freeing what it created.
    pub cancel: crate::cancel::CancelToken,
    /// Load onto this open runtime (its libraries, backend, device, performance vote and
    /// rpcmem) instead of opening one: several models then share one backend, as the C
    /// API's one runtime per process does. The backend / system paths and `perf`,
    /// `log_level` and `rpcmem_lib` are then the runtime's, not these.
    pub runtime: Option<Arc<Runtime>>,
}

/// How contexts are created from a bundle's binaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContextLoad {
    /// One after another. The default: the x86 HTP backend crashed intermittently (SIGSEGV,
    /// about 1 run in 30) when two threads were inside `contextCreateFromBinary` at once,
    /// one deserialising a graph while the other set up the backend environment.
    #[default]
    Serial,
    /// The first binary alone (it sets up the backend environment), the rest concurrently,
    /// one thread per binary.
    FirstThenParallel,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            log_level: 0,
            perf: qnn::PerfMode::Burst,
            rpcmem_lib: Some(PathBuf::from(if cfg!(windows) {
                "libcdsprpc.dll"
            } else {
                "libcdsprpc.so"
            })),
            progress: None,
            context_load: ContextLoad::default(),
            cancel: crate::cancel::CancelToken::new(),
            runtime: None,
        }
    }
}

/// Open the libraries, vote for performance and load rpcmem. A refused vote is a warning:
/// the run goes on at the backend's default clocks.
/// `sys`: the system library when it is loaded already (kept, not loaded twice).
pub fn open_runtime(
    backend: &Path,
    sys: Option<qnn::SystemLibrary>,
    system: &Path,
    opts: &LoadOptions,
) -> Result<(Arc<Runtime>, Option<String>, Vec<String>)> {
    if let Some(rt) = &opts.runtime {
        let note = match (&rt.rpcmem, rt.zero_copy_refused()) {
            (None, _) => Some("not loaded by the shared runtime".to_string()),
            (Some(_), refused) => refused.map(str::to_string),
        };
        return Ok((Arc::clone(rt), note, Vec::new()));
    }
    let mut warnings = Vec::new();
    let mut rt = match sys {
        Some(sys) => Runtime::with_system(sys, backend, opts.log_level)?,
        None => Runtime::new(backend, system, opts.log_level)?,
    };
    if let Err(e) = rt.set_perf(opts.perf) {
        warnings.push(format!(
            "the {} performance vote failed, running without one: {e}",
            opts.perf.as_str()
        ));
    }
    let rpcmem_note = match &opts.rpcmem_lib {
        Some(p) => rt.load_rpcmem(p).err(),
        None => Some("disabled".to_string()),
    };
    Ok((Arc::new(rt), rpcmem_note, warnings))
}
