//! Qualcomm Genie bundles (AI Hub's `genie_config.json` + context binaries): the config,
//! the graphs discovered from the binaries, and the token loop's graph side.

pub mod config;
pub mod model;
pub mod runner;

pub use config::{looks_like_genie, GenieConfig, Resolved};
pub use model::GenieModel;
pub use runner::GenieRunner;
