//! The parity suite can fail: `--expect-tokens` on HF goldens exits 0 on the real bundle and
//! 3 with a divergence report on a golden with one id changed or a manifest with a wrong
//! RoPE theta.

mod common;

use common::*;
use std::path::PathBuf;

fn smollm2() -> (PathBuf, PathBuf) {
    let d = std::env::var_os("QHX_PARITY_BUNDLES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bundles/parity"))
        .join("smollm2-f32");
    assert!(
        d.join("smollm2.json").is_file(),
        "run scripts/build-parity.sh first ({})",
        d.display()
    );
    (d.clone(), d.join("smollm2.json"))
}

fn golden(case: &str) -> (String, Vec<u64>) {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/goldens/parity/smollm2_{case}.json"));
    let g: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    (
        g["prompt"].as_str().unwrap().to_string(),
        ids(&g, "gold_ids"),
    )
}

fn list(v: &[u64]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[test]
fn expect_tokens_passes_on_a_golden_and_fails_on_an_edited_one() {
    let (d, m) = smollm2();
    let (prompt, gold) = golden("question");
    let ok = generate(
        &m,
        &d,
        "32",
        &prompt,
        &["--ignore-eos", "--expect-tokens", &list(&gold)],
        &[],
    );
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    let mut bad = gold.clone();
    bad[10] = if bad[10] == 28 { 29 } else { 28 };
    let o = generate(
        &m,
        &d,
        "32",
        &prompt,
        &["--ignore-eos", "--expect-tokens", &list(&bad)],
        &[],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("mismatch at step 10"), "{}", stderr(&o));
}

#[test]
fn a_wrong_rope_theta_breaks_parity() {
    let (d, m) = smollm2();
    let (prompt, gold) = golden("long");
    let mut man: serde_json::Value = serde_json::from_slice(&std::fs::read(&m).unwrap()).unwrap();
    assert_eq!(man["params"]["rope_theta"], 100000.0);
    man["params"]["rope_theta"] = 10000.0.into();
    let wrong = tmp("wrong-theta").join("smollm2.json");
    std::fs::write(&wrong, man.to_string()).unwrap();
    let o = generate(
        &wrong,
        &d,
        "32",
        &prompt,
        &["--ignore-eos", "--expect-tokens", &list(&gold)],
        &[],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("parity: mismatch at step"),
        "{}",
        stderr(&o)
    );
}
