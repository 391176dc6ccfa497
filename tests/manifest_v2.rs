//! Schema 2 manifests (`plan.steps`) run exactly as the schema 1 manifests of the same
//! graphs: each bundle is written by the emulator's writer (schema 1), rewritten as
//! schema 2 from its own contexts, and both run through the real binary.

mod common;

use common::*;
use qnn_emu::writer::SynthSpec;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The stack-step I/O under schema 1's default tensor names, as schema 2 writes it.
fn stack_io(past: bool) -> (Value, Value) {
    let mut inputs =
        json!({"x": "embedding", "cos": "rope_cos", "sin": "rope_sin", "cmask": "mask"});
    if past {
        inputs["past_k_{i}"] = json!("past_key");
        inputs["past_v_{i}"] = json!("past_value");
    }
    let outputs = json!({"y": "hidden", "new_k_{i}": "new_key", "new_v_{i}": "new_value"});
    (inputs, outputs)
}

/// The lm-head's tensor names, read from its binary through the library (schema 1 takes
/// its one input and output whatever they are called; schema 2 names them).
fn head_names(manifest: &Path, root: &Path) -> (String, String) {
    let m = qhx::bundle::manifest::Manifest::load(manifest, root).expect("manifest");
    let lib = emu();
    let model = qhx::load::manifest::load(m, &lib, &lib, &Default::default()).expect("load");
    let head = model
        .plan
        .head
        .as_ref()
        .expect("a manifest bundle has a head");
    (
        head.desc.inputs[0].name.clone(),
        head.desc.outputs[0].name.clone(),
    )
}

