//! The host-overhead harness (`benches/host_overhead.rs`, run by
//! `scripts/host-overhead.sh`) keeps stdout to itself: with `--json` its stdout is exactly
//! one JSON document, although the emulator prints a banner on stdout through C stdio (as
//! the real x86 HTP backend does).
//!
//! The harness is compiled in here and run in a child process (this test executable
//! re-run with `QHX_HOST_OVERHEAD_CHILD` set), on the small `tiny` shape. The child writes
//! a marker on stdout first: what libtest printed before it is not the harness's.

mod common;

#[allow(dead_code)]
#[path = "../benches/host_overhead.rs"]
mod host_overhead;

use common::*;

const CHILD: &str = "QHX_HOST_OVERHEAD_CHILD";
const MARKER: &str = "--- host-overhead child output ---\n";

/// The DeepSeek-R1-Distill tokenizer the parity bundles carry (scripts/build-parity.sh).
fn mask_tokenizer() -> std::path::PathBuf {
    let t = std::env::var_os("QHX_PARITY_BUNDLES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bundles/parity")
        })
        .join("tok/deepseek-r1-distill.json");
    assert!(
        t.is_file(),
        "run scripts/build-parity.sh first ({})",
        t.display()
    );
    t
}

#[test]
fn json_is_the_only_stdout() {
    if let Some(dir) = std::env::var_os(CHILD) {
        use std::io::Write;
        let mut so = std::io::stdout();
        so.write_all(MARKER.as_bytes()).unwrap();
        so.flush().unwrap();
        let args = ["--json", "--shape", "tiny", "--steps", "2", "--dir"];
        let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        args.push(dir.to_string_lossy().into_owned());
        args.push("--mask-tokenizer".into());
        args.push(mask_tokenizer().to_string_lossy().into_owned());
        host_overhead::run(args);
        // Leave before libtest prints its summary; C stdio (the banner) is flushed by exit.
        std::process::exit(0);
    }
    let dir = tmp("host-overhead-json");
    let o = command(std::env::current_exe().unwrap())
        .args(["--exact", "json_is_the_only_stdout", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD, &dir)
        .env("QHX_EMU_LIB", emu())
        // The emulator's banner is on by default; say so, in case the environment has it off.
        .env("QNN_EMU_STDOUT", "1")
        .output_within();
    let out = stdout(&o);
    assert!(o.status.success(), "{}\n{out}", stderr(&o));
    let (_, doc) = out
        .split_once(MARKER)
        .unwrap_or_else(|| panic!("no marker in the child's stdout:\n{out}"));
    let v: serde_json::Value = serde_json::from_str(doc)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{doc}"));
    let rows = v.as_array().expect("a JSON array");
    // 2 I/O types x 3 context sizes x 2 samplers, one cold-start entry, the grammar mask,
    // the speculation row.
    assert_eq!(rows.len(), 15, "{v}");
    let spec = &rows[14]["speculation"];
    assert_eq!(spec["vocab"], 151_936, "{v}");
    assert_eq!(spec["rows_per_verify"], 8, "{v}");
    let (s50, s99) = (
        spec["p50_ms_per_token"].as_f64().unwrap(),
        spec["p99_ms_per_token"].as_f64().unwrap(),
    );
    assert!(s50 > 0.0 && s50 <= s99, "{v}");
    let mask = &rows[13]["grammar_mask"];
    assert_eq!(mask["vocab"], 151_936, "{v}");
    assert!(mask["tokens"].as_u64().unwrap() >= 64, "{v}");
    let (p50, p99) = (
        mask["p50_ms"].as_f64().unwrap(),
        mask["p99_ms"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p50 <= p99, "{v}");
    assert!(rows[..13].iter().all(|r| r["shape"] == "tiny"), "{v}");
    assert!(
        rows.iter().any(|r| r["cold_start_ms"].as_f64().is_some()),
        "{v}"
    );
}
