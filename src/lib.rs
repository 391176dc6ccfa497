//! qhx: an LLM runtime for the Qualcomm Hexagon NPU that runs QNN context-binary bundles.
//!
//! The host does what the graphs cannot: embedding lookup, RoPE tables, attention masks,
//! KV bookkeeping, sampling and detokenization. [`model`] loads a bundle through QNN,
//! [`engine`] runs the token loop, [`qnn`] is the safe wrapper over `qnn-sys`.

pub mod cancel;
pub mod chat;
pub mod cli;
pub mod engine;
pub mod envcheck;
pub mod error;
pub mod interactive;
pub mod kv;
pub mod manifest;
pub mod model;
pub mod ops;
pub mod qnn;
pub mod reasoning;
pub mod sampler;
pub mod stats;
pub mod stop;
pub mod tokenizer;

pub use error::{Error, Result};
