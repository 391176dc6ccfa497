//! `--spec lookahead` and `--spec draft BUNDLE` through the real binary on the emulator:
//! greedy output, text and finish are the plain run's on every bundle shape that verifies
//! (manifest bundles with a chunked prefill or a verify graph, Genie AR-N variants),
//! whatever ends the run; drafts are verified and some kept; a Genie `lade` dialog runs
//! lookahead with its own values; bad settings are one-line usage errors.

mod common;

use common::*;
use qnn_emu::writer::{write_bundle, write_genie_bundle, SynthSpec};
use serde_json::Value;
use std::path::{Path, PathBuf};

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

/// The plain and the speculative run (`mode`, every draft verified): same ids, text and
/// finish. Returns the speculative run's `"spec"` counts.
fn same(m: &Path, d: &Path, n: &str, prompt: &str, extra: &[&str], mode: &[&str]) -> Value {
    let plain = run(m, d, n, prompt, extra);
    let spec = run(
        m,
        d,
        n,
        prompt,
        &[extra, mode, &["--spec-adaptive", "off"]].concat(),
    );
    for k in ["output_ids", "text", "finish_reason"] {
        assert_eq!(
            plain[k], spec[k],
            "{k} differs for {prompt:?} {extra:?} {mode:?}"
        );
    }
    spec["spec"].clone()
}

fn chunked() -> SynthSpec {
    SynthSpec {
        prefill_past: true,
        ..SynthSpec::default()
    }
}

/// A draft bundle for targets made from `SynthSpec::default()` weights: the same weights
/// with f16 I/O (agrees almost always), or another seed (agrees rarely: the rejection path).
fn draft(tag: &str, same_weights: bool) -> PathBuf {
    let d = tmp(tag);
    let s = SynthSpec {
        io: "f16".into(),
        seed: if same_weights {
            SynthSpec::default().seed
        } else {
            SynthSpec::default().seed + 17
        },
        ..SynthSpec::default()
    };
    write_bundle(&d, &s).expect("write draft bundle")
}

fn targets() -> Vec<(&'static str, PathBuf, PathBuf)> {
    let mut t = Vec::new();
    for (tag, spec) in [
        ("modes-chunked-f32", chunked()),
        (
            "modes-chunked-f16-shared-hm",
            SynthSpec {
                io: "f16".into(),
                shared: true,
                head_major: true,
                ..chunked()
            },
        ),
        (
            "modes-window-verify",
            SynthSpec {
                verify: Some(4),
                ..SynthSpec::default()
            },
        ),
    ] {
        let (d, m) = bundle(tag, &spec);
        t.push((tag, d, m));
    }
    let d = tmp("modes-genie");
    let m = write_genie_bundle(&d, &SynthSpec::default(), &[4, 1]).unwrap();
    t.push(("modes-genie", d, m));
    t
}

#[test]
fn lookahead_and_draft_keep_greedy_output_on_every_shape_that_verifies() {
    let near = draft("modes-draft-near", true);
    let far = draft("modes-draft-far", false);
    let (near, far) = (near.to_str().unwrap(), far.to_str().unwrap());
    for (tag, d, m) in targets() {
        for mode in [
            &["--spec", "lookahead"][..],
            &[
                "--spec",
                "lookahead",
                "--lookahead-ngram",
                "2",
                "--lookahead-window",
                "3",
            ],
            &["--spec", "draft", near],
            &[
                "--spec",
                "draft",
                near,
                "--draft-p-min",
                "0",
                "--draft-max",
                "2",
            ],
            &["--spec", "draft", far, "--draft-p-min", "0"],
        ] {
            let (mut verifies, mut kept, mut tokens) = (0, 0, 0);
            for p in PROMPTS {
                let s = same(&m, &d, "40", p, &["--ignore-eos"], mode);
                assert_eq!(s["type"], mode[1], "{tag}");
                verifies += s["verifies"].as_u64().unwrap();
                kept += s["accepted"].as_u64().unwrap();
                tokens += (s["tokens_per_verify"].as_f64().unwrap()
                    * s["verifies"].as_f64().unwrap()) as u64;
                if mode[1] == "draft" {
                    assert!(s["draft_executes"].as_u64().unwrap() > 0, "{tag} {s}");
                } else {
                    assert!(s["pool"].as_u64().unwrap() > 0, "{tag} {s}");
                }
            }
            assert!(verifies > 0, "{tag} {mode:?}: nothing verified");
            let bundle = mode.get(2).copied();
            if bundle == Some(near) && mode.len() > 3 {
                // The same weights at f16 I/O: nearly every draft is kept.
                assert!(
                    kept * 10 >= (tokens - verifies) * 8 && kept > verifies,
                    "{tag} {mode:?}: {kept} kept of {tokens} tokens over {verifies} verifies"
                );
            } else if bundle != Some(far) {
                assert!(kept > 0, "{tag} {mode:?}: no draft kept");
            }
        }
    }
}

