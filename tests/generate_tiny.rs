//! End-to-end runs of the unchanged qhx_generate binary on synthetic bundles.

mod common;

use common::*;
use qnn_emu::writer::SynthSpec;

fn run_json(spec: &SynthSpec, tag: &str, n: &str, prompt: &str) -> serde_json::Value {
    let (dir, m) = bundle(tag, spec);
    let o = generate(&m, &dir, n, prompt, &["--json"], &[]);
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        stderr(&o)
    );
    json(&o)
}

#[test]
fn prefill_and_decode_over_prompt_agree() {
    // The same weights through the prefill graph and token-by-token through decode must
    // give the same continuation: the cache seeding, masks and RoPE rows line up.
    let prompt = "hello there, tiny model";
    let a = run_json(&SynthSpec::default(), "agree-prefill", "12", prompt);
    let b = run_json(
        &SynthSpec {
            prefill: None,
            ..Default::default()
        },
        "agree-decode",
        "12",
        prompt,
    );
    assert_eq!(ids(&a, "input_ids"), ids(&b, "input_ids"));
    assert_eq!(ids(&a, "output_ids"), ids(&b, "output_ids"));
    assert_eq!(ids(&a, "output_ids").len(), 12);
    assert_eq!(a["finish_reason"], "length");
}

/// Every other test here compares emulator runs with each other, which a loop that ignores
/// its prompt would pass. Here the continuation must change with the prompt, also when only
/// tokens before the last few differ (so the cached K/V of earlier positions is read), and
/// stay the same for the same prompt.
#[test]
fn output_depends_on_the_prompt() {
    for (tag, spec) in [
        ("dep-prefill", SynthSpec::default()),
        (
            "dep-decode",
            SynthSpec {
                prefill: None,
                ..Default::default()
            },
        ),
    ] {
        let run = |prompt: &str| ids(&run_json(&spec, tag, "12", prompt), "output_ids");
        let base = run("the cat sat on the mat");
        assert_eq!(
            base,
            run("the cat sat on the mat"),
            "{tag}: not deterministic"
        );
        assert_ne!(
            base,
            run("a dog ran to the park"),
            "{tag}: ignores the prompt"
        );
        assert_ne!(
            base,
            run("xyz cat sat on the mat"),
            "{tag}: ignores all but the last prompt tokens"
        );
    }
}

#[test]
fn prompt_longer_than_the_prefill_window_continues_through_decode() {
    // P = 4 rows, prompt of 23 byte tokens: 4 via prefill, 19 via decode-over-prompt.
    let prompt = "a prompt longer than P";
    let a = run_json(
        &SynthSpec {
            prefill: Some(4),
            ..Default::default()
        },
        "long-p4",
        "6",
        prompt,
    );
    let b = run_json(
        &SynthSpec {
            prefill: None,
            ..Default::default()
        },
        "long-none",
        "6",
        prompt,
    );
    assert_eq!(ids(&a, "input_ids").len(), prompt.len());
    assert_eq!(ids(&a, "output_ids"), ids(&b, "output_ids"));
}

#[test]
fn head_major_kv_layout_matches_position_major() {
    let prompt = "layouts";
    let a = run_json(&SynthSpec::default(), "kv-pos", "10", prompt);
    let b = run_json(
        &SynthSpec {
            head_major: true,
            ..Default::default()
        },
        "kv-head",
        "10",
        prompt,
    );
    assert_eq!(ids(&a, "output_ids"), ids(&b, "output_ids"));
}

#[test]
fn f16_io_and_f16_embeddings_run_and_mostly_agree_with_f32() {
    let prompt = "precision";
    let a = run_json(&SynthSpec::default(), "io-f32", "8", prompt);
    let b = run_json(
        &SynthSpec {
            io: "f16".into(),
            embed_f16: true,
            ..Default::default()
        },
        "io-f16",
        "8",
        prompt,
    );
    let (x, y) = (ids(&a, "output_ids"), ids(&b, "output_ids"));
    assert_eq!(y.len(), 8);
    assert_eq!(x[0], y[0], "first token must survive f16 rounding");
}

