//! The Genie path on the CPU: Genie-named graphs served by the emulator (FORMAT.md `kind:
//! genie`), driven through the unchanged qhx_generate binary by a `genie_config.json`.

mod common;

use common::*;
use qnn_emu::writer::{write_genie_bundle, SynthSpec};
use std::path::PathBuf;

/// A Genie bundle of `spec`'s weights with a prompt variant of AR `ar` and the decode AR-1.
fn genie_bundle(tag: &str, spec: &SynthSpec, ar: usize) -> (PathBuf, PathBuf) {
    let d = tmp(tag);
    let cfg = write_genie_bundle(&d, spec, &[ar, 1]).expect("write genie bundle");
    (d, cfg)
}

fn run_ok(
    cfg: &std::path::Path,
    dir: &std::path::Path,
    n: &str,
    prompt: &str,
) -> serde_json::Value {
    let o = generate(cfg, dir, n, prompt, &["--json"], &[]);
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        stderr(&o)
    );
    json(&o)
}

/// The same weights as a manifest bundle (prefill + decode + lm-head graphs, host
/// embedding, -inf masks) and as a Genie bundle (ids in, logits out, left-padded prompt
/// chunks, -1000 masks, transposed keys): the greedy continuation is the same, so the Genie
/// runner's masks, RoPE rows and K/V copies line up with the manifest path's.
#[test]
fn genie_bundle_continues_like_the_manifest_bundle() {
    let spec = SynthSpec::default();
    // 23 prompt tokens: five full AR-4 chunks, one left-padded chunk of 3, then AR-1 decode.
    let prompt = "hello there, tiny model";
    let (md, m) = bundle("genie-ref-manifest", &spec);
    let a = run_ok(&m, &md, "12", prompt);
    let (gd, g) = genie_bundle("genie-ref-genie", &spec, 4);
    let b = run_ok(&g, &gd, "12", prompt);
    assert_eq!(ids(&a, "input_ids"), ids(&b, "input_ids"));
    assert_eq!(ids(&b, "output_ids").len(), 12);
    assert_eq!(ids(&a, "output_ids"), ids(&b, "output_ids"));
    // Another prompt gives another continuation (the output is not prompt-independent).
    let c = run_ok(&g, &gd, "12", "a different prompt");
    assert_ne!(ids(&b, "output_ids"), ids(&c, "output_ids"));
}

/// `--allow-nonfinite` reaches the Genie runner: NaN logits stop the run without it and
/// are sampled through with it (before, Genie bundles failed either way).
#[test]
fn genie_bundle_honours_allow_nonfinite() {
    let (d, g) = genie_bundle("genie-nan", &SynthSpec::default(), 4);
    // The third Genie execute writes NaN everywhere (prompt "hi": one AR-4 step, then decode).
    let env = [("QNN_EMU_NAN", "genie@2")];
    let o = generate(&g, &d, "4", "hi", &["--json"], &env);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("non-finite"), "{}", stderr(&o));
    let o = generate(&g, &d, "4", "hi", &["--json", "--allow-nonfinite"], &env);
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        stderr(&o)
    );
    assert_eq!(ids(&json(&o), "output_ids").len(), 4);
}