#[test]
fn every_way_a_run_ends_is_the_plain_runs_in_each_mode() {
    let (d, m) = bundle("modes-ends", &chunked());
    let near = draft("modes-ends-draft", true);
    let near = near.to_str().unwrap();
    let p = PROMPTS[1];
    for mode in [
        &["--spec", "lookahead"][..],
        &["--spec", "draft", near, "--draft-p-min", "0"],
    ] {
        // Length: every n, so some end inside a verify.
        for n in 1..=10 {
            same(&m, &d, &n.to_string(), p, &["--ignore-eos"], mode);
        }
        let full = run(&m, &d, "40", p, &["--ignore-eos"]);
        let text = full["text"].as_str().unwrap().to_string();
        let out = ids(&full, "output_ids");
        let stop: String = text
            .chars()
            .skip(text.chars().count() / 2)
            .take(3)
            .collect();
        let s = same(&m, &d, "40", p, &["--ignore-eos", "-r", &stop], mode);
        assert!(s["verifies"].as_u64().unwrap() > 0, "{mode:?} {s}");
        // An end token the plain run generates at step 20.
        let eos = out[20] as u32;
        let (d2, m2) = bundle("modes-eos", &SynthSpec { eos, ..chunked() });
        same(&m2, &d2, "40", p, &[], mode);
        // A full context (64 positions).
        let r = same(&m, &d, "100", PROMPTS[0], &["--ignore-eos"], mode);
        assert!(r["verifies"].as_u64().unwrap() > 0, "{mode:?} {r}");
    }
}

#[test]
fn interactive_turns_continue_as_without_speculation_in_each_mode() {
    let (d, m) = bundle("modes-repl", &chunked());
    std::fs::write(
        d.join("tokenizer_config.json"),
        r#"{"chat_template": "{% for m in messages %}{{ m['content'] }}; {% endfor %}"}"#,
    )
    .unwrap();
    let near = draft("modes-repl-draft", true);
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
    assert_eq!(reply(&["--spec", "lookahead"]), plain);
    assert_eq!(reply(&["--spec", "draft", near.to_str().unwrap()]), plain);
}

