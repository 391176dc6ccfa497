//! Qualcomm Genie bundles (AI Hub's `genie_config.json` + context binaries): the config,
//! the graphs discovered from the binaries (resolved into a plan by `plan::genie`).

pub mod config;
pub mod model;

pub use config::{looks_like_genie, GenieConfig, Resolved};
pub use model::load;
