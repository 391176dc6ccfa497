//! Speculative decoding (`--spec lookup`) through the real binary on the emulator: greedy
//! output, the finish reason and the kept cache are those of the plain run, whatever ends
//! the run (length inside a verify, a stop string, an end token, a full context, a later
//! `-i` turn), on manifest bundles with a chunked prefill and on Genie bundles. A bundle
//! with no multi-row step over the cache runs plain decode.

mod common;

use common::*;
use qnn_emu::writer::{write_genie_bundle, SynthSpec};
use serde_json::Value;
use std::path::Path;

const PROMPTS: [&str; 3] = [
    "abc abc abc abc abc",
    "the cat sat on the mat; the cat sat on the",
    "x = 1\ny = 2\nx = 1\ny =",
];

fn run(m: &Path, d: &Path, n: &str, prompt: &str, extra: &[&str]) -> Value {
    let o = generate(m, d, n, prompt, &[&["--json"], extra].concat(), &[]);
    assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
    json(&o)
}

/// The plain and the speculative run of one prompt: same ids, text and finish. Returns
/// the speculative run's `"spec"` counts. `spec_extra` goes to the speculative run only;
/// without a `--spec-adaptive` there, every draft is verified (`off`), so what runs does
/// not depend on the machine's timing.
fn same_with(
    m: &Path,
    d: &Path,
    n: &str,
    prompt: &str,
    extra: &[&str],
    spec_extra: &[&str],
) -> Value {
    let plain = run(m, d, n, prompt, extra);
    let adaptive: &[&str] = if spec_extra.contains(&"--spec-adaptive") {
        &[]
    } else {
        &["--spec-adaptive", "off"]
    };
    let spec = run(
        m,
        d,
        n,
        prompt,
        &[extra, &["--spec", "lookup"], adaptive, spec_extra].concat(),
    );
    for k in ["output_ids", "text", "finish_reason"] {
        assert_eq!(plain[k], spec[k], "{k} differs for {prompt:?} {extra:?}");
    }
    assert!(plain.get("spec").is_none());
    spec["spec"].clone()
}

fn same(m: &Path, d: &Path, n: &str, prompt: &str, extra: &[&str]) -> Value {
    same_with(m, d, n, prompt, extra, &[])
}

fn chunked() -> SynthSpec {
    SynthSpec {
        prefill_past: true,
        ..SynthSpec::default()
    }
}

#[test]
fn greedy_output_is_unchanged_and_drafts_are_verified() {
    for (tag, spec, multi_row) in [
        ("spec-chunked-f32", chunked(), true),
        (
            "spec-chunked-f16-shared-hm",
            SynthSpec {
                io: "f16".into(),
                shared: true,
                head_major: true,
                ..chunked()
            },
            true,
        ),
        // A window prefill with a verify graph (k = 4 rows over the decode cache), as the
        // demo bundle has: drafts of up to 3 tokens verify there.
        (
            "spec-window-verify",
            SynthSpec {
                verify: Some(4),
                ..SynthSpec::default()
            },
            true,
        ),
        (
            "spec-none-verify-shared-f16",
            SynthSpec {
                prefill: None,
                verify: Some(8),
                shared: true,
                io: "f16".into(),
                ..SynthSpec::default()
            },
            true,
        ),
        // A prefill window starts only from an empty cache: nothing can verify.
        ("spec-window", SynthSpec::default(), false),
    ] {
        let (d, m) = bundle(tag, &spec);
        let (mut verifies, mut accepted) = (0, 0);
        for p in PROMPTS {
            for draft in [&[][..], &["--draft-max", "2"]] {
                let s = same_with(&m, &d, "48", p, &["--ignore-eos"], draft);
                assert_eq!(s["type"], "lookup");
                verifies += s["verifies"].as_u64().unwrap();
                accepted += s["accepted"].as_u64().unwrap();
                let per = s["decode_executes_per_token"].as_f64().unwrap();
                assert!(per > 0.0 && per <= 1.0, "{tag}: {s}");
            }
        }
        if multi_row {
            assert!(
                verifies > 0 && accepted > 0,
                "{tag}: {verifies} verifies, {accepted} kept"
            );
        } else {
            assert_eq!(verifies, 0, "{tag}");
        }
    }
}