/// Genie's `lade` dialog: qhx runs lookahead with the config's window / ngram / gcap and
/// writes the plain dialog's text; `--spec` given on the command line wins. A `lade` block
/// Genie would refuse is refused by name.
#[test]
fn a_genie_lade_dialog_runs_lookahead_with_its_values_and_the_plain_text() {
    let d = tmp("modes-lade");
    let cfg = write_genie_bundle(&d, &SynthSpec::default(), &[4, 1]).unwrap();
    let mut v: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    v["dialog"]["type"] = "lade".into();
    v["dialog"]["lade"] = serde_json::json!({
        "version": 1, "update-mode": "ALWAYS_FWD_ONE", "window": 3, "ngram": 3, "gcap": 4
    });
    let lade = d.join("lade_config.json");
    std::fs::write(&lade, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    for p in PROMPTS {
        let plain = run(&cfg, &d, "32", p, &["--ignore-eos"]);
        let o = generate(&lade, &d, "32", p, &["--json", "--ignore-eos"], &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        let la = json(&o);
        assert_eq!(la["output_ids"], plain["output_ids"], "{p:?}");
        assert_eq!(la["text"], plain["text"], "{p:?}");
        assert_eq!(la["spec"]["type"], "lookahead", "{la}");
        assert!(plain.get("spec").is_none());
        let e = stderr(&o);
        assert!(
            e.contains("window 3, ngram 3, gcap 4") && e.contains("ALWAYS_FWD_ONE"),
            "{e}"
        );
        // The command line's --spec replaces the config's.
        let lk = run(&lade, &d, "32", p, &["--ignore-eos", "--spec", "lookup"]);
        assert_eq!(lk["spec"]["type"], "lookup");
        assert_eq!(lk["output_ids"], plain["output_ids"]);
    }
    for (key, val, needle) in [
        ("version", serde_json::json!(2), "dialog.lade.version"),
        (
            "update-mode",
            serde_json::json!("SIDEWAYS"),
            "dialog.lade.update-mode",
        ),
        ("ngram", serde_json::json!(1), "dialog.lade.ngram"),
        ("branches", serde_json::json!(2), "branches"),
    ] {
        let mut b = v.clone();
        b["dialog"]["lade"][key] = val;
        let f = d.join("bad_lade.json");
        std::fs::write(&f, serde_json::to_vec(&b).unwrap()).unwrap();
        let o = generate(&f, &d, "4", "abc", &[], &[]);
        assert_eq!(o.status.code(), Some(1), "{key}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains(needle) && e.trim().lines().count() == 1,
            "{key}: {e}"
        );
    }
    // A lade block on a basic dialog is refused as Genie refuses it.
    let mut b = v.clone();
    b["dialog"]["type"] = "basic".into();
    let f = d.join("bad_lade.json");
    std::fs::write(&f, serde_json::to_vec(&b).unwrap()).unwrap();
    let o = generate(&f, &d, "4", "abc", &[], &[]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("dialog.lade is for dialog.type"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bad_speculation_settings_are_one_line_usage_errors() {
    let (d, m) = bundle("modes-usage", &chunked());
    let other = tmp("modes-usage-vocab");
    // Another vocab; the same vocab size split by another tokenizer (BPE merges).
    let wide = write_bundle(
        &other,
        &SynthSpec {
            vocab: 400,
            tokenizer_vocab: Some(400),
            ..SynthSpec::default()
        },
    )
    .unwrap();
    let other2 = tmp("modes-usage-split");
    let split = write_bundle(&other2, &SynthSpec::default()).unwrap();
    // Its tokenizer gives "a" and "b" each other's ids.
    let tf = other2.join("tokenizer.json");
    let mut t: Value = serde_json::from_slice(&std::fs::read(&tf).unwrap()).unwrap();
    let vocab = t["model"]["vocab"].as_object_mut().unwrap();
    let (a, b) = (vocab["a"].clone(), vocab["b"].clone());
    vocab.insert("a".into(), b);
    vocab.insert("b".into(), a);
    std::fs::write(&tf, serde_json::to_vec(&t).unwrap()).unwrap();
    for (args, code, needle) in [
        (
            vec!["--spec", "draft"],
            2,
            "--spec draft needs the draft bundle",
        ),
        (
            vec!["--spec", "lookup", "x.json"],
            2,
            "--spec lookup takes no bundle",
        ),
        (
            vec!["--spec", "jacobi"],
            2,
            "expected lookup, lookahead or draft",
        ),
        (
            vec!["--spec", "lookahead", "--lookahead-ngram", "1"],
            2,
            "--lookahead-ngram",
        ),
        (
            vec!["--spec", "lookup", "--lookahead-window", "3"],
            2,
            "--lookahead-window is an option of --spec lookahead",
        ),
        (
            vec!["--spec", "lookahead", "--lookup-min", "1"],
            2,
            "--lookup-min is an option of --spec lookup",
        ),
        (
            vec!["--spec", "draft", "d.json", "--draft-p-min", "1.5"],
            2,
            "--draft-p-min",
        ),
        (
            vec!["--spec", "draft", "/nonexistent/draft.json"],
            1,
            "/nonexistent/draft.json",
        ),
        (
            vec!["--spec", "draft", wide.to_str().unwrap()],
            1,
            "vocab is 400 tokens, the target's 258",
        ),
        (
            vec!["--spec", "draft", split.to_str().unwrap()],
            1,
            "splits text differently",
        ),
    ] {
        let o = generate(&m, &d, "4", "abc", &args, &[]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {e}");
        assert!(e.contains(needle), "{args:?}: {e}");
        assert!(e.trim().lines().count() <= 2, "{args:?}: {e}");
        assert!(stdout(&o).is_empty(), "{args:?}");
    }
}
