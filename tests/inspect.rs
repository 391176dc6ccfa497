//! `qhx_inspect` on emulator bundles (system library only and with a backend), `--json`,
//! and on garbage input.

mod common;

use common::*;
use qnn_emu::writer::SynthSpec;
use std::path::{Path, PathBuf};
use std::process::Output;

fn inspect_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_qhx_inspect"))
}

fn inspect(backend: &str, bins: &[&Path], extra: &[&str]) -> Output {
    command(inspect_bin())
        .arg(backend)
        .arg(emu())
        .args(bins)
        .args(extra)
        .output()
        .expect("spawn qhx_inspect")
}

fn bins_of(d: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "bin") && !p.to_string_lossy().contains("embed")
        })
        .collect();
    v.sort();
    v
}

#[test]
fn lists_graphs_and_tensors_of_every_bundle_binary() {
    for (tag, spec) in [
        ("insp-f32", SynthSpec::default()),
        (
            "insp-u16",
            SynthSpec {
                io: "ufixed16".into(),
                head_major: true,
                ..SynthSpec::default()
            },
        ),
        (
            "insp-noprefill",
            SynthSpec {
                prefill: None,
                ..SynthSpec::default()
            },
        ),
    ] {
        let (d, _m) = bundle(tag, &spec);
        let bins = bins_of(&d);
        assert_eq!(
            bins.len(),
            if spec.prefill.is_some() { 3 } else { 2 },
            "{bins:?}"
        );
        let refs: Vec<&Path> = bins.iter().map(|p| p.as_path()).collect();
        for backend in ["-".to_string(), emu().display().to_string()] {
            let o = inspect(&backend, &refs, &[]);
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
            let text = stdout(&o);
            assert!(
                text.contains("graph tiny_decode (role guess: decode)"),
                "{text}"
            );
            assert!(
                text.contains("graph tiny_lmhead (role guess: lm-head)"),
                "{text}"
            );
            assert!(
                text.contains("past_k_0") && text.contains("past K cache"),
                "{text}"
            );
            assert!(
                text.contains("RoPE cos") && text.contains("attention mask"),
                "{text}"
            );
            if spec.prefill.is_some() {
                assert!(
                    text.contains("graph tiny_prefill (role guess: prefill)"),
                    "{text}"
                );
            }
            if spec.io == "ufixed16" {
                assert!(
                    text.contains("UFIXED_POINT_16") && text.contains("scale="),
                    "{text}"
                );
            } else {
                assert!(text.contains("FLOAT_32"), "{text}");
            }
        }
        // --json: one document naming every tensor with dims and bytes.
        let o = inspect("-", &refs, &["--json"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let v = json(&o);
        let binaries = v["binaries"].as_array().unwrap();
        assert_eq!(binaries.len(), bins.len());
        let dec = binaries
            .iter()
            .flat_map(|b| b["graphs"].as_array().unwrap())
            .find(|g| g["name"] == "tiny_decode")
            .expect("decode graph");
        let x = dec["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "x")
            .unwrap();
        assert_eq!(x["dims"], serde_json::json!([spec.hidden]));
        let es = if spec.io == "ufixed16" { 2 } else { 4 };
        assert_eq!(x["bytes"], spec.hidden * es);
        assert_eq!(x["role"], "hidden state in");
        if spec.io == "ufixed16" {
            assert!(x["quant"]["scale"].as_f64().unwrap() > 0.0, "{x}");
        } else {
            assert!(x["quant"].is_null());
        }
    }
}

#[test]
fn random_file_is_a_one_line_error() {
    let d = tmp("insp-garbage");
    let p = d.join("random.bin");
    let mut rng = qnn_emu::writer::Rng::new(7);
    let bytes: Vec<u8> = (0..(1 << 20)).map(|_| rng.next_u64() as u8).collect();
    std::fs::write(&p, bytes).unwrap();
    for backend in ["-".to_string(), emu().display().to_string()] {
        let o = inspect(&backend, &[&p], &[]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("random.bin") && err.contains("30010"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(o.stdout.is_empty());
    }
    // Empty, missing and usage errors.
    let e = d.join("empty.bin");
    std::fs::write(&e, b"").unwrap();
    let o = inspect("-", &[&e], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("empty.bin"), "{}", stderr(&o));
    let o = inspect("-", &[&d.join("nope.bin")], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("nope.bin"), "{}", stderr(&o));
    let o = inspect("-", &[], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // A system library that is not one.
    let o = command(inspect_bin())
        .arg("-")
        .arg(&p)
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
}
