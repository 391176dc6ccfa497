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
