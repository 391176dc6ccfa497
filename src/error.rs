//! Typed errors of the qhx library. Every variant names the file, graph or tensor at fault.
//!
//! Each cause is printed once: a variant either shows its cause in its message or returns it
//! from `source()`, never both (so `{:#}` chains read `a: b: c` without repeats).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Load(#[from] qnn_sys::LoadError),

    /// A QNN call returned an error status (shown in the message, not as a source).
    #[error("{step}: {status}{}", hint.as_ref().map(|h| format!(" — hint: {h}")).unwrap_or_default())]
    Qnn {
        /// What was being done, e.g. "creating context from smollm2_decode.bin".
        step: String,
        status: qnn_sys::QnnStatus,
        hint: Option<String>,
    },

    #[error("{step}: the backend does not provide {entry}")]
    MissingEntry { step: String, entry: &'static str },

    /// The backend answered a call with something unusable (e.g. a NULL table).
    #[error("{lib}: {msg}")]
    Backend { lib: String, msg: String },

    #[error("manifest {}: {msg}", path.display())]
    Manifest { path: PathBuf, msg: String },

    #[error("{}: {msg}", path.display())]
    File { path: PathBuf, msg: String },

    /// An I/O error on `path`; the OS message comes from `source()`.
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("graph {graph}: {msg}")]
    Graph { graph: String, msg: String },

    #[error("tokenizer {}: {msg}", path.display())]
    Tokenizer { path: PathBuf, msg: String },

    #[error("the prompt encodes to zero tokens")]
    EmptyPrompt,

    #[error(
        "the prompt is {tokens} tokens but only {free} of max_ctx {max_ctx} positions are free"
    )]
    PromptTooLong {
        tokens: usize,
        free: usize,
        max_ctx: usize,
    },

    /// A prompt that fills a fresh context: nothing could be generated after it.
    #[error(
        "the prompt is {tokens} tokens, which leaves no room in max_ctx {max_ctx} to generate"
    )]
    NoRoom { tokens: usize, max_ctx: usize },

    #[error("token id {id} is outside the embedding table ({vocab} rows, {})", path.display())]
    TokenOutOfRange {
        id: u32,
        vocab: usize,
        path: PathBuf,
    },

    /// A structured-output grammar or JSON schema that does not compile or cannot continue.
    #[error("structured output: {0}")]
    Grammar(String),

    /// The load was cancelled (Ctrl-C) before it finished.
    #[error("cancelled while loading")]
    Cancelled,

    /// A worker thread (context or tokenizer loading) panicked.
    #[error("the {0} thread panicked")]
    ThreadPanicked(&'static str),

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

#[cfg(test)]
mod tests {
    use super::*;

    /// `{:#}` of the error and its source chain, as the binaries print it.
    fn chain(e: &(dyn std::error::Error + 'static)) -> String {
        let mut s = e.to_string();
        let mut src = e.source();
        while let Some(c) = src {
            s.push_str(&format!(": {c}"));
            src = c.source();
        }
        s
    }

    #[test]
    fn an_os_error_is_printed_once() {
        let e = Error::io(
            "/no/such",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        let text = chain(&e);
        assert_eq!(text.matches("not found").count(), 1, "{text}");
        let raw = std::io::Error::from_raw_os_error(2);
        let text = chain(&Error::io("/no/such", raw));
        assert_eq!(text.matches("os error 2").count(), 1, "{text}");
    }
}