#[test]
fn streams_text_to_stdout_and_stats_to_stderr() {
    let (dir, m) = bundle("stream", &SynthSpec::default());
    let o = generate(&m, &dir, "5", "stream me", &[], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let stats: Vec<&str> = err.lines().filter(|l| l.starts_with("prompt=")).collect();
    assert_eq!(stats.len(), 1, "{err}");
    for key in [
        "generated=5",
        "load_ms=",
        "prefill_ms=",
        "ttft_ms=",
        "decode_ms=",
        "decode_tok_s=",
        "ms_per_tok=",
    ] {
        assert!(stats[0].contains(key), "{key} missing in {}", stats[0]);
    }
    // stdout is the generated text plus one newline, and equals the JSON text.
    let text = stdout(&o);
    assert!(text.ends_with('\n'));
    let j = generate(&m, &dir, "5", "stream me", &["--json"], &[]);
    assert_eq!(json(&j)["text"].as_str().unwrap(), &text[..text.len() - 1]);
}

#[test]
fn eos_ends_the_run_with_finish_reason_eos() {
    // Find the token this tiny model produces first, then declare it the EOS id.
    let spec = SynthSpec::default();
    let first = ids(&run_json(&spec, "eos-probe", "1", "x"), "output_ids")[0] as u32;
    let spec = SynthSpec {
        eos: first,
        ..Default::default()
    };
    let v = run_json(&spec, "eos", "10", "x");
    assert_eq!(v["finish_reason"], "eos");
    assert_eq!(ids(&v, "output_ids"), vec![first as u64]);
}

#[test]
fn n_tokens_beyond_the_context_is_clamped_to_ctx_full() {
    let spec = SynthSpec {
        ctx: 16,
        prefill: Some(8),
        ..Default::default()
    };
    let (dir, m) = bundle("clamp", &spec);
    let o = generate(&m, &dir, "100", "abcd", &["--json"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("clamped"), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(ids(&v, "output_ids").len(), 12);
    assert_eq!(v["finish_reason"], "ctx_full");
}

#[test]
fn emulator_handles_are_all_freed_in_order() {
    let (dir, m) = bundle("trace", &SynthSpec::default());
    let trace = dir.join("trace.json");
    let o = generate(
        &m,
        &dir,
        "3",
        "free",
        &[],
        &[("QNN_EMU_TRACE", trace.to_str().unwrap())],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let t = assert_all_freed(&trace, "normal run");
    assert_freed_child_first(&t, "normal run");
}

#[test]
fn handles_are_freed_on_error_paths_too() {
    for (tag, knob) in [
        ("trace-exec", "graphExecute@3=6031"),
        ("trace-retrieve", "graphRetrieve@1=6002"),
        ("trace-ctx", "contextCreateFromBinary@2=1002"),
    ] {
        let (dir, m) = bundle(tag, &SynthSpec::default());
        let trace = dir.join("trace.json");
        let o = generate(
            &m,
            &dir,
            "6",
            "fail",
            &[],
            &[
                ("QNN_EMU_TRACE", trace.to_str().unwrap()),
                ("QNN_EMU_FAIL", knob),
            ],
        );
        assert_eq!(o.status.code(), Some(1), "{knob}: {}", stderr(&o));
        assert_all_freed(&trace, knob);
    }
}

#[test]
fn expect_tokens_exits_0_on_match_and_3_on_divergence() {
    let (dir, m) = bundle("expect", &SynthSpec::default());
    let o = generate(&m, &dir, "6", "parity", &["--json"], &[]);
    let got: Vec<String> = ids(&json(&o), "output_ids")
        .iter()
        .map(|x| x.to_string())
        .collect();
    let list = got.join(",");
    let ok = generate(&m, &dir, "64", "parity", &["--expect-tokens", &list], &[]);
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    assert!(
        stderr(&ok).contains("parity: 6/6 tokens match"),
        "{}",
        stderr(&ok)
    );
    // A golden file with one id changed at step 4.
    let mut changed: Vec<u64> = got.iter().map(|x| x.parse().unwrap()).collect();
    changed[4] = (changed[4] + 1) % 256;
    let f = dir.join("golden.json");
    std::fs::write(&f, serde_json::json!({ "gold_ids": changed }).to_string()).unwrap();
    let bad = generate(
        &m,
        &dir,
        "64",
        "parity",
        &["--expect-tokens", f.to_str().unwrap()],
        &[],
    );
    assert_eq!(bad.status.code(), Some(3), "{}", stderr(&bad));
    let line = stderr(&bad)
        .lines()
        .find(|l| l.starts_with("parity:"))
        .unwrap()
        .to_string();
    assert!(
        line.contains("step 4") && line.contains(&format!("expected {}", changed[4])),
        "{line}"
    );
}

#[test]
fn chunked_prefill_with_past_inputs_matches_decode_only() {
    // P = 4 with past K/V inputs: a 23-token prompt runs as 6 chunks reading the cache in place.
    let prompt = "a prompt longer than P";
    let chunked = SynthSpec {
        prefill: Some(4),
        prefill_past: true,
        ..Default::default()
    };
    let a = run_json(&chunked, "chunked-p4", "8", prompt);
    let b = run_json(
        &SynthSpec {
            prefill: None,
            ..Default::default()
        },
        "chunked-ref",
        "8",
        prompt,
    );
    assert_eq!(ids(&a, "output_ids"), ids(&b, "output_ids"));
    // Head-major caches shared between the two graphs too.
    let hm = SynthSpec {
        head_major: true,
        ..chunked
    };
    let c = run_json(&hm, "chunked-hm", "8", prompt);
    assert_eq!(ids(&c, "output_ids"), ids(&b, "output_ids"));
}

#[test]
fn shared_context_binary_matches_separate_binaries() {
    let prompt = "one binary, two graphs";
    let a = run_json(
        &SynthSpec {
            shared: true,
            ..Default::default()
        },
        "shared",
        "8",
        prompt,
    );
    let b = run_json(&SynthSpec::default(), "separate", "8", prompt);
    assert_eq!(ids(&a, "output_ids"), ids(&b, "output_ids"));
    let c = run_json(
        &SynthSpec {
            shared: true,
            prefill_past: true,
            ..Default::default()
        },
        "shared-past",
        "8",
        prompt,
    );
    assert_eq!(ids(&c, "output_ids"), ids(&b, "output_ids"));
}

#[test]
fn ufixed16_io_with_calibrated_scales_follows_f32() {
    // Calibrate on the f32 bundle (the emulator records value ranges per role), then build
    // the UFIXED_POINT_16 bundle with those scales/offsets, as a W8A16 export would.
    let prompt = "quantized activations";
    let (dir, m) = bundle("uf16-ref", &SynthSpec::default());
    let calib = dir.join("calib.json");
    let o = generate(
        &m,
        &dir,
        "6",
        prompt,
        &["--json"],
        &[("QNN_EMU_CALIBRATE", calib.to_str().unwrap())],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let want = ids(&json(&o), "output_ids");
    let ranges: std::collections::BTreeMap<String, (f32, f32)> =
        serde_json::from_slice(&std::fs::read(&calib).unwrap()).unwrap();
    assert!(
        ranges.contains_key("x") && ranges.contains_key("y") && ranges.contains_key("k_1"),
        "{ranges:?}"
    );
    let spec = SynthSpec {
        io: "ufixed16".into(),
        ranges,
        ..Default::default()
    };
    let got = ids(&run_json(&spec, "uf16", "6", prompt), "output_ids");
    assert_eq!(got.len(), 6);
    assert_eq!(got[..3], want[..3], "ufixed16 {got:?} vs f32 {want:?}");
}