/// Rewrite schema 1 manifest `v1` as schema 2 (written to `out`, paths still resolving
/// against the bundle's root).
fn to_v2(v1_path: &Path, root: &Path, prefill_past: bool, out: &Path) -> PathBuf {
    let mut m: Value = serde_json::from_slice(&std::fs::read(v1_path).unwrap()).unwrap();
    let c = m["artifacts"]["contexts"].clone();
    let bin = |r: &Value| {
        r.get("bin")
            .cloned()
            .unwrap_or_else(|| c["shared"]["bin"].clone())
    };
    let mut steps = Vec::new();
    for (role, key, past) in [
        ("prefill", "prefill", prefill_past),
        ("decode", "decode", true),
    ] {
        let Some(r) = c.get(key) else { continue };
        let (inputs, outputs) = stack_io(past);
        steps.push(json!({"role": role, "bin": bin(r), "graph": r.get("graph"),
                          "inputs": inputs, "outputs": outputs}));
    }
    let (hin, hout) = head_names(v1_path, root);
    let h = &c["lmhead"];
    steps.push(
        json!({"role": "head", "bin": bin(h), "graph": h.get("graph"),
                      "inputs": {hin: "hidden"}, "outputs": {hout: "logits"}}),
    );
    m["schema_version"] = json!(2);
    m["artifacts"].as_object_mut().unwrap().remove("contexts");
    m["plan"] = json!({"steps": steps});
    let path = out.join("manifest-v2.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    path
}

fn run(manifest: &Path, root: &Path, prompt: &str) -> Vec<u64> {
    let o = generate(manifest, root, "12", prompt, &["--json"], &[]);
    assert!(o.status.success(), "{}: {}", manifest.display(), stderr(&o));
    ids(&json(&o), "output_ids")
}

#[test]
fn schema_2_runs_every_bundle_shape_as_schema_1_does() {
    let shapes = [
        ("v2-window", SynthSpec::default()),
        (
            "v2-chunked",
            SynthSpec {
                prefill_past: true,
                ..SynthSpec::default()
            },
        ),
        (
            "v2-noprefill",
            SynthSpec {
                prefill: None,
                ..SynthSpec::default()
            },
        ),
        (
            "v2-shared-headmajor-f16",
            SynthSpec {
                shared: true,
                head_major: true,
                io: "f16".into(),
                prefill_past: true,
                ..SynthSpec::default()
            },
        ),
    ];
    // Longer than P = 16, so the prefill graph and then decode both run.
    let prompt = "schema two is the plan written out, step by step";
    for (tag, spec) in shapes {
        let (d, m1) = bundle(tag, &spec);
        let m2 = to_v2(&m1, &d, spec.prefill_past, &d);
        let want = run(&m1, &d, prompt);
        assert_eq!(want.len(), 12, "{tag}");
        assert_eq!(run(&m2, &d, prompt), want, "{tag}");
    }
}

/// The real SmolLM2 weights on the emulator: the schema 2 manifest says " Paris." and
/// the same four tokens as schema 1.
#[test]
fn smollm2_as_schema_2_answers_as_schema_1() {
    let d = smollm2_dir();
    let out = tmp("v2-smollm2");
    let m2 = to_v2(&d.join("smollm2.json"), &d, false, &out);
    let text = |m: &Path| {
        let o = generate(m, &d, "4", "The capital of France is", &[], &[]);
        assert!(o.status.success(), "{}: {}", m.display(), stderr(&o));
        stdout(&o)
    };
    let got = text(&m2);
    assert!(got.starts_with(" Paris."), "{got:?}");
    assert_eq!(got, text(&d.join("smollm2.json")));
}

/// A step whose tensor name is not in its graph fails the load naming graph and tensor.
#[test]
fn a_schema_2_name_not_in_the_graph_is_named() {
    let (d, m1) = bundle("v2-badname", &SynthSpec::default());
    let m2 = to_v2(&m1, &d, false, &d);
    let text = std::fs::read_to_string(&m2).unwrap();
    // The decode step's mask (the prefill's comes first in the file).
    let at = text.rfind("\"cmask\"").unwrap();
    let bad = format!("{}\"mask_in\"{}", &text[..at], &text[at + 7..]);
    std::fs::write(&m2, bad).unwrap();
    let o = generate(&m2, &d, "4", "hi", &[], &[]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("has no input tensor named \"mask_in\"") && e.contains("tiny_decode"),
        "{e}"
    );
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
}

/// The step I/O of a schema 1 bundle's graph `key` (prefill / verify / decode) as a
/// schema 2 step, its binary and graph name read from the manifest.
fn v2_step(m: &Value, role: &str, key: &str, past: bool) -> Value {
    let c = &m["artifacts"]["contexts"];
    let r = &c[key];
    let bin = r
        .get("bin")
        .cloned()
        .unwrap_or_else(|| c["decode"]["bin"].clone());
    let (inputs, outputs) = stack_io(past);
    json!({"role": role, "bin": bin, "graph": r.get("graph"), "inputs": inputs, "outputs": outputs})
}

/// A two-rung context ladder (C = 24, then 64) built from two bundles of the same weights,
/// each with a chunked prefill and a verify graph: the rungs' steps in one schema 2
/// manifest, the lm-head of the larger.
fn ladder_bundle(tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    let d = tmp(tag);
    let spec = |name: &str, ctx| SynthSpec {
        name: name.into(),
        ctx,
        prefill: Some(8),
        prefill_past: true,
        verify: Some(4),
        ..SynthSpec::default()
    };
    let small = qnn_emu::writer::write_bundle(&d, &spec("rung24", 24)).expect("write rung24");
    let large = qnn_emu::writer::write_bundle(&d, &spec("rung64", 64)).expect("write rung64");
    let mut steps = Vec::new();
    for path in [&small, &large] {
        let m: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        for (role, key) in [
            ("prefill", "prefill"),
            ("verify", "verify"),
            ("decode", "decode"),
        ] {
            steps.push(v2_step(&m, role, key, true));
        }
    }
    let (hin, hout) = head_names(&large, &d);
    let mut m: Value = serde_json::from_slice(&std::fs::read(&large).unwrap()).unwrap();
    let h = m["artifacts"]["contexts"]["lmhead"]["bin"].clone();
    steps.push(
        json!({"role": "head", "bin": h, "inputs": {hin: "hidden"}, "outputs": {hout: "logits"}}),
    );
    m["schema_version"] = json!(2);
    m["artifacts"].as_object_mut().unwrap().remove("contexts");
    m["plan"] = json!({"steps": steps});
    let path = d.join("ladder.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    (d, path, large)
}

/// Greedy ids and the JSON stats of a run.
fn run_json(manifest: &Path, root: &Path, n: &str, prompt: &str, extra: &[&str]) -> Value {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    let o = generate(manifest, root, n, prompt, &args, &[]);
    assert!(o.status.success(), "{}: {}", manifest.display(), stderr(&o));
    json(&o)
}

#[test]
fn a_context_ladder_moves_up_a_rung_and_keeps_the_ids_of_its_largest_rung() {
    let (d, ladder, large) = ladder_bundle("v2-ladder");
    // 11 prompt tokens + 40 generated cross the 24-slot rung; a 30-token prompt starts
    // past it (its prefill chunks move up mid-prompt).
    for (prompt, n) in [
        ("ladders climb", "40"),
        ("a prompt longer than the first rung", "8"),
    ] {
        let want = run_json(&large, &d, n, prompt, &[]);
        let got = run_json(&ladder, &d, n, prompt, &[]);
        assert_eq!(
            ids(&got, "output_ids"),
            ids(&want, "output_ids"),
            "{prompt:?}"
        );
        assert_eq!(got["stats"]["ctx_rung"], 64, "{prompt:?}: {got}");
        assert_eq!(got["stats"]["rung_moves"], 1, "{prompt:?}: {got}");
        assert_eq!(want["stats"]["rung_moves"], 0);
        // Speculation verifies on whichever rung holds the cache, across the move too.
        let spec = run_json(&ladder, &d, n, prompt, &["--spec", "lookup"]);
        assert_eq!(
            ids(&spec, "output_ids"),
            ids(&want, "output_ids"),
            "{prompt:?} --spec lookup"
        );
    }
    // A short run stays on the small rung.
    let short = run_json(&ladder, &d, "4", "short", &[]);
    assert_eq!(short["stats"]["ctx_rung"], 24, "{short}");
    assert_eq!(short["stats"]["rung_moves"], 0);
}

#[test]
fn ladder_rungs_must_grow() {
    let (d, ladder, _) = ladder_bundle("v2-ladder-order");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&ladder).unwrap()).unwrap();
    let steps = m["plan"]["steps"].as_array_mut().unwrap();
    // The 64 rung first, then the 24 rung: refused, naming the graph and both sizes.
    let (a, b) = steps.split_at_mut(3);
    a.swap_with_slice(&mut b[..3]);
    let bad = d.join("ladder-descending.json");
    std::fs::write(&bad, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let o = generate(&bad, &d, "4", "x", &[], &[]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("context ladder rungs must grow") && err.contains("24") && err.contains("64"),
        "{err}"
    );
}
