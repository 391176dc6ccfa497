//! Regressions of the command line a llama.cpp user drives: one test per defect found by
//! trying qhx_generate as a new user (each failed before its fix), plus the llama-cli
//! expectations (`-n`, `--quiet`, `--version`, sampling transparency).

mod common;

use common::*;
use qnn_emu::writer::SynthSpec;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

fn run(args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> Output {
    let mut c = command(bin());
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output_within()
}

/// The banner prints once the bundle has loaded.
fn loaded(o: &Output) -> bool {
    stderr(o).lines().any(|l| l.starts_with("qhx 0."))
}

/// A minimal chat template for the synthetic bundles (they ship none).
fn with_template(dir: &Path, template: &str) {
    std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
}

const TEMPLATE: &str = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";

#[test]
fn missing_positionals_are_all_named() {
    let (_d, m) = bundle("reg-missing", &SynthSpec::default());
    let o = run(&[m.as_os_str()], &[]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    for name in ["<BACKEND_LIB>", "<SYSTEM_LIB>", "<ARTIFACTS_ROOT>"] {
        assert!(err.contains(name), "{name} missing from: {err}");
    }
}

#[test]
fn a_mistyped_artifacts_root_is_an_error_not_a_prompt() {
    let (d, m) = bundle("reg-typo", &SynthSpec::default());
    let lib = emu();
    let typo = d.with_file_name("reg-typo_missing");
    let o = run(
        &[
            m.as_os_str(),
            lib.as_os_str(),
            lib.as_os_str(),
            typo.as_os_str(),
            "4".as_ref(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "generated: {}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains("reg-typo_missing") && err.contains("does not exist"),
        "{err}"
    );
    // The same with a bare word (no separator): still a missing directory, not a prompt.
    let o = command(bin())
        .current_dir(d.parent().unwrap())
        .arg(&m)
        .arg(&lib)
        .arg(&lib)
        .arg("smollm2_typo")
        .arg("4")
        .output_within();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "generated: {}", stdout(&o));
}

/// `n_tokens` ids, greedy, through --json.
fn greedy_ids(m: &Path, d: &Path, n: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    let o = generate(m, d, n, "parity check", &args, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    json(&o)
}

#[test]
fn expected_or_forced_ids_shorter_than_n_tokens_finish_by_length() {
    let (d, m) = bundle("reg-expect", &SynthSpec::default());
    let v = greedy_ids(&m, &d, "3", &["--ignore-eos"]);
    let list: Vec<String> = ids(&v, "output_ids")
        .iter()
        .map(|x| x.to_string())
        .collect();
    let list = list.join(",");
    for flag in ["--expect-tokens", "--teacher-force"] {
        let v = greedy_ids(&m, &d, "10", &[flag, &list]);
        assert_eq!(ids(&v, "output_ids").len(), 3, "{flag}: {v}");
        assert_eq!(v["finish_reason"], "length", "{flag}: {v}");
    }
}

#[test]
fn a_manifest_with_fewer_layers_than_the_graph_is_rejected() {
    let (d, m) = bundle("reg-layers", &SynthSpec::default());
    edit_json(&m, |v| v["params"]["n_layers"] = 1.into());
    let o = generate(&m, &d, "4", "hi", &[], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("n_layers=1") && err.contains("new_k_1"),
        "{err}"
    );
    assert!(o.stdout.is_empty());
}

#[test]
fn os_errors_and_manifest_errors_print_each_cause_once() {
    let (d, m) = bundle("reg-once", &SynthSpec::default());
    let o = generate(&d.join("absent.json"), &d, "4", "hi", &[], &[]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // A truncated manifest: the parser's message, without a stray `?:` path.
    let text = std::fs::read_to_string(&m).unwrap();
    std::fs::write(&m, &text[..text.len() / 2]).unwrap();
    let o = generate(&m, &d, "4", "hi", &[], &[]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(!err.contains("?:"), "{err}");
    assert!(err.contains("EOF"), "{err}");
}

#[test]
fn input_errors_are_usage_errors_reported_before_loading() {
    let (d, m) = bundle("reg-early", &SynthSpec::default());
    let bad_msgs = d.join("bad_messages.json");
    std::fs::write(&bad_msgs, "[{\"role\": \"user\"").unwrap();
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("--expect-tokens", vec!["--expect-tokens", "1,x,3"], "1,x,3"),
        (
            "--teacher-force",
            vec!["--teacher-force", "[1"],
            "--teacher-force",
        ),
        (
            "--messages",
            vec!["--chat", "--messages", bad_msgs.to_str().unwrap()],
            "bad_messages.json",
        ),
    ];
    with_template(&d, TEMPLATE);
    for (what, extra, needle) in cases {
        let o = generate(&m, &d, "4", "hi", &extra, &[]);
        assert_eq!(o.status.code(), Some(2), "{what}: {}", stderr(&o));
        assert!(!loaded(&o), "{what}: loaded first: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{what}: {}", stderr(&o));
    }
    // An empty prompt.
    let o = generate(&m, &d, "4", "", &[], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        !loaded(&o) && stderr(&o).contains("empty"),
        "{}",
        stderr(&o)
    );
    // A template that refuses the conversation.
    with_template(&d, "{{ raise_exception('roles must alternate') }}");
    let o = generate(&m, &d, "4", "hi", &["--chat"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!loaded(&o), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("roles must alternate"),
        "{}",
        stderr(&o)
    );
}

/// Spawn `-i` on a chat-enabled tiny bundle with piped stdin/stdout/stderr.
fn interactive(tag: &str, extra: &[&str], env: &[(&str, &str)]) -> std::process::Child {
    let (d, m) = bundle(
        tag,
        &SynthSpec {
            ctx: 256,
            ..SynthSpec::default()
        },
    );
    with_template(&d, TEMPLATE);
    let lib = emu();
    let mut c = command(bin());
    c.arg(&m)
        .arg(&lib)
        .arg(&lib)
        .arg(&d)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

#[cfg(unix)]
#[test]
fn interactive_survives_ctrl_c_and_answers_the_next_turn() {
    let mut ch = interactive(
        "reg-i-cancel",
        &["100", "-i", "--ignore-eos"],
        &[("QNN_EMU_DELAY_MS", "20")],
    );
    let mut stdin = ch.stdin.take().unwrap();
    let mut stdout = ch.stdout.take().unwrap();
    let mut err = BufReader::new(ch.stderr.take().unwrap());
    stdin.write_all(b"first turn\n").unwrap();
    // Wait for the reply to start streaming, then Ctrl-C.
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let st = Command::new("kill")
        .args(["-INT", &ch.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let mut turns = Vec::new();
    let mut line = String::new();
    while turns.is_empty() {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "stderr ended");
        if line.contains("qhx: turn=") {
            turns.push(line.trim().to_string());
        }
    }
    assert_eq!(field(&turns[0], "finish"), "cancelled", "{}", turns[0]);
    // The next turn runs to its budget.
    stdin.write_all(b"second turn\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    let status = ch.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{rest}");
    let second = rest
        .lines()
        .find(|l| l.contains("qhx: turn=2"))
        .unwrap_or_else(|| panic!("no second turn: {rest}"));
    assert_eq!(field(second, "finish"), "length", "{second}");
    assert_eq!(field(second, "generated"), "100", "{second}");
    assert!(!rest.contains("panicked"), "{rest}");
}

/// Run `-i` with `turns` on stdin to EOF; (stdout, stderr).
fn interactive_script(tag: &str, extra: &[&str], turns: &str) -> (String, String) {
    let mut ch = interactive(tag, extra, &[]);
    ch.stdin
        .take()
        .unwrap()
        .write_all(turns.as_bytes())
        .unwrap();
    let o = ch.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    (stdout(&o), stderr(&o))
}

#[test]
fn stop_strings_work_in_interactive_mode() {
    let (out, _) = interactive_script("reg-i-free", &["24", "-i", "--ignore-eos"], "hello\n");
    let reply = out.lines().next().unwrap_or_default().to_string();
    // A stop string from the middle of the reply, at its first occurrence.
    let chars: Vec<(usize, char)> = reply.char_indices().collect();
    let (at, stop) = (chars.len() / 3..chars.len().saturating_sub(2))
        .map(|i| {
            let a = chars[i].0;
            let b = chars.get(i + 2).map_or(reply.len(), |c| c.0);
            (a, reply[a..b].to_string())
        })
        .find(|(a, s)| reply.find(s.as_str()) == Some(*a) && !s.trim().is_empty())
        .unwrap_or_else(|| panic!("no usable stop string in {reply:?}"));
    let (out, err) = interactive_script(
        "reg-i-stop",
        &["24", "-i", "--ignore-eos", "--stop", &stop],
        "hello\n",
    );
    assert_eq!(out, format!("{}\n", &reply[..at]), "stop {stop:?}");
    let turn = err.lines().find(|l| l.contains("qhx: turn=1")).unwrap();
    assert_eq!(field(turn, "finish"), "stop", "{turn}");
}

#[test]
fn n_predict_is_an_alias_of_n_tokens() {
    let (d, m) = bundle("reg-n", &SynthSpec::default());
    let lib = emu();
    let o = command(bin())
        .arg(&m)
        .arg(&lib)
        .arg(&lib)
        .arg(&d)
        .args(["-n", "5", "-p", "alias", "--ignore-eos", "--json"])
        .output_within();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(ids(&json(&o), "output_ids").len(), 5);
    let o = generate(&m, &d, "4", "alias", &["-n", "5"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("disagree"), "{}", stderr(&o));
}

#[test]
fn quiet_prints_no_banner_and_no_stats() {
    let (d, m) = bundle("reg-quiet", &SynthSpec::default());
    let o = generate(&m, &d, "4", "hi", &["--quiet"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), "", "stderr must stay empty");
    assert!(!o.stdout.is_empty());
}

#[test]
fn version_names_the_commit_and_the_qnn_api_range() {
    let o = command(bin()).arg("--version").output_within();
    assert!(o.status.success());
    let v = stdout(&o);
    assert!(v.starts_with("qhx_generate 0."), "{v}");
    assert!(
        v.contains("commit ") && v.contains("QNN core API 2.10"),
        "{v}"
    );
}

#[test]
fn the_seed_and_chain_used_are_reported() {
    let (d, m) = bundle("reg-seed", &SynthSpec::default());
    let o = generate(
        &m,
        &d,
        "4",
        "hi",
        &["--temp", "0.8", "--top-k", "20", "--json"],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    let seed = v["sampling"]["seed"].as_u64().expect("the drawn seed");
    let chain: Vec<&str> = v["sampling"]["chain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert_eq!(
        chain,
        ["temp(0.8)", "top-k(20)", &format!("dist(seed {seed})")]
    );
    // Replaying the reported seed gives the same ids.
    let again = generate(
        &m,
        &d,
        "4",
        "hi",
        &[
            "--temp",
            "0.8",
            "--top-k",
            "20",
            "--seed",
            &seed.to_string(),
            "--json",
        ],
        &[],
    );
    assert_eq!(ids(&json(&again), "output_ids"), ids(&v, "output_ids"));
    // -v prints the chain; sampling flags at temperature 0 draw a warning.
    let o = generate(&m, &d, "2", "hi", &["-v", "--top-p", "0.9"], &[]);
    let err = stderr(&o);
    assert!(
        err.contains("qhx: sampler: seed ") && err.contains("chain greedy"),
        "{err}"
    );
    assert!(
        err.contains("warning: --top-p has no effect at --temp 0"),
        "{err}"
    );
}

#[cfg(unix)]
#[test]
fn load_progress_shows_on_a_terminal_only() {
    let (d, m) = bundle("reg-progress", &SynthSpec::default());
    let lib = emu();
    let cmd = |extra: &str| {
        format!(
            "{} {} {} {} {} {} 2 hi {extra}",
            runner().join(" "),
            bin().display(),
            m.display(),
            lib.display(),
            lib.display(),
            d.display()
        )
    };
    // `script` runs the command on a pseudo-terminal (util-linux).
    let o = Command::new("script")
        .args(["-qec", &cmd(""), "/dev/null"])
        .output_within();
    let tty = stdout(&o);
    assert!(o.status.success(), "{tty}");
    assert!(tty.contains("\r\x1b[2Kqhx: loading context 1/3"), "{tty:?}");
    // The line is erased before the banner.
    let erased = tty.rfind("\r\x1b[2K").unwrap();
    assert!(tty[erased..].starts_with("\r\x1b[2Kqhx 0."), "{tty:?}");
    let quiet = Command::new("script")
        .args(["-qec", &cmd("--quiet"), "/dev/null"])
        .output_within();
    assert!(!stdout(&quiet).contains("loading"), "{}", stdout(&quiet));
    // Not on a pipe.
    let o = generate(&m, &d, "2", "hi", &[], &[]);
    assert!(!stderr(&o).contains("loading"), "{}", stderr(&o));
}

// --- Round 3 of the new-user issue: one test per item, each failing before its fix. ---

/// `--json` document of a run on `m` (greedy unless `extra` says otherwise).
fn json_run(m: &Path, d: &Path, n: &str, prompt: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    let o = generate(m, d, n, prompt, &args, &[]);
    assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
    json(&o)
}

#[test]
fn reasoning_modes_leave_a_model_that_never_thinks_alone() {
    // Item 1: text is reasoning only after a <think>; this model never writes one.
    let (d, m) = bundle("reg-r3-reason", &SynthSpec::default());
    let show = json_run(&m, &d, "12", "hello", &["--ignore-eos"]);
    let text = show["text"].as_str().unwrap().to_string();
    assert!(!text.is_empty() && !text.contains("<think>"), "{text:?}");
    for mode in ["hide", "strip"] {
        let v = json_run(
            &m,
            &d,
            "12",
            "hello",
            &["--ignore-eos", "--reasoning", mode],
        );
        assert_eq!(v["text"], show["text"], "--reasoning {mode}");
        let o = generate(
            &m,
            &d,
            "12",
            "hello",
            &["--ignore-eos", "--reasoning", mode],
            &[],
        );
        assert_eq!(
            stdout(&o).trim_end_matches('\n'),
            text,
            "--reasoning {mode} stdout"
        );
    }
    // A budget never closes a block that was never opened.
    let v = json_run(
        &m,
        &d,
        "12",
        "hello",
        &["--ignore-eos", "--reasoning-budget", "4"],
    );
    assert_eq!(v["output_ids"], show["output_ids"]);
    assert!(!v["text"].as_str().unwrap().contains("</think>"));
}

#[test]
fn a_template_that_opens_a_block_makes_the_reply_reasoning_until_it_closes() {
    // Item 1, the other side: the rendered template ends with <think>, so the reply starts
    // inside a block; the budget forces </think> after 3 tokens and hide prints only what
    // follows it.
    let (d, m) = bundle("reg-r3-opened", &SynthSpec::default());
    with_template(&d, &format!("{TEMPLATE}<think>\n"));
    let args = ["--chat", "--ignore-eos", "--reasoning-budget", "3"];
    let show = json_run(&m, &d, "16", "hi", &args);
    let text = show["text"].as_str().unwrap();
    let close = text
        .find("</think>")
        .unwrap_or_else(|| panic!("no forced </think> in {text:?}"));
    let answer = text[close + "</think>".len()..].trim_start();
    let hide = json_run(
        &m,
        &d,
        "16",
        "hi",
        &[&args[..], &["--reasoning", "hide"]].concat(),
    );
    assert_eq!(hide["output_ids"], show["output_ids"]);
    assert_eq!(hide["text"], answer);
}

#[test]
fn strip_in_interactive_mode_keeps_the_replies_of_a_model_that_never_thinks() {
    // Item 1: --reasoning strip in -i stored empty assistant turns.
    let tr = tmp("reg-r3-strip-tr").join("t.json");
    std::fs::create_dir_all(tr.parent().unwrap()).unwrap();
    let (out, _) = interactive_script(
        "reg-r3-strip",
        &[
            "8",
            "-i",
            "--ignore-eos",
            "--reasoning",
            "strip",
            "--transcript",
            tr.to_str().unwrap(),
        ],
        "one\ntwo\n",
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&tr).unwrap()).unwrap();
    let replies: Vec<&str> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(replies.len(), 2, "{v}");
    let printed: Vec<&str> = out.lines().collect();
    for (i, r) in replies.iter().enumerate() {
        assert!(!r.is_empty(), "reply {i} stored empty: {v}");
        assert_eq!(*r, printed[i], "reply {i}");
    }
}

#[test]
fn system_and_messages_turn_chat_mode_on() {
    // Item 3: -sys and --messages without --chat were ignored.
    let (d, m) = bundle("reg-r3-sys", &SynthSpec::default());
    with_template(&d, TEMPLATE);
    let plain = json_run(&m, &d, "2", "hi", &[]);
    let chat = json_run(&m, &d, "2", "hi", &["--chat", "--system", "Be brief."]);
    let sys = json_run(&m, &d, "2", "hi", &["--system", "Be brief."]);
    assert_ne!(plain["input_ids"], chat["input_ids"]);
    assert_eq!(sys["input_ids"], chat["input_ids"]);
    let f = d.join("messages.json");
    std::fs::write(
        &f,
        r#"[{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "ok"}]"#,
    )
    .unwrap();
    let f = f.to_str().unwrap();
    let with = json_run(&m, &d, "2", "hi", &["--chat", "--messages", f]);
    let without = json_run(&m, &d, "2", "hi", &["--messages", f]);
    assert_eq!(with["input_ids"], without["input_ids"]);
    assert_ne!(with["input_ids"], chat["input_ids"]);
}

#[test]
fn flags_of_another_mode_are_usage_errors_not_silence() {
    // Item 3: --pp/--tg without --bench, sampling with --bench, --transcript without -i,
    // --bench -r 0. Each is refused before anything loads.
    let (d, m) = bundle("reg-r3-modes", &SynthSpec::default());
    let lib = emu();
    let base = [
        m.as_os_str(),
        lib.as_os_str(),
        lib.as_os_str(),
        d.as_os_str(),
    ];
    for extra in [
        &["4", "hi", "--pp", "8"][..],
        &["4", "hi", "--tg", "8"],
        &["4", "hi", "--repetitions", "2"],
        &["4", "hi", "--transcript", "t.json"],
        &["--bench", "--temp", "0.8"],
        &["--bench", "--seed", "3"],
        &["--bench", "--stop", "x"],
        &["--bench", "-r", "0"],
        &["--bench", "4", "a prompt"],
    ] {
        let mut args: Vec<&std::ffi::OsStr> = base.to_vec();
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        let o = run(&args, &[]);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", stderr(&o));
        assert!(!loaded(&o), "{extra:?} loaded the bundle");
        assert_eq!(stderr(&o).lines().count(), 1, "{extra:?}: {}", stderr(&o));
    }
}

#[test]
fn a_non_utf8_line_in_interactive_mode_costs_only_that_line() {
    // Item 4: one bad line ended the session.
    let mut ch = interactive("reg-r3-utf8", &["4", "-i", "--ignore-eos"], &[]);
    ch.stdin
        .take()
        .unwrap()
        .write_all(b"first\n\xff\xfe bad\nsecond\n")
        .unwrap();
    let o = ch.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("not valid UTF-8"), "{err}");
    assert!(err.contains("qhx: turn=2"), "{err}");
    assert!(!err.contains("qhx: turn=3"), "{err}");
}

#[test]
fn errors_without_a_backend_arrive_before_it_starts() {
    // Item 5: a missing binary, a wrong graph name, a prompt longer than max_ctx and an
    // unwritable transcript are reported before the backend is created (the emulator's
    // trace records every backendCreate).
    let check = |tag: &str,
                 edit: &dyn Fn(&Path, &Path),
                 extra: &[&str],
                 prompt: &str,
                 code,
                 needle: &str| {
        let (d, m) = bundle(tag, &SynthSpec::default());
        edit(&d, &m);
        let trace = d.join("trace.json");
        let o = generate(
            &m,
            &d,
            "4",
            prompt,
            extra,
            &[("QNN_EMU_TRACE", trace.to_str().unwrap())],
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{tag}: {err}");
        assert!(err.contains(needle), "{tag}: {err}");
        let events = std::fs::read_to_string(&trace).unwrap_or_default();
        assert!(
            !events.contains("create backend"),
            "{tag}: the backend started: {events}"
        );
    };
    check(
        "reg-r3-nodecode",
        &|d, _| std::fs::remove_file(d.join("tiny_decode.bin")).unwrap(),
        &[],
        "hi",
        1,
        "tiny_decode.bin",
    );
    check(
        "reg-r3-graphname",
        &|_, m| {
            edit_json(m, |v| {
                v["artifacts"]["contexts"]["decode"]["graph"] = "no_such_graph".into()
            })
        },
        &[],
        "hi",
        1,
        "no_such_graph",
    );
    check(
        "reg-r3-long",
        &|_, _| {},
        &[],
        &"word ".repeat(200),
        1,
        "leaves no room",
    );
    check(
        "reg-r3-transcript",
        &|_, _| {},
        &["-i", "--transcript", "/proc/no/such/t.json"],
        "hi",
        2,
        "--transcript",
    );
}

#[test]
fn bad_ids_and_bad_prompt_files_are_usage_errors() {
    // Item 6: --tokens-in with an id outside the vocabulary and a non-UTF-8 -f file exited
    // 1 while the same bytes as a positional prompt exit 2.
    let (d, m) = bundle("reg-r3-codes", &SynthSpec::default());
    let ids = d.join("ids.txt");
    std::fs::write(&ids, "1 999999").unwrap();
    let o = generate(&m, &d, "4", "", &[], &[]);
    assert_eq!(o.status.code(), Some(2)); // (empty prompt: the positional path's code)
    let lib = emu();
    let mut c = command(bin());
    c.arg(&m)
        .arg(&lib)
        .arg(&lib)
        .arg(&d)
        .arg("4")
        .arg("--tokens-in")
        .arg(&ids);
    let o = c.output_within();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let f = d.join("p.txt");
    std::fs::write(&f, b"caf\xe9").unwrap();
    let mut c = command(bin());
    c.arg(&m)
        .arg(&lib)
        .arg(&lib)
        .arg(&d)
        .arg("4")
        .arg("-f")
        .arg(&f);
    let o = c.output_within();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn repeat_last_n_zero_is_off_and_minus_one_is_the_whole_context() {
    // Item 7: 0 penalised the whole sequence; -1 was refused.
    let (d, m) = bundle("reg-r3-rln", &SynthSpec::default());
    let plain = json_run(&m, &d, "24", "hello hello", &["--ignore-eos"]);
    let pen = |n: &str| {
        json_run(
            &m,
            &d,
            "24",
            "hello hello",
            &[
                "--ignore-eos",
                "--repeat-penalty",
                "4",
                "--repeat-last-n",
                n,
            ],
        )
    };
    let off = pen("0");
    assert_eq!(off["output_ids"], plain["output_ids"]);
    assert!(!off["sampling"]["chain"].to_string().contains("penalties"));
    let all = pen("-1");
    assert_eq!(all["output_ids"], pen("100000")["output_ids"]);
    assert_ne!(
        all["output_ids"], plain["output_ids"],
        "the penalty did nothing"
    );
    assert!(all["sampling"]["chain"]
        .to_string()
        .contains("penalties(4, all)"));
}

#[test]
fn misleading_messages_say_what_is_wrong() {
    // Item 8: an n_tokens past 64 bits, and the artifacts root left out.
    let (d, m) = bundle("reg-r3-msgs", &SynthSpec::default());
    let o = generate(&m, &d, "99999999999999999999999", "hi", &[], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("beyond any context length"),
        "{}",
        stderr(&o)
    );
    let lib = emu();
    let o = run(
        &[
            m.as_os_str(),
            lib.as_os_str(),
            lib.as_os_str(),
            "8".as_ref(),
            "The capital".as_ref(),
        ],
        &[],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("artifacts root \"8\"") && !err.contains("invalid n_tokens"),
        "{err}"
    );
}

#[cfg(unix)]
#[test]
fn ctrl_c_while_loading_stops_before_the_prompt() {
    // Item 9: SIGINT during the load was honoured only after the first prefill chunk.
    let (d, m) = bundle("reg-r3-loadcancel", &SynthSpec::default());
    let trace = d.join("trace.json");
    let t = std::time::Instant::now();
    let child = generate_command(
        &m,
        &d,
        "4",
        "hi",
        &[],
        &[
            ("QNN_EMU_LOAD_DELAY_MS", "1500"),
            ("QNN_EMU_TRACE", trace.to_str().unwrap()),
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(130), "{err}");
    // Three contexts at 1.5 s each: stopping after the first one ends well before 4.5 s.
    assert!(
        t.elapsed() < std::time::Duration::from_millis(3500),
        "{:?}",
        t.elapsed()
    );
    assert!(err.contains("cancelled while loading"), "{err}");
    assert!(!err.contains("ttft_ms") && o.stdout.is_empty(), "{err}");
    let t = assert_all_freed(&trace, "load cancel");
    assert!(!t["events"].to_string().contains("execute"), "{t}");
}

#[test]
fn interactive_commands_are_not_sent_to_the_model() {
    // Item 10: /help and /quit went to the model as user turns.
    let (_, err) = interactive_script(
        "reg-r3-cmds",
        &["4", "-i", "--ignore-eos"],
        "/help\n/frobnicate\nhello\n/quit\nnever sent\n",
    );
    assert!(err.contains("/reset") && err.contains("/quit"), "{err}");
    assert!(err.contains("unknown command /frobnicate"), "{err}");
    assert_eq!(err.matches("qhx: turn=").count(), 1, "{err}");
}

#[test]
fn a_full_context_in_interactive_mode_drops_the_oldest_turns() {
    // Item 10: a full context stopped the conversation.
    let turn = "word ".repeat(16);
    let script = format!("{turn}\n{turn}\n{turn}\n{turn}\n");
    let (_, err) = interactive_script(
        "reg-r3-drop",
        &["40", "-i", "--ignore-eos", "--system", "S"],
        &script,
    );
    assert!(err.contains("dropped the oldest"), "{err}");
    assert_eq!(err.matches("qhx: turn=").count(), 4, "{err}");
    assert!(!err.contains("finish=ctx_full"), "{err}");
}

#[test]
fn a_bundle_directory_in_the_manifest_position_is_read_as_the_bundle() {
    // Item 12: `Is a directory`.
    let (d, m) = bundle("reg-r3-dir", &SynthSpec::default());
    let want = json_run(&m, &d, "6", "hi", &["--ignore-eos"]);
    let got = json_run(&d, &d, "6", "hi", &["--ignore-eos"]);
    assert_eq!(got["output_ids"], want["output_ids"]);
    // One directory per arch: the device's (the emulator reports v81) is taken, and the
    // artifacts resolve inside it.
    let per_arch = tmp("reg-r3-perarch");
    std::fs::create_dir_all(per_arch.join("v73")).unwrap();
    std::fs::copy(&m, per_arch.join("v73").join("tiny.json")).unwrap();
    std::fs::rename(&d, per_arch.join("v81")).unwrap();
    let got = json_run(&per_arch, &per_arch, "6", "hi", &["--ignore-eos"]);
    assert_eq!(got["output_ids"], want["output_ids"]);
}
