//! `qhx_server`: OpenAI's HTTP API over one loaded qhx bundle. Requests are checked and
//! tokenized by the handlers ([`routes`], [`api`]), queued onto `--parallel` sessions
//! ([`pool`]) and answered as JSON or SSE; [`listen`] owns connections and the drain.

#![forbid(unsafe_code)]

pub mod api;
pub mod error;
pub mod listen;
pub mod metrics;
pub mod pool;
pub mod routes;
