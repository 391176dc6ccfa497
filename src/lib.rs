//! qhx: an LLM runtime for the Qualcomm Hexagon NPU that runs QNN context-binary bundles.
//!
//! The host does what the graphs cannot: embedding lookup, RoPE tables, attention masks,
//! KV bookkeeping, sampling and detokenization. The modules stand on floors, each using
//! only the floors below it (`scripts/check-layers.sh` holds the table and checks it):
//!
//! 1. leaves: [`error`], [`cancel`], [`stats`], [`sampler`], [`speculative`], [`stop`],
//!    [`grammar`], [`tokenizer`], [`chat`], [`tools`], [`envcheck`], `ops::convert`, and
//!    [`os`] (file maps, stdio);
//! 2. [`qnn`]: the safe wrapper over `qnn-sys`;
//! 3. [`bundle`]: the description (a qhx manifest or a Genie config), no QNN;
//! 4. [`ops`] (embedding, RoPE, masks) and [`kv`];
//! 5. [`plan`]: the graphs resolved, one form for both bundle kinds;
//! 6. [`load`] (the loaders), [`runner`] (executes a plan) and [`draft`] (a draft model
//!    over its own runner, for `--spec draft`);
//! 7. [`engine`]: the token loop;
//! 8. [`text`], [`reasoning`]: text, stops and think blocks over the engine, and
//!    [`session`]: a request composed once, for every front end;
//! 9. [`bench`], [`interactive`]; 10. [`cli`] and the binaries.

#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod bench;
pub mod bundle;
pub mod cancel;
pub mod chat;
pub mod cli;
pub mod draft;
pub mod engine;
pub mod envcheck;
pub mod error;
pub mod grammar;
pub mod interactive;
pub mod kv;
pub mod load;
pub mod ops;
pub mod plan;
// The two modules allowed `unsafe`: the safe wrapper over qnn-sys, and the OS edge
// (file maps, stdio descriptors).
#[allow(unsafe_code)]
pub mod os;
#[allow(unsafe_code)]
pub mod qnn;
pub mod reasoning;
pub mod runner;
pub mod sampler;
pub mod session;
pub mod speculative;
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
