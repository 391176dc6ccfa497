//! SmolLM2-135M-Instruct with real weights, through the real binary and the emulator,
//! against HF transformers' greedy ids (tests/goldens/smollm2_paris.json).
//!
//! The bundle is built by scripts/build-bundle.sh (scripts/test.sh runs it first and sets
//! QHX_SMOLLM2_BUNDLE). A missing bundle is a failure, not a skip.

mod common;

use common::*;
use std::path::PathBuf;

fn bundle_dir() -> PathBuf {
    smollm2_dir()
}

#[test]
fn greedy_ids_match_hf_transformers() {
    let g: serde_json::Value =
        serde_json::from_str(include_str!("goldens/smollm2_paris.json")).unwrap();
    let d = bundle_dir();
    let o = generate(
        &d.join("smollm2.json"),
        &d,
        "24",
        g["prompt"].as_str().unwrap(),
        &["--json"],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(ids(&v, "input_ids"), ids(&g, "input_ids"));
    let out = ids(&v, "output_ids");
    let gold = ids(&g, "gold_ids_prefix");
    assert_eq!(&out[..gold.len()], gold.as_slice(), "full output {out:?}");
    assert!(v["text"]
        .as_str()
        .unwrap()
        .starts_with(g["gold_text_prefix"].as_str().unwrap()));
}

#[test]
fn streamed_text_starts_with_paris_and_stats_go_to_stderr() {
    let d = bundle_dir();
    let o = generate(
        &d.join("smollm2.json"),
        &d,
        "8",
        "The capital of France is",
        &[],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with(" Paris."), "{:?}", stdout(&o));
    assert!(!stdout(&o).contains("prompt="));
    assert!(
        stderr(&o)
            .lines()
            .any(|l| l.starts_with("prompt=5 generated=8 ")),
        "{}",
        stderr(&o)
    );
}
