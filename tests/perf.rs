//! Device-path features on the emulator: host bytes per decode step independent of C,
//! zero-copy rpcmem I/O, HTP perf votes and their release, and `--bench --json`.

mod common;

use common::*;
use qnn_emu::writer::SynthSpec;
use serde_json::Value;
use std::path::Path;

fn trace(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).expect("trace written")).expect("trace JSON")
}

fn events(t: &Value) -> Vec<String> {
    t["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect()
}

/// Run with a trace; returns (output, trace).
fn traced(
    tag: &str,
    spec: &SynthSpec,
    n: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (std::process::Output, Value) {
    let (dir, m) = bundle(tag, spec);
    let tp = dir.join("trace.json");
    let tps = tp.to_str().unwrap().to_string();
    let mut e: Vec<(&str, &str)> = vec![("QNN_EMU_TRACE", &tps)];
    e.extend_from_slice(env);
    let o = generate(&m, &dir, n, "bytes per step", extra, &e);
    let t = trace(&tp);
    (o, t)
}

fn decode_stat<'a>(t: &'a Value, name: &str) -> &'a Value {
    &t["exec"][format!("{name}_decode")]
}

#[test]
fn host_bytes_per_decode_step_do_not_depend_on_c() {
    // Real (non-null) compute so K/V rows and hidden states change every step. The emulator
    // diffs every decode input against its previous execute.
    let mut maxes = Vec::new();
    for ctx in [256usize, 2048] {
        let spec = SynthSpec {
            name: format!("c{ctx}"),
            ctx,
            prefill: None,
            ..Default::default()
        };
        let (o, t) = traced(&format!("bytes-c{ctx}"), &spec, "24", &["--json"], &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        let st = decode_stat(&t, &spec.name);
        let changed: Vec<u64> = st["changed_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert!(
            changed.len() >= 30,
            "{} decode executes traced",
            changed.len()
        );
        // One embedding row (H f32), cos+sin rows (2*head_dim f32), one mask slot, one K and
        // one V row per layer (K = n_kv*head_dim f32): no term in C.
        let (h, hd, k, l) = (
            spec.hidden,
            spec.head_dim,
            spec.n_kv_heads * spec.head_dim,
            spec.n_layers,
        );
        let bound = (h * 4 + 2 * hd * 4 + 4 + 2 * l * k * 4) as u64;
        let max = *changed.iter().max().unwrap();
        assert!(
            max <= bound,
            "C={ctx}: a step changed {max} bytes > bound {bound}"
        );
        // Every step really writes its rows (an embedding row alone changes > H bytes).
        assert!(
            changed.iter().all(|&c| c as usize > h),
            "C={ctx}: {changed:?}"
        );
        maxes.push(max);
    }
    // The same work at 8x the context: within 10% (values differ, sizes do not).
    let (a, b) = (maxes[0] as f64, maxes[1] as f64);
    assert!(
        (a - b).abs() / a < 0.1,
        "max changed bytes C=256 {a} vs C=2048 {b}"
    );
}

/// The same bound for issue 17's layer shapes: Gemma 3 style (sliding layers with their own
/// RoPE rows and mask, window 8, so slots close as the window slides) and LFM2 style (conv
/// layers whose [H, 3] state is carried each step). Per step: one embedding row, a cos and
/// a sin row per RoPE table, at most two slots per mask (one opens, one slides out), K/V
/// rows per attention layer and one state per conv layer; nothing in C.
#[test]
fn layered_decode_steps_write_o1_rows_not_o_c() {
    let kinds: [(&str, Vec<&str>); 2] = [
        (
            "swa",
            vec!["sliding_attention", "full_attention", "sliding_attention"],
        ),
        ("conv", vec!["conv", "full_attention", "conv"]),
    ];
    for (tag, types) in kinds {
        let mut maxes = Vec::new();
        for ctx in [64usize, 512] {
            let spec = SynthSpec {
                name: format!("{tag}{ctx}"),
                ctx,
                n_layers: types.len(),
                prefill: Some(8),
                layer_types: types.iter().map(|t| t.to_string()).collect(),
                sliding_window: types.contains(&"sliding_attention").then_some(8),
                ..Default::default()
            };
            let (o, t) = traced(
                &format!("bytes-{tag}-c{ctx}"),
                &spec,
                "40",
                &["--json"],
                &[],
            );
            assert!(o.status.success(), "{}", stderr(&o));
            let changed: Vec<u64> = decode_stat(&t, &spec.name)["changed_bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert!(changed.len() >= 38, "{} decode executes", changed.len());
            let (h, hd, k) = (spec.hidden, spec.head_dim, spec.n_kv_heads * spec.head_dim);
            let attn = types.iter().filter(|t| **t != "conv").count();
            let conv = types.len() - attn;
            let tables = if tag == "swa" { 2 } else { 1 };
            let bound = (h * 4
                + tables * 2 * hd * 4
                + tables * 2 * 4
                + 2 * attn * k * 4
                + conv * h * 3 * 4) as u64;
            let max = *changed.iter().max().unwrap();
            assert!(
                max <= bound,
                "{tag} C={ctx}: a step changed {max} bytes > {bound}"
            );
            maxes.push(max);
        }
        let (a, b) = (maxes[0] as f64, maxes[1] as f64);
        assert!((a - b).abs() / a < 0.1, "{tag}: C=64 {a} vs C=512 {b}");
    }
}

#[test]
fn rpcmem_binds_every_argument_as_a_memhandle_and_releases_in_order() {
    let emu = emu();
    let spec = SynthSpec::default();
    let (o, t) = traced(
        "rpcmem-on",
        &spec,
        "8",
        &["-v", "--rpcmem-lib", emu.to_str().unwrap()],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("I/O mode: rpcmem zero-copy"),
        "{}",
        stderr(&o)
    );
    let exec = t["exec"].as_object().unwrap();
    assert_eq!(
        exec.len(),
        3,
        "prefill, decode and lm-head executed: {exec:?}"
    );
    for (g, st) in exec {
        assert_eq!(st["raw_args"], 0, "{g} got client buffers");
        assert!(st["memhandle_args"].as_u64().unwrap() > 0, "{g}");
    }
    assert_eq!(t["live"]["mem_handle"], 0);
    assert_eq!(t["live"]["rpcmem"], 0);
    let ev = events(&t);
    let last_dereg = ev
        .iter()
        .rposition(|e| e == "free mem_handle")
        .expect("deregistered");
    let first_ctx_free = ev
        .iter()
        .position(|e| e == "free context")
        .expect("context freed");
    let last_rpc_free = ev
        .iter()
        .rposition(|e| e == "free rpcmem")
        .expect("rpcmem freed");
    assert!(
        last_dereg < first_ctx_free,
        "memDeRegister after contextFree: {ev:?}"
    );
    let first_rpc_free = ev.iter().position(|e| e == "free rpcmem").unwrap();
    let first_dereg = ev.iter().position(|e| e == "free mem_handle").unwrap();
    assert!(first_dereg < first_rpc_free && last_rpc_free < ev.len());
    // Same tokens as with client buffers.
    let (o2, t2) = traced(
        "rpcmem-off",
        &spec,
        "8",
        &["-v", "--rpcmem-lib", "none"],
        &[],
    );
    assert!(o2.status.success());
    assert!(
        stderr(&o2).contains("I/O mode: client buffers"),
        "{}",
        stderr(&o2)
    );
    assert_eq!(stdout(&o), stdout(&o2));
    for (g, st) in t2["exec"].as_object().unwrap() {
        assert_eq!(st["memhandle_args"], 0, "{g}");
    }
}

#[test]
fn missing_rpcmem_library_falls_back_to_client_buffers() {
    let (o, t) = traced(
        "rpcmem-missing",
        &SynthSpec::default(),
        "4",
        &["-v", "--rpcmem-lib", "/nonexistent/libcdsprpc.so"],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("client buffers (rpcmem /nonexistent/libcdsprpc.so"),
        "{}",
        stderr(&o)
    );
    assert!(t["exec"]
        .as_object()
        .unwrap()
        .values()
        .all(|s| s["raw_args"].as_u64().unwrap() > 0));
}

fn assert_burst_vote(t: &Value) {
    let votes = t["votes"].as_array().expect("votes");
    assert_eq!(votes.len(), 1, "{votes:?}");
    let c = votes[0]["configs"].as_array().unwrap();
    assert_eq!(
        c.len(),
        3,
        "DCVS v3, RPC control latency and polling all passed: {c:?}"
    );
    let d = &c[0];
    assert_eq!(d["option"], "dcvs_v3");
    assert_eq!(d["context_id"], votes[0]["id"]);
    assert_eq!(
        (d["set_dcvs_enable"].as_u64(), d["dcvs_enable"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(d["power_mode"], 0x10);
    assert_eq!(
        (d["set_sleep_latency"].as_u64(), d["sleep_latency"].as_u64()),
        (Some(1), Some(40))
    );
    assert_eq!(
        (d["set_sleep_disable"].as_u64(), d["sleep_disable"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(d["set_bus_params"], 1);
    assert_eq!(d["bus"], serde_json::json!([0xA0, 0xA0, 0xA0]));
    assert_eq!(d["set_core_params"], 1);
    assert_eq!(d["core"], serde_json::json!([0xA0, 0xA0, 0xA0]));
    assert_eq!(
        c[1],
        serde_json::json!({"option": "rpc_control_latency", "value": 100})
    );
    assert_eq!(
        c[2],
        serde_json::json!({"option": "rpc_polling_time", "value": 9999})
    );
}

fn assert_released(t: &Value) {
    assert_eq!(
        t["live"]["power_config"], 0,
        "power config id not destroyed"
    );
    let ev = events(t);
    let set = ev.iter().position(|e| e == "set power_config");
    let free = ev
        .iter()
        .position(|e| e == "free power_config")
        .expect("destroyPowerConfigId");
    let dev = ev
        .iter()
        .position(|e| e == "free device")
        .expect("device freed");
    assert!(set.is_none_or(|s| s < free) && free < dev, "{ev:?}");
}

#[test]
fn burst_is_the_default_vote_and_is_released_at_exit() {
    let (o, t) = traced("perf-burst", &SynthSpec::default(), "6", &[], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_burst_vote(&t);
    assert_released(&t);
    let (o, t) = traced(
        "perf-default",
        &SynthSpec::default(),
        "6",
        &["--perf", "default"],
        &[],
    );
    assert!(o.status.success());
    assert_eq!(t["votes"].as_array().unwrap().len(), 0);
    let (o, t) = traced(
        "perf-saver",
        &SynthSpec::default(),
        "6",
        &["--perf", "power_saver"],
        &[],
    );
    assert!(o.status.success());
    assert_eq!(t["votes"][0]["configs"][0]["power_mode"], 0x4);
    assert_released(&t);
}

#[test]
fn votes_are_released_on_error_paths() {
    // A graph failure mid-generation: the vote was set, and is still released.
    let (o, t) = traced(
        "perf-exec-fail",
        &SynthSpec::default(),
        "6",
        &[],
        &[("QNN_EMU_FAIL", "graphExecute@3=6004")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_burst_vote(&t);
    assert_released(&t);
    // A context that fails to load after the vote.
    let (o, t) = traced(
        "perf-ctx-fail",
        &SynthSpec::default(),
        "6",
        &[],
        &[("QNN_EMU_FAIL", "contextCreateFromBinary@1=5005")],
    );
    assert_eq!(o.status.code(), Some(1));
    assert_released(&t);
    // setPowerConfig itself failing: the created id is destroyed, and the run goes on
    // unvoted with a warning that names the step (it used to fail the run).
    let (o, t) = traced(
        "perf-set-fail",
        &SynthSpec::default(),
        "6",
        &[],
        &[("QNN_EMU_FAIL", "setPowerConfig=13006")],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let warning = stderr(&o)
        .lines()
        .find(|l| l.starts_with("qhx: warning: the burst performance vote failed"))
        .map(str::to_string);
    let warning = warning.unwrap_or_else(|| panic!("no warning: {}", stderr(&o)));
    assert!(
        warning.contains("setting the burst power config"),
        "{warning}"
    );
    assert!(!stdout(&o).trim().is_empty(), "the run generates unvoted");
    assert_eq!(
        t["live"]["power_config"], 0,
        "power config id not destroyed"
    );
}

/// `--bench` with only the bundle positionals (no n_tokens, no prompt), as llama-bench.
fn bench(tag: &str, extra: &[&str]) -> (std::process::Output, String) {
    bench_on(tag, &SynthSpec::default(), extra)
}

fn bench_on(tag: &str, spec: &SynthSpec, extra: &[&str]) -> (std::process::Output, String) {
    let (dir, m) = bundle(tag, spec);
    let lib = emu();
    let o = common::command(bin())
        .arg(&m)
        .arg(&lib)
        .arg(&lib)
        .arg(&dir)
        .arg("--bench")
        .args(extra)
        .output_within();
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    (o, out)
}

#[test]
fn bench_json_rows_use_llama_bench_field_names() {
    let (o, _) = bench(
        "bench-json",
        &["-o", "json", "-r", "3", "-p", "12,0", "-n", "16"],
    );
    let v = json(&o);
    let rows = v.as_array().expect("a JSON array of rows");
    let sizes: Vec<(u64, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["n_prompt"].as_u64().unwrap(),
                r["n_gen"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(sizes, [(12, 0), (0, 16)], "0 skips a test");
    // The writer records its parameter count in the manifest; the bench rows carry it.
    let n_params: usize = qnn_emu::writer::weights(&SynthSpec::default())
        .iter()
        .map(|(_, _, v)| v.len())
        .sum();
    for r in rows {
        for key in [
            "build_commit",
            "model_filename",
            "model_type",
            "model_size",
            "model_n_params",
            "backends",
            "n_depth",
            "test_time",
        ] {
            assert!(!r[key].is_null(), "no {key}: {r}");
        }
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["stddev_ts"].as_f64().unwrap() >= 0.0, "{r}");
        let ns: Vec<u64> = r["samples_ns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(ns.len(), 3);
        // avg_ns is the mean of the samples; avg_ts the mean of the per-sample rates.
        let mean = ns.iter().sum::<u64>() as f64 / 3.0;
        assert!((r["avg_ns"].as_f64().unwrap() - mean).abs() <= 1.0, "{r}");
        let n = (r["n_prompt"].as_u64().unwrap() + r["n_gen"].as_u64().unwrap()) as f64;
        let ts: f64 = ns.iter().map(|&x| n * 1e9 / x as f64).sum::<f64>() / 3.0;
        assert!(
            (r["avg_ts"].as_f64().unwrap() - ts).abs() < 1e-6 * ts,
            "{r}"
        );
        // The CPU emulator is named, not passed off as the HTP (it reports a qnn-emu
        // build id under the HTP provider name).
        assert!(
            qnn_emu::BUILD_ID.to_bytes().starts_with(b"qnn-emu"),
            "qhx tells the emulator by this prefix"
        );
        assert_eq!(r["backends"], "qnn-emu (CPU)", "{r}");
        assert_eq!(r["qnn_api"], "2.32.0");
        assert_eq!(r["perf_mode"], "burst");
        assert_eq!(r["io_mode"], "client");
        assert_eq!(r["soc_model"], 87);
        assert_eq!(r["model_n_params"], n_params, "{r}");
    }
    // --json means -o json; jsonl is one object per line.
    let (o, _) = bench(
        "bench-json-flag",
        &["--json", "-r", "1", "-p", "4", "-n", "0"],
    );
    assert_eq!(json(&o).as_array().unwrap().len(), 1);
    let (_, out) = bench(
        "bench-jsonl",
        &["-o", "jsonl", "-r", "1", "-p", "4", "-n", "2"],
    );
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["n_gen"], 2);
}

#[test]
fn bench_md_is_a_padded_table_with_a_build_footer() {
    let (o, out) = bench("bench-md", &["-r", "2", "-p", "12", "-n", "8,0"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "{out}");
    let table = &lines[..4];
    let width = table[0].chars().count();
    for l in table {
        assert!(l.starts_with("| ") && l.ends_with(" |"), "{l}");
        assert_eq!(
            l.chars().count(),
            width,
            "rows are padded to one width:\n{out}"
        );
    }
    for h in ["model", "size", "params", "backend", "I/O", "test", "t/s"] {
        assert!(table[0].contains(&format!(" {h} ")), "{h}: {}", table[0]);
    }
    assert!(
        table[2].contains(" qnn-emu (CPU) ") && !out.contains("HTP_QTI_AISW"),
        "{out}"
    );
    assert!(
        table[2].contains(" pp12 |") && table[3].contains(" tg8 |"),
        "{out}"
    );
    assert!(table[2].contains(" ± "), "{out}");
    assert_eq!(lines[4], "");
    assert!(lines[5].starts_with("build: qhx "), "{out}");
    assert!(!stderr(&o).contains("panicked"));
    // csv: the header names the same fields as the JSON rows.
    let (_, out) = bench("bench-csv", &["-o", "csv", "-r", "1", "-p", "4", "-n", "0"]);
    let mut it = out.lines();
    let head: Vec<&str> = it.next().unwrap().split(',').collect();
    assert!(
        head.contains(&"avg_ts") && head.contains(&"n_prompt"),
        "{out}"
    );
    assert_eq!(it.count(), 1);
}

/// `-v` gives each context binary its load time and resident memory (issue "weight sharing").
#[test]
fn verbose_reports_each_context_load_time() {
    let (dir, m) = bundle("ctx-times", &SynthSpec::default());
    let o = generate(&m, &dir, "2", "x", &["-v"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for role in ["prefill", "decode", "lmhead"] {
        let want = format!("tiny_{role}.bin loaded in ");
        // Load time, then (where the system says, as Linux and Android do) the resident set
        // size just after the context was created.
        let ok = |l: &str| {
            l.contains(&want)
                && if cfg!(target_os = "linux") {
                    l.contains(" ms, resident ") && l.ends_with(" MB after")
                } else {
                    l.ends_with(" ms")
                }
        };
        assert!(err.lines().any(ok), "{role}: {err}");
    }
}

/// `--bench --spec lookup`: every generation test gets a second, speculative row
/// (`tgN+lookup`) with its tokens per verify and executes per token; plain rows say 1
/// execute per token and no draft type.
#[test]
fn bench_spec_adds_a_speculative_row_per_generation_test() {
    let spec = SynthSpec {
        verify: Some(8),
        ..SynthSpec::default()
    };
    let args = [
        "-o", "json", "-r", "1", "-p", "4", "-n", "40", "--spec", "lookup",
    ];
    let (o, _) = bench_on(
        "bench-spec",
        &spec,
        &[&args[..], &["--spec-adaptive", "off"]].concat(),
    );
    let v = json(&o);
    let rows = v.as_array().expect("rows");
    let kinds: Vec<(u64, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["n_gen"].as_u64().unwrap(),
                r["spec_type"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(kinds, [(0, ""), (40, ""), (40, "lookup")], "{v}");
    for r in &rows[..2] {
        assert_eq!(r["decode_executes_per_token"], 1.0, "{r}");
        assert_eq!(r["tokens_per_verify"], 0.0, "{r}");
    }
    let s = &rows[2];
    let per = s["decode_executes_per_token"].as_f64().unwrap();
    let tpv = s["tokens_per_verify"].as_f64().unwrap();
    // A random model's own output repeats: drafts are verified and some kept.
    assert!(per > 0.0 && per < 1.0, "{s}");
    assert!(tpv > 1.0, "{s}");
    let (_, md) = bench_on(
        "bench-spec-md",
        &spec,
        &["-r", "1", "-p", "0", "-n", "16", "--spec", "lookup"],
    );
    assert!(md.contains("tg16+lookup"), "{md}");
}
