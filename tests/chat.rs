//! Chat templates against HF goldens (tests/goldens/chat, made by tests/golden_tools/chat_goldens.py),
//! reasoning modes, -f prompt files and the -i REPL, through the real binary on the tiny
//! Qwen2 parity bundle (DeepSeek-R1-Distill tokenizer).

mod common;

use common::*;
use qhx::chat::{ChatTemplate, Message};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

fn parity_dir() -> PathBuf {
    std::env::var_os("QHX_PARITY_BUNDLES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bundles/parity"))
}

fn golden() -> serde_json::Value {
    golden_file("deepseek-r1-distill")
}

fn golden_file(name: &str) -> serde_json::Value {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/goldens/chat/{name}.json"));
    serde_json::from_slice(&std::fs::read(p).expect("chat golden")).expect("golden JSON")
}

fn messages(v: &serde_json::Value) -> Vec<Message> {
    serde_json::from_value(v.clone()).expect("messages")
}

/// The tiny Qwen2 bundle, linked into a fresh dir with the golden's template written as
/// `chat_template.jinja` beside tokenizer.json (the bundle's manifest has no chat section).
fn qwen2_chat_bundle(tag: &str) -> (PathBuf, PathBuf) {
    qwen2_bundle_with(tag, |t| t.to_string())
}

/// The DeepSeek-R1-Distill bundle with the template's generation prompt opening the
/// reasoning block (`<｜Assistant｜><think>\n`, as DeepSeek's later templates write it), so a
/// reply starts inside the block whatever this tiny random model emits.
fn qwen2_thinking_bundle(tag: &str) -> (PathBuf, PathBuf) {
    qwen2_bundle_with(tag, |t| {
        let gen = "{{'<｜Assistant｜>'}}{% endif %}";
        assert!(t.ends_with(gen), "the golden template changed");
        format!(
            "{}{{{{'<｜Assistant｜><think>\n'}}}}{{% endif %}}",
            &t[..t.len() - gen.len()]
        )
    })
}

fn qwen2_bundle_with(tag: &str, template: impl Fn(&str) -> String) -> (PathBuf, PathBuf) {
    let src = parity_dir().join("qwen2-f32");
    let man = src.join("tiny_qwen2.json");
    assert!(
        man.is_file(),
        "run scripts/build-parity.sh first ({})",
        man.display()
    );
    let d = tmp(tag);
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        std::os::unix::fs::symlink(&p, d.join(p.file_name().unwrap())).unwrap();
    }
    let g = golden();
    std::fs::write(
        d.join("chat_template.jinja"),
        template(g["template"].as_str().unwrap()),
    )
    .unwrap();
    (d.clone(), d.join("tiny_qwen2.json"))
}

fn run(man: &Path, root: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let lib = emu();
    let mut c = command(bin());
    c.arg(man).arg(&lib).arg(&lib).arg(root).args(args);
    c.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut ch = c.spawn().expect("spawn qhx_generate");
    if let Some(s) = stdin {
        ch.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    ch.wait_with_output().unwrap()
}

fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        stderr(o)
    );
}

fn template(g: &serde_json::Value) -> ChatTemplate {
    ChatTemplate {
        source: g["template"].as_str().unwrap().into(),
        origin: "golden".into(),
        bos_token: g["bos_token"].as_str().unwrap().into(),
        eos_token: g["eos_token"].as_str().unwrap().into(),
    }
}

#[test]
fn template_features_render_like_hf_jinja2() {
    // Loop controls, namespace, str methods, tojson, negative indexing, trim/lstrip blocks.
    let g = golden_file("features");
    let t = template(&g);
    let convs = g["conversations"].as_array().unwrap();
    assert_eq!(convs.len(), 3);
    for c in convs {
        let got = t.render(&messages(&c["messages"]), true).unwrap();
        assert_eq!(got, c["text"].as_str().unwrap(), "{}", c["name"]);
    }
    let e = t
        .render(&messages(&g["error_case"]["messages"]), true)
        .unwrap_err()
        .to_string();
    let want = g["error_case"]["hf_error"].as_str().unwrap();
    assert!(e.contains(want), "{e} lacks {want:?}");
}

#[test]
fn library_render_matches_hf_goldens_smollm2() {
    let g = golden_file("smollm2");
    let tok = qhx::tokenizer::Tokenizer::load(&parity_dir().join("smollm2-f32/tokenizer.json"))
        .expect("run scripts/build-parity.sh first");
    let t = template(&g);
    for c in g["conversations"].as_array().unwrap() {
        let m = messages(&c["messages"]);
        assert_eq!(t.render(&m, true).unwrap(), c["text"].as_str().unwrap());
        let got: Vec<u64> = t
            .encode(&tok, &m, true)
            .unwrap()
            .into_iter()
            .map(u64::from)
            .collect();
        assert_eq!(got, ids(c, "ids"), "{}", c["name"]);
    }
}

