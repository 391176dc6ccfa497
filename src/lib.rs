//! qhx: an LLM runtime for the Qualcomm Hexagon NPU that runs QNN context-binary bundles.
//!
//! The host does what the graphs cannot: embedding lookup, RoPE tables, attention masks,
//! KV bookkeeping, sampling and detokenization. [`model`] and [`genie`] load a bundle
//! through QNN and resolve its graphs into a [`plan`], [`runner`] executes a plan,
//! [`engine`] runs the token loop over it, [`qnn`] is the safe wrapper over `qnn-sys`.

#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod bench;
pub mod bundle;
pub mod cancel;
pub mod chat;
pub mod cli;
pub mod engine;
pub mod envcheck;
pub mod error;
pub mod genie;
pub mod grammar;
pub mod interactive;
pub mod kv;
pub mod manifest;
pub mod model;
pub mod ops;
pub mod plan;
// The one module allowed `unsafe`: the safe wrapper over qnn-sys.
#[allow(unsafe_code)]
pub mod qnn;
pub mod reasoning;
pub mod runner;
pub mod sampler;
pub mod spec;
pub mod stats;
pub mod stop;
pub mod text;
pub mod tokenizer;
pub mod tools;

pub use error::{Error, Result};

/// `eprintln!` that never panics: when stderr is closed or its reader went away
/// (`-v 2>&1 | head -1`) the line is dropped instead of aborting the run.
#[macro_export]
macro_rules! elog {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr().lock(), $($arg)*);
    }};
}
