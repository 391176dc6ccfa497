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
        .output_within()
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
    // A system library that is not one (named like one, so it is loaded and fails).
    let fake = d.join("libfake.so");
    std::fs::copy(&p, &fake).unwrap();
    let o = command(inspect_bin())
        .arg("-")
        .arg(&fake)
        .arg(&p)
        .output_within();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
}

/// `qhx_inspect - LIB bundle/*.bin`: a file that is not a context binary (the embedding
/// table, the tokenizer, a library) is one line on stderr naming it, with a hint; the files
/// after it are still inspected; the exit code is 1; `--json` still prints one document,
/// with the failures under `errors`.
#[test]
fn unreadable_files_are_reported_and_the_rest_inspected() {
    let (d, _m) = bundle("insp-mixed", &SynthSpec::default());
    let mut all: Vec<PathBuf> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "bin"))
        .collect();
    all.sort();
    let embed = all
        .iter()
        .find(|p| p.to_string_lossy().contains("embed"))
        .expect("the bundle has an embedding table")
        .clone();
    // The embedding table first, so that every graph comes after a failure.
    all.retain(|p| *p != embed);
    let n_good = all.len();
    let mut args = vec![embed.clone()];
    args.extend(all.iter().cloned());
    args.push(d.join("tokenizer.json"));
    let empty = d.join("empty.bin");
    std::fs::write(&empty, b"").unwrap();
    args.push(empty.clone());
    let refs: Vec<&Path> = args.iter().map(|p| p.as_path()).collect();
    for backend in ["-".to_string(), emu().display().to_string()] {
        let o = inspect(&backend, &refs, &[]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 3, "one line per failed file:\n{err}");
        assert!(
            lines[0].contains(&*embed.to_string_lossy())
                && lines[0].contains("bad magic")
                && lines[0].contains("truncated"),
            "{err}"
        );
        assert!(
            lines[1].contains("tokenizer.json") && lines[1].contains("JSON file"),
            "{err}"
        );
        assert!(
            lines[2].contains("empty.bin") && lines[2].contains("empty"),
            "{err}"
        );
        let text = stdout(&o);
        for g in ["tiny_decode", "tiny_lmhead", "tiny_prefill"] {
            assert!(
                text.contains(&format!("graph {g} ")),
                "{g} not shown:\n{text}"
            );
        }
        let o = inspect(&backend, &refs, &["--json"]);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 3, "{}", stderr(&o));
        let v = json(&o);
        assert_eq!(v["binaries"].as_array().unwrap().len(), n_good, "{v}");
        let errors = v["errors"].as_array().expect("an errors array");
        let files: Vec<&str> = errors.iter().map(|e| e["file"].as_str().unwrap()).collect();
        assert_eq!(
            files,
            [
                &*embed.to_string_lossy(),
                &*d.join("tokenizer.json").to_string_lossy(),
                &*empty.to_string_lossy()
            ]
        );
        assert!(
            errors[0]["error"].as_str().unwrap().contains("30010"),
            "{v}"
        );
    }
    // All good: exit 0 and an empty `errors`.
    let good: Vec<&Path> = all.iter().map(|p| p.as_path()).collect();
    let o = inspect("-", &good, &["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(json(&o)["errors"], serde_json::json!([]));
}

/// `qhx_inspect LIB x.bin` (the `-` forgotten) and other misplaced arguments are usage
/// errors that say what is wrong and give the argument order, not `<BINS>... not provided`.
#[test]
fn a_context_binary_where_a_library_belongs_is_named() {
    let (d, _m) = bundle("insp-order", &SynthSpec::default());
    let bins = bins_of(&d);
    let dec = bins
        .iter()
        .find(|p| p.to_string_lossy().contains("decode"))
        .unwrap();
    let lib = emu();
    let run = |args: &[&std::ffi::OsStr]| {
        let o = command(inspect_bin()).args(args).output_within();
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(o.stdout.is_empty());
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(!err.contains("not provided"), "{err}");
        assert!(
            err.contains("<libQnnHtp.so|-> <libQnnSystem.so> <context.bin>..."),
            "{err}"
        );
        err
    };
    // The forgotten `-`, with one binary and with several.
    let err = run(&[lib.as_os_str(), dec.as_os_str()]);
    assert!(
        err.contains(&format!(
            "{} is a context binary, not the system library",
            dec.display()
        )) && err.contains(&format!(
            "qhx_inspect - {} {}",
            lib.display(),
            dec.display()
        )),
        "{err}"
    );
    let err = run(&[lib.as_os_str(), dec.as_os_str(), bins[0].as_os_str()]);
    assert!(
        err.contains("is a context binary, not the system library"),
        "{err}"
    );
    // A context binary as the backend; no binary at all.
    let err = run(&[dec.as_os_str(), lib.as_os_str(), dec.as_os_str()]);
    assert!(err.contains("is not a QNN backend library"), "{err}");
    let err = run(&["-".as_ref(), lib.as_os_str()]);
    assert!(err.contains("no context binary given"), "{err}");
}
