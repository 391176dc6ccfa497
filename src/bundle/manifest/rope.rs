//! A manifest's `rope_scaling` block and which ones this version computes (read by the
//! manifest, its `layers` section and a Genie config alike).

use serde::Deserialize;

/// `rope_scaling` block: `llama3` (all fields) or `linear` (`factor` only).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct RopeScaling {
    pub rope_type: String,
    pub factor: f64,
    #[serde(default)]
    pub low_freq_factor: f64,
    #[serde(default)]
    pub high_freq_factor: f64,
    #[serde(default)]
    pub original_max_position_embeddings: f64,
}

/// A `rope_scaling` block this version computes: llama3's frequency bands or a linear
/// position divisor (Gemma 3's global layers at 4B and up).
pub fn check_scaling(s: &RopeScaling) -> std::result::Result<(), String> {
    match s.rope_type.as_str() {
        "llama3" => {
            if !(s.factor > 0.0
                && s.low_freq_factor > 0.0
                && s.high_freq_factor > s.low_freq_factor
                && s.original_max_position_embeddings > 0.0)
            {
                return Err(
                    "factors must be positive with high_freq_factor > low_freq_factor".into(),
                );
            }
        }
        "linear" => {
            // (NaN fails too: it is not a finite positive number.)
            if !s.factor.is_finite() || s.factor <= 0.0 {
                return Err("factor must be positive".into());
            }
        }
        other => {
            return Err(format!(
                "rope_type {other:?} is not supported (\"llama3\" or \"linear\")"
            ))
        }
    }
    Ok(())
}