#[test]
fn cli_chat_on_the_smollm2_manifest_template_matches_hf() {
    // The template comes from the manifest's chat.template here.
    let d = parity_dir().join("smollm2-f32");
    let man = d.join("smollm2.json");
    let g = golden_file("smollm2");
    let t = tmp("chat-smollm2");
    for c in g["conversations"].as_array().unwrap() {
        let f = t.join(format!("{}.json", c["name"].as_str().unwrap()));
        std::fs::write(&f, c["messages"].to_string()).unwrap();
        let o = run(
            &man,
            &d,
            &["1", "--chat", "--messages", f.to_str().unwrap(), "--json"],
            None,
        );
        ok(&o);
        assert_eq!(ids(&json(&o), "input_ids"), ids(c, "ids"), "{}", c["name"]);
    }
}

#[test]
fn library_render_matches_hf_goldens() {
    let g = golden();
    let tok = qhx::tokenizer::Tokenizer::load(&parity_dir().join("tok/deepseek-r1-distill.json"))
        .expect("run scripts/build-parity.sh first");
    let t = template(&g);
    let convs = g["conversations"].as_array().unwrap();
    assert_eq!(convs.len(), 5);
    for c in convs {
        let m = messages(&c["messages"]);
        assert_eq!(
            t.render(&m, true).unwrap(),
            c["text"].as_str().unwrap(),
            "{}",
            c["name"]
        );
        let want = ids(c, "ids");
        let got: Vec<u64> = t
            .encode(&tok, &m, true)
            .unwrap()
            .into_iter()
            .map(u64::from)
            .collect();
        assert_eq!(got, want, "{}", c["name"]);
    }
}

#[test]
fn cli_chat_input_ids_match_hf_goldens() {
    let (d, man) = qwen2_chat_bundle("chat-goldens");
    for c in golden()["conversations"].as_array().unwrap() {
        let f = d.join(format!("{}.messages.json", c["name"].as_str().unwrap()));
        std::fs::write(&f, c["messages"].to_string()).unwrap();
        let o = run(
            &man,
            &d,
            &["2", "--chat", "--messages", f.to_str().unwrap(), "--json"],
            None,
        );
        ok(&o);
        assert_eq!(ids(&json(&o), "input_ids"), ids(c, "ids"), "{}", c["name"]);
    }
    // The same through the prompt and -sys flags.
    let g = golden();
    let su = &g["conversations"][1];
    let m = messages(&su["messages"]);
    let o = run(
        &man,
        &d,
        &[
            "2",
            "-sys",
            &m[0].content,
            "--chat",
            "-p",
            &m[1].content,
            "--json",
        ],
        None,
    );
    ok(&o);
    assert_eq!(ids(&json(&o), "input_ids"), ids(su, "ids"));
}

#[test]
fn chat_without_a_template_is_one_clear_error() {
    let (dir, m) = bundle("chat-none", &qnn_emu::writer::SynthSpec::default());
    let o = generate(&m, &dir, "2", "hi", &["--chat"], &[]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("no chat template"), "{e}");
    // Found before the bundle loads: no banner, just the error.
    assert_eq!(e.trim().lines().count(), 1, "{e}");
}

#[test]
fn reasoning_hide_prints_only_what_follows_think_close() {
    let (d, man) = qwen2_thinking_bundle("chat-reason");
    let base = [
        "12",
        "--chat",
        "-p",
        "Why is the sky blue?",
        "--ignore-eos",
        "--reasoning-budget",
        "4",
    ];
    let with = |extra: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend_from_slice(extra);
        let o = run(&man, &d, &a, None);
        ok(&o);
        o
    };
    // The budget forces </think> after 4 tokens: the shown text has it.
    let shown = stdout(&with(&[]));
    let close = shown
        .find("</think>")
        .unwrap_or_else(|| panic!("no </think> in {shown:?}"));
    let hidden = stdout(&with(&["--reasoning", "hide"]));
    assert!(!hidden.contains("</think>"), "{hidden:?}");
    let answer = shown[close + "</think>".len()..].trim_start();
    assert_eq!(hidden, answer, "hide prints exactly the answer");
    let doc = json(&with(&["--reasoning", "strip", "--json"]));
    let out = ids(&doc, "output_ids");
    assert_eq!(out.len(), 12);
    assert_eq!(format!("{}\n", doc["text"].as_str().unwrap()), answer);
    // Without the budget nothing closes the block in 12 tokens of this model: all hidden.
    let o = run(
        &man,
        &d,
        &[
            "12",
            "--chat",
            "-p",
            "Why is the sky blue?",
            "--ignore-eos",
            "--reasoning",
            "hide",
        ],
        None,
    );
    ok(&o);
    let plain = run(
        &man,
        &d,
        &["12", "--chat", "-p", "Why is the sky blue?", "--ignore-eos"],
        None,
    );
    if !stdout(&plain).contains("</think>") {
        assert_eq!(stdout(&o), "\n");
    }
}

