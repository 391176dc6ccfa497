//! Sampling, stop strings and argument-order compatibility through the real binary.

mod common;

use common::*;
use qnn_emu::writer::SynthSpec;
use std::path::PathBuf;

fn run_ids(m: &std::path::Path, d: &std::path::Path, extra: &[&str]) -> Vec<u64> {
    let o = generate(
        m,
        d,
        "24",
        "sampling test",
        &[&["--json"], extra].concat(),
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    ids(&json(&o), "output_ids")
}

#[test]
fn seeded_sampling_is_reproducible_and_differs_from_greedy() {
    let (d, m) = bundle("sampling", &SynthSpec::default());
    let s = [
        "--temp", "1.5", "--top-k", "40", "--top-p", "0.95", "--seed", "11",
    ];
    let a = run_ids(&m, &d, &s);
    assert_eq!(
        a,
        run_ids(&m, &d, &s),
        "same seed, same bundle, same output"
    );
    let mut other = s;
    other[7] = "12";
    assert_ne!(
        a,
        run_ids(&m, &d, &other),
        "another seed should change 24 sampled tokens"
    );
    assert_ne!(
        a,
        run_ids(&m, &d, &[]),
        "temperature 1.5 should leave the greedy path"
    );
    // --temp 0 is greedy whatever the other filters say.
    assert_eq!(
        run_ids(&m, &d, &["--temp", "0", "--top-k", "3"]),
        run_ids(&m, &d, &[])
    );
}

#[test]
fn bad_sampling_values_are_usage_errors() {
    let (d, m) = bundle("sampling-bad", &SynthSpec::default());
    for bad in [
        ["--top-p", "0"],
        ["--temp", "-1"],
        ["--min-p", "1.5"],
        ["--repeat-penalty", "0"],
    ] {
        let o = generate(&m, &d, "4", "x", &bad, &[]);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(bad[0]), "{}", stderr(&o));
    }
}

#[test]
fn stop_string_from_a_golden_ends_the_run_and_is_not_printed() {
    let bundles = std::env::var_os("QHX_PARITY_BUNDLES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bundles/parity"));
    let d = bundles.join("smollm2-f32");
    let m = d.join("smollm2.json");
    let g: serde_json::Value =
        serde_json::from_str(include_str!("goldens/parity/smollm2_short.json")).unwrap();
    let gold_text = g["gold_text"].as_str().unwrap();
    let stop = "\n\nThe";
    let at = gold_text
        .find(stop)
        .expect("golden text contains the stop string");
    let o = generate(&m, &d, "32", "The capital of France is", &["-r", stop], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("{}\n", &gold_text[..at]));
    assert!(stderr(&o).contains("finish=stop"), "{}", stderr(&o));
    let j = generate(
        &m,
        &d,
        "32",
        "The capital of France is",
        &["-r", stop, "--json"],
        &[],
    );
    let v = json(&j);
    assert_eq!(v["finish_reason"], "stop");
    assert_eq!(v["text"].as_str().unwrap(), &gold_text[..at]);
}

#[test]
fn public_clone_argument_order_is_understood() {
    let (d, m) = bundle("argorder", &SynthSpec::default());
    let lib = emu();
    let o = command(bin())
        .arg(&m)
        .arg(&lib)
        .arg(&lib)
        .arg("order test")
        .arg("5")
        .arg("--json")
        .output_within();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("MANIFEST HTP SYSTEM PROMPT [N]"),
        "{}",
        stderr(&o)
    );
    let a = ids(&json(&o), "output_ids");
    let b = generate(&m, &d, "5", "order test", &["--json"], &[]);
    assert_eq!(a, ids(&json(&b), "output_ids"));
}

#[test]
fn teacher_forcing_feeds_the_given_ids_and_reports_own_picks() {
    let (d, m) = bundle("teacher", &SynthSpec::default());
    let free = run_ids(&m, &d, &[]);
    let list = |v: &[u64]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    // Forcing the model's own greedy continuation reproduces it step for step.
    assert_eq!(run_ids(&m, &d, &["--teacher-force", &list(&free)]), free);
    // Forcing something else changes the picks after step 0 (step 0 only sees the prompt).
    let other: Vec<u64> = free.iter().map(|x| (x + 7) % 250).collect();
    let forced = run_ids(&m, &d, &["--teacher-force", &list(&other)]);
    assert_eq!(forced.len(), free.len());
    assert_eq!(forced[0], free[0]);
    assert_ne!(forced[1..], free[1..]);
}