#[test]
fn every_way_a_run_ends_is_the_plain_runs() {
    let (d, m) = bundle("spec-ends", &chunked());
    let p = PROMPTS[1];
    // Length: every n, so some end inside a verify.
    for n in 1..=12 {
        same(&m, &d, &n.to_string(), p, &["--ignore-eos"]);
    }
    let full = run(&m, &d, "40", p, &["--ignore-eos"]);
    let text = full["text"].as_str().unwrap().to_string();
    let out = ids(&full, "output_ids");
    // A stop string from the middle of the plain output.
    let stop: String = text
        .chars()
        .skip(text.chars().count() / 2)
        .take(3)
        .collect();
    let s = same(&m, &d, "40", p, &["--ignore-eos", "-r", &stop]);
    assert!(s["verifies"].as_u64().unwrap() > 0, "{s}");
    // An end token: one the plain run generates at step 20 becomes the bundle's EOS.
    let eos = out[20] as u32;
    let (d2, m2) = bundle("spec-eos", &SynthSpec { eos, ..chunked() });
    same(&m2, &d2, "40", p, &[]);
    // A full context (64 positions): verifies while a 16-row chunk fits, then plain steps.
    let long = PROMPTS[0];
    let r = same(&m, &d, "100", long, &["--ignore-eos"]);
    assert!(r["verifies"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(
        run(&m, &d, "100", long, &["--ignore-eos"])["finish_reason"],
        "ctx_full"
    );
}

/// `-i` keeps the cache between turns: after speculative turns it must hold exactly what
/// plain turns leave, or the next turn's reply differs.
#[test]
fn interactive_turns_continue_as_without_speculation() {
    let (d, m) = bundle("spec-repl", &chunked());
    std::fs::write(
        d.join("tokenizer_config.json"),
        r#"{"chat_template": "{% for m in messages %}{{ m['content'] }}; {% endfor %}"}"#,
    )
    .unwrap();
    let turns = "abc abc abc\nthe cat sat on the mat\nabc abc\n";
    let reply = |extra: &[&str]| {
        let mut c = generate_command(
            &m,
            &d,
            "16",
            "",
            &[&["-i", "--ignore-eos"], extra].concat(),
            &[],
        );
        c.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(turns.as_bytes())
            .unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let plain = reply(&[]);
    assert_eq!(plain.lines().count(), 3, "{plain:?}");
    assert_eq!(reply(&["--spec", "lookup"]), plain);
}

/// A Genie bundle's AR-4 variant verifies up to three drafts per execute (its logits come
/// per row); output equals the plain run's.
#[test]
fn genie_bundle_speculates_with_unchanged_output() {
    let d = tmp("spec-genie");
    let cfg = write_genie_bundle(&d, &SynthSpec::default(), &[4, 1]).unwrap();
    let mut verifies = 0;
    for p in PROMPTS {
        let s = same(&cfg, &d, "32", p, &["--ignore-eos"]);
        verifies += s["verifies"].as_u64().unwrap();
    }
    assert!(verifies > 0);
}

/// Sampled output keeps its distribution in every mode (lookup, lookahead, a draft
/// model): 2,000 seeded runs of three tokens (top-k 5, temperature 1) with and without
/// speculation, on a prompt that repeats the model's own continuation so lookup drafts
/// are often right; the joint distribution of the three
/// tokens passes a two-sample chi-square test at alpha = 0.001. (The acceptance rule is
/// also tested alone, in `sampler`, where the usual broken rule is shown failing.)
#[test]
fn sampled_output_keeps_its_distribution() {
    use qhx::engine::{Engine, GenConfig, Next};
    use std::collections::BTreeMap;
    let (d, m) = bundle("spec-dist", &chunked());
    let lib = emu();
    let spec = qhx::bundle::Spec::load(&m, &d).unwrap();
    let loaded = qhx::load::Loaded::load(&spec, &lib, &lib, &Default::default()).unwrap();
    let mut engine: Engine = Engine::new(loaded.model()).unwrap();
    let tok = loaded.tokenizer();
    let base = tok.encode("abc ab", loaded.model().bos).unwrap();
    let greedy = engine
        .generate(&base, &GenConfig::greedy(6), 0.0, |_| Ok(Next::Continue))
        .unwrap()
        .output_ids;
    // prompt + its greedy continuation + prompt: the suffix matches, the continuation is drafted.
    let ids: Vec<u32> = [&base[..], &greedy[..], &base[..]].concat();
    let runs = 2000;
    // The prompt is fed once; each run rewinds to before its last token and feeds that.
    let last = ids.len() - 1;
    engine.reset();
    engine
        .generate(&ids[..last], &GenConfig::greedy(1), 0.0, |_| {
            Ok(Next::Continue)
        })
        .unwrap();
    let joint = |engine: &mut Engine, spec: Option<qhx::speculative::SpecConfig>| {
        let mut counts: BTreeMap<Vec<u32>, u64> = BTreeMap::new();
        let (mut verifies, mut accepted) = (0, 0);
        for seed in 0..runs {
            engine.rewind(last);
            let cfg = GenConfig {
                sampler: qhx::sampler::SamplerConfig {
                    temp: 1.0,
                    top_k: 5,
                    seed: Some(seed),
                    ..Default::default()
                },
                spec: spec.clone(),
                ..GenConfig::greedy(3)
            };
            let o = engine
                .generate(&ids[last..], &cfg, 0.0, |_| Ok(Next::Continue))
                .unwrap();
            if let Some(s) = &o.spec {
                verifies += s.verifies;
                accepted += s.accepted;
            }
            *counts.entry(o.output_ids).or_default() += 1;
        }
        (counts, verifies, accepted)
    };
    let (plain, _, _) = joint(&mut engine, None);
    use qhx::speculative::{DraftKind, SpecConfig};
    for kind in [DraftKind::Lookup, DraftKind::Lookahead, DraftKind::Draft] {
        if kind == DraftKind::Draft {
            // The same weights with f16 I/O draft (a near-copy of the target).
            let dd = tmp("spec-dist-draft");
            let dm = qnn_emu::writer::write_bundle(
                &dd,
                &SynthSpec {
                    io: "f16".into(),
                    ..SynthSpec::default()
                },
            )
            .unwrap();
            let dm = qhx::draft::DraftModel::load(&dm, &loaded, &Default::default()).unwrap();
            engine.set_draft(Some(dm));
        }
        let (spec, verifies, accepted) = joint(&mut engine, Some(SpecConfig::of(kind)));
        assert!(
            verifies > runs as usize / 10 && accepted > runs as usize / 20,
            "{kind:?}: {verifies} verifies, {accepted} kept"
        );
        chi_square_passes(&plain, &spec, kind.as_str());
    }
}

/// Two-sample chi-square over the joint outcomes (rare ones pooled), at alpha = 0.001.
fn chi_square_passes(
    plain: &std::collections::BTreeMap<Vec<u32>, u64>,
    spec: &std::collections::BTreeMap<Vec<u32>, u64>,
    what: &str,
) {
    let keys: std::collections::BTreeSet<&Vec<u32>> = plain.keys().chain(spec.keys()).collect();
    let (mut stat, mut cats, mut pool) = (0.0, 0usize, (0.0, 0.0));
    for k in keys {
        let a = *plain.get(k).unwrap_or(&0) as f64;
        let b = *spec.get(k).unwrap_or(&0) as f64;
        if a + b < 20.0 {
            pool = (pool.0 + a, pool.1 + b);
        } else {
            stat += (a - b).powi(2) / (a + b);
            cats += 1;
        }
    }
    if pool.0 + pool.1 > 0.0 {
        stat += (pool.0 - pool.1).powi(2) / (pool.0 + pool.1);
        cats += 1;
    }
    let k = (cats - 1).max(1) as f64;
    let crit = k * (1.0 - 2.0 / (9.0 * k) + 3.09 * (2.0 / (9.0 * k)).sqrt()).powi(3);
    assert!(cats >= 4, "{what}: too few outcomes to compare: {cats}");
    assert!(
        stat < crit,
        "{what}: chi2 {stat:.1} >= {crit:.1} over {cats} outcomes"
    );
}

/// A verify graph must sit over the decode cache with two or more rows, fewer than the
/// prefill's; each wrong one is refused at load with one line naming the graph.
#[test]
fn a_wrong_verify_graph_is_refused_by_name() {
    let (d, m) = bundle(
        "spec-verify-bad",
        &SynthSpec {
            verify: Some(4),
            ..SynthSpec::default()
        },
    );
    let doc: Value = serde_json::from_slice(&std::fs::read(&m).unwrap()).unwrap();
    for (tag, graph, want) in [
        // The window prefill graph has no past inputs.
        ("nopast", "tiny_prefill", "tiny_prefill"),
        // The decode graph has one row.
        ("onerow", "tiny_decode", "two or more rows"),
    ] {
        let mut bad = doc.clone();
        bad["artifacts"]["contexts"]["verify"] = serde_json::json!({
            "bin": if graph == "tiny_prefill" { "tiny_prefill.bin" } else { "tiny_decode.bin" },
            "graph": graph,
        });
        let path = d.join(format!("bad-{tag}.json"));
        std::fs::write(&path, serde_json::to_vec(&bad).unwrap()).unwrap();
        let o = generate(&path, &d, "4", "abc", &[], &[]);
        assert_eq!(o.status.code(), Some(1), "{tag}");
        let e = stderr(&o);
        assert!(e.contains(want), "{tag}: {e}");
        assert_eq!(e.trim_end().lines().count(), 1, "{tag}: {e}");
    }
    // As many rows as the prefill: a chunked prefill's job, not a verify's.
    let (d2, m2) = bundle(
        "spec-verify-wide",
        &SynthSpec {
            verify: Some(16),
            ..SynthSpec::default()
        },
    );
    let o = generate(&m2, &d2, "4", "abc", &[], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("fewer rows than the prefill"),
        "{}",
        stderr(&o)
    );
}

/// `--spec-adaptive R`: a verify costing R decode steps pays only while it yields more
/// than R tokens. At R = 50 nothing pays: speculation switches off after its first verify
/// and the drafts after it run as plain decode (scored, not verified). At R = 1.01 every
/// verify that keeps a draft pays, so repetitive text keeps speculating. Output is the
/// plain run's either way.
#[test]
fn speculation_switches_itself_off_when_a_verify_would_lose() {
    let (d, m) = bundle(
        "spec-adaptive",
        &SynthSpec {
            verify: Some(8),
            ..SynthSpec::default()
        },
    );
    let p = PROMPTS[0];
    let dear = same_with(
        &m,
        &d,
        "48",
        p,
        &["--ignore-eos"],
        &["--spec-adaptive", "50"],
    );
    assert_eq!(dear["verifies"], 1, "{dear}");
    assert_eq!(dear["switched_off"], 1, "{dear}");
    assert!(dear["skipped"].as_u64().unwrap() > 0, "{dear}");
    assert_eq!(dear["adaptive"], "cost 50");
    assert_eq!(dear["verify_cost"], 50.0);
    let cheap = same_with(
        &m,
        &d,
        "48",
        p,
        &["--ignore-eos"],
        &["--spec-adaptive", "1.01"],
    );
    let off = same_with(&m, &d, "48", p, &["--ignore-eos"], &[]);
    assert_eq!(cheap["switched_off"], 0, "{cheap}");
    assert_eq!(cheap["skipped"], 0, "{cheap}");
    assert_eq!(cheap["verifies"], off["verifies"], "{cheap} vs {off}");
    assert!(
        cheap["tokens_per_verify"].as_f64().unwrap() > 1.0,
        "{cheap}"
    );
    // A bad value is a usage error naming the flag.
    let o = generate(
        &m,
        &d,
        "4",
        p,
        &["--spec", "lookup", "--spec-adaptive", "-1"],
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--spec-adaptive"), "{}", stderr(&o));
}