#[test]
fn prompt_from_file_and_stdin_equals_p() {
    let (dir, m) = bundle("chat-file", &qnn_emu::writer::SynthSpec::default());
    let f = dir.join("prompt.txt");
    std::fs::write(&f, "hello from a file\n").unwrap();
    let a = run(&m, &dir, &["3", "-p", "hello from a file", "--json"], None);
    let b = run(&m, &dir, &["3", "-f", f.to_str().unwrap(), "--json"], None);
    let c = run(
        &m,
        &dir,
        &["3", "-f", "-", "--json", "--verbose-prompt"],
        Some("hello from a file\n"),
    );
    for o in [&a, &b, &c] {
        ok(o);
    }
    assert_eq!(ids(&json(&a), "input_ids"), ids(&json(&b), "input_ids"));
    assert_eq!(ids(&json(&a), "input_ids"), ids(&json(&c), "input_ids"));
    let n = ids(&json(&a), "input_ids").len();
    assert!(
        stderr(&c).contains(&format!("qhx: prompt {n} ids: [")),
        "{}",
        stderr(&c)
    );
    // An unreadable prompt file is a usage error (nothing was loaded), as bad prompt bytes are.
    let missing = run(&m, &dir, &["3", "-f", "/nonexistent/p.txt"], None);
    assert_eq!(missing.status.code(), Some(2));
    assert!(stderr(&missing).contains("/nonexistent/p.txt"));
}

fn field(line: &str, key: &str) -> usize {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        .parse()
        .unwrap()
}

#[test]
fn interactive_five_turns_feed_only_new_tokens() {
    let (d, man) = qwen2_chat_bundle("chat-repl");
    let tr = d.join("transcript.json");
    let turns = [
        "Hello!",
        "What is the capital of France?",
        "Et en français ?",
        "Count to three.",
        "Thanks, bye.",
    ];
    let mut script: String = turns.iter().map(|t| format!("{t}\n")).collect();
    script.push_str("/stats\n");
    let o = run(
        &man,
        &d,
        &[
            "3",
            "-i",
            "-sys",
            "Be brief.",
            "--transcript",
            tr.to_str().unwrap(),
        ],
        Some(&script),
    );
    ok(&o);
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("qhx: turn=")).collect();
    assert_eq!(lines.len(), 5, "{err}");
    assert_eq!(stdout(&o).lines().count(), 5, "one reply line per turn");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&tr).unwrap()).unwrap();
    let hist = messages(&doc["messages"]);
    assert_eq!(hist.len(), 10);
    let mut prev_total: usize = 0;
    for (k, l) in lines.iter().enumerate() {
        // A single-shot --chat render of the conversation up to turn k's user message.
        let upto: Vec<&Message> = hist[..2 * k + 1].iter().collect();
        let f = d.join(format!("turn{k}.json"));
        std::fs::write(&f, serde_json::to_string(&upto).unwrap()).unwrap();
        let one = run(
            &man,
            &d,
            &[
                "1",
                "--chat",
                "-sys",
                "Be brief.",
                "--messages",
                f.to_str().unwrap(),
                "--json",
            ],
            None,
        );
        ok(&one);
        let render = ids(&json(&one), "input_ids");
        assert_eq!(field(l, "prompt"), render.len(), "turn {k}: {l}");
        assert!(l.contains("reset=false"), "turn {k}: {l}");
        // The cache holds the previous transcript minus its unfed last token.
        let cached = field(l, "cached");
        assert_eq!(cached, prev_total.saturating_sub(1), "turn {k}: {l}");
        assert_eq!(field(l, "fed"), render.len() - cached, "turn {k}: {l}");
        if k == 4 {
            let all = ids(&doc, "ids");
            assert_eq!(
                &all[..render.len()],
                &render[..],
                "transcript = single shot"
            );
            assert_eq!(all.len(), render.len() + field(l, "generated"));
            // The kept cache gives the reply a fresh single-shot run gives.
            let fresh = run(
                &man,
                &d,
                &[
                    "3",
                    "--chat",
                    "-sys",
                    "Be brief.",
                    "--messages",
                    f.to_str().unwrap(),
                    "--json",
                ],
                None,
            );
            ok(&fresh);
            assert_eq!(&all[render.len()..], &ids(&json(&fresh), "output_ids")[..]);
        }
        prev_total = render.len() + field(l, "generated");
    }
    let stats = err.lines().find(|l| l.contains("qhx: stats")).unwrap();
    assert!(stats.contains("turns=5"), "{stats}");
    assert_eq!(field(stats, "last_fed"), field(lines[4], "fed"));
}

