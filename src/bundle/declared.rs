//! What a bundle description declares, in one shape for a qhx manifest and a Genie config:
//! the floor both descriptions write into and everything above reads, so neither
//! description imports the bundle facade.

use crate::sampler::SamplerConfig;
use std::path::PathBuf;

/// What a bundle description declares, before any binary is opened.
#[derive(Debug, Clone)]
pub struct Declared {
    /// Every file it names, with what the file is.
    pub files: Vec<(&'static str, PathBuf)>,
    /// How those paths resolve (said when one is missing).
    pub paths_hint: &'static str,
    /// The context length it allows (the graphs may shorten it at load).
    pub max_ctx: usize,
    /// The end tokens it declares (the tokenizer may add well-known ones).
    pub eos: Vec<u32>,
    pub tokenizer: PathBuf,
    /// Rows of the token space (ids must be below it).
    pub vocab: usize,
    /// BOS prepended to a raw text prompt (Genie prepends its bos-token to every query).
    pub bos: Option<u32>,
    /// The sampling the bundle itself asks for (a Genie config's `sampler` block).
    pub sampling: Option<Sampling>,
    /// Stop strings the bundle itself declares (Genie's stop-sequence).
    pub stops: Vec<String>,
    /// A chat template the description carries itself (a manifest's `chat.template`), with
    /// the file it came from.
    pub template: Option<(String, PathBuf)>,
    /// Speculation the bundle asks for (a Genie `lade` dialog).
    pub lookahead: Option<Lookahead>,
}

/// A Genie `lade` dialog's lookahead, in qhx's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Lookahead {
    pub config: crate::speculative::LookaheadConfig,
    /// The config's `update-mode`, when given. qhx's one-level window always moves
    /// forward by the verify's hits (FWD_MAX_HIT); output does not depend on it.
    pub update_mode: Option<String>,
}

/// The sampling a Genie `sampler` block asks for, in qhx's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    pub config: SamplerConfig,
    /// Settings qhx does not implement, each with its value (warned about, then ignored).
    pub ignored: Vec<String>,
}
