//! Tensor names under the resolvers' naming contracts, for tools that see a binary without
//! its bundle.

use super::genie;
use super::Source;

/// What a tensor named `name` feeds or holds under one of the resolvers' naming contracts
/// (a qhx manifest's default names, or Genie's), for tools that see a binary without its
/// bundle (`qhx_inspect`). `None` for names neither contract gives a fixed meaning: a
/// manifest's `y` is hidden rows or logits depending on the graph.
pub fn contract_role(name: &str, input: bool) -> Option<&'static str> {
    let layered = |role: &str| {
        name.strip_prefix(role)
            .and_then(|r| r.strip_prefix('_'))
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
    };
    let manifest = if input {
        match name {
            "x" => Some("hidden state in"),
            "cos" => Some("RoPE cos"),
            "sin" => Some("RoPE sin"),
            "cmask" => Some("attention mask"),
            "cos_local" => Some("RoPE cos, local"),
            "sin_local" => Some("RoPE sin, local"),
            "cmask_local" => Some("window mask"),
            _ if layered("past_k") => Some("past K cache"),
            _ if layered("past_v") => Some("past V cache"),
            _ if layered("past_conv") => Some("conv state in"),
            _ => None,
        }
    } else if layered("new_k") {
        Some("new K rows")
    } else if layered("new_v") {
        Some("new V rows")
    } else if layered("present_conv") {
        Some("conv state out")
    } else if layered("conv_bx") {
        Some("conv seed rows")
    } else {
        None
    };
    manifest.or_else(|| {
        if !input {
            return match genie::kv_name(name, false) {
                Some((true, _)) => Some("new K rows"),
                Some((false, _)) => Some("new V rows"),
                None => (name == "logits").then_some("logits"),
            };
        }
        genie::input_source(name).map(|s| match s {
            Source::TokenIds => "token ids",
            Source::Mask(_) => "attention mask",
            Source::Cos { .. } => "RoPE cos",
            Source::Sin { .. } => "RoPE sin",
            Source::PastKey(_) => "past K cache",
            Source::PastValue(_) => "past V cache",
            _ => "unknown",
        })
    })
}

#[cfg(test)]
mod tests {
    use super::contract_role;

    #[test]
    fn both_contracts_name_their_tensors() {
        for (name, input, want) in [
            ("x", true, Some("hidden state in")),
            ("cmask", true, Some("attention mask")),
            ("past_k_12", true, Some("past K cache")),
            ("past_v_0", true, Some("past V cache")),
            ("cmask_local", true, Some("window mask")),
            ("cos_local", true, Some("RoPE cos, local")),
            ("past_conv_2", true, Some("conv state in")),
            ("present_conv_2", false, Some("conv state out")),
            ("conv_bx_0", false, Some("conv seed rows")),
            ("new_v_3", false, Some("new V rows")),
            ("input_ids", true, Some("token ids")),
            ("position_ids_sin", true, Some("RoPE sin")),
            ("past_key_7_in", true, Some("past K cache")),
            ("past_value_7_out", false, Some("new V rows")),
            ("logits", false, Some("logits")),
            // Not a contract name: a manifest `y`, a layer-less past, an output named x.
            ("y", false, None),
            ("past_k_", true, None),
            ("past_k_1a", true, None),
            ("x", false, None),
        ] {
            assert_eq!(contract_role(name, input), want, "{name} (input {input})");
        }
    }
}