#[test]
fn interactive_context_full_and_reset() {
    let (d, man) = qwen2_chat_bundle("chat-full");
    let long = "word ".repeat(700);
    let script = format!("{long}\n/reset\nHi\n");
    let o = run(&man, &d, &["2", "-i"], Some(&script));
    ok(&o);
    let err = stderr(&o);
    assert!(err.contains("context full"), "{err}");
    assert!(err.contains("conversation reset"), "{err}");
    assert_eq!(err.lines().filter(|l| l.contains("qhx: turn=")).count(), 1);
}

#[test]
fn interactive_resets_when_the_template_rewrites_history() {
    // The budget forces </think> into turn 1's reply; the DeepSeek template drops what comes
    // before </think> in earlier replies, so turn 2's render does not extend the transcript:
    // the cache is rewound to the common prefix and the rest fed. The first turn comes
    // from -p. Turn 2's reply must equal a fresh single-shot run over the same render.
    let (d, man) = qwen2_thinking_bundle("chat-rewrite");
    let tr = d.join("transcript.json");
    let o = run(
        &man,
        &d,
        &[
            "6",
            "-i",
            "-p",
            "Think first.",
            "--ignore-eos",
            "--reasoning-budget",
            "2",
            "--transcript",
            tr.to_str().unwrap(),
        ],
        Some("Second turn\n"),
    );
    ok(&o);
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("qhx: turn=")).collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(stdout(&o).lines().next().unwrap().contains("</think>"));
    assert!(lines[0].contains("reset=false"), "{}", lines[0]);
    assert!(lines[1].contains("reset=true"), "{}", lines[1]);
    let cached = field(lines[1], "cached");
    assert!(
        cached > 0 && cached <= field(lines[0], "prompt"),
        "{}",
        lines[1]
    );
    assert_eq!(field(lines[1], "fed"), field(lines[1], "prompt") - cached);
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&tr).unwrap()).unwrap();
    let hist = messages(&doc["messages"]);
    let f = d.join("upto.json");
    std::fs::write(&f, serde_json::to_string(&hist[..3]).unwrap()).unwrap();
    let one = run(
        &man,
        &d,
        &[
            "6",
            "--chat",
            "--messages",
            f.to_str().unwrap(),
            "--ignore-eos",
            "--reasoning-budget",
            "2",
            "--json",
        ],
        None,
    );
    ok(&one);
    let one = json(&one);
    let (inp, out) = (ids(&one, "input_ids"), ids(&one, "output_ids"));
    let all = ids(&doc, "ids");
    assert_eq!(all.len(), inp.len() + out.len());
    assert_eq!(
        &all[..inp.len()],
        &inp[..],
        "transcript = single-shot render"
    );
    assert_eq!(
        &all[inp.len()..],
        &out[..],
        "rewound cache gives the same reply"
    );
    // -i takes no --json.
    let bad = run(&man, &d, &["2", "-i", "--json"], Some(""));
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn template_from_tokenizer_config_wins_over_chat_template_jinja() {
    // tokenizer_config.json (string or named-list form) before chat_template.jinja; its
    // bos_token (an AddedToken object here) is the one rendered. The expected ids are those
    // of the plain prompt "<|bos|>user:hi|" through the same tokenizer.
    let (dir, m) = bundle("chat-cfg", &qnn_emu::writer::SynthSpec::default());
    std::fs::write(dir.join("chat_template.jinja"), "WRONG").unwrap();
    let tmpl = "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}|{% endfor %}";
    let plain = json(&generate(
        &m,
        &dir,
        "1",
        "<|bos|>user:hi|",
        &["--json"],
        &[],
    ));
    let want = ids(&plain, "input_ids");
    assert_eq!(
        want.first(),
        Some(&256),
        "the tiny tokenizer maps <|bos|> to 256"
    );
    for cfg in [
        serde_json::json!({"chat_template": tmpl, "bos_token": {"content": "<|bos|>"}}),
        serde_json::json!({"chat_template": [{"name": "default", "template": tmpl}],
                           "bos_token": "<|bos|>"}),
    ] {
        std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
        let o = generate(&m, &dir, "1", "hi", &["--chat", "--json"], &[]);
        ok(&o);
        assert_eq!(ids(&json(&o), "input_ids"), want, "{cfg}");
    }
    std::fs::remove_file(dir.join("tokenizer_config.json")).unwrap();
    let o = generate(&m, &dir, "1", "hi", &["--chat", "--json"], &[]);
    ok(&o);
    let wrong = json(&generate(&m, &dir, "1", "WRONG", &["--json"], &[]));
    assert_eq!(ids(&json(&o), "input_ids"), ids(&wrong, "input_ids"));
}
