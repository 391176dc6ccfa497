//! Typed errors of the qhx library. Every variant names the file, graph or tensor at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Load(#[from] qnn_sys::LoadError),

    #[error("{step}: {status}{}", hint.as_ref().map(|h| format!(" — hint: {h}")).unwrap_or_default())]
    Qnn {
        /// What was being done, e.g. "creating context from smollm2_decode.bin".
        step: String,
        status: qnn_sys::QnnStatus,
        hint: Option<String>,
    },

    #[error("{step}: the backend does not provide {entry}")]
    MissingEntry { step: String, entry: &'static str },

    #[error("manifest {}: {msg}", path.display())]
    Manifest { path: PathBuf, msg: String },

    #[error("{}: {msg}", path.display())]
    File { path: PathBuf, msg: String },

    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("graph {graph}: {msg}")]
    Graph { graph: String, msg: String },

    #[error("tokenizer {}: {msg}", path.display())]
    Tokenizer { path: PathBuf, msg: String },

    #[error("{0}")]
    Input(String),

    #[error(
        "non-finite values in {what} at step {step} (position {pos}, graph {graph}){}",
        hint
    )]
    NonFinite {
        what: &'static str,
        step: usize,
        pos: usize,
        graph: String,
        hint: &'static str,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
    pub fn graph(graph: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Graph {
            graph: graph.into(),
            msg: msg.into(),
        }
    }
}
