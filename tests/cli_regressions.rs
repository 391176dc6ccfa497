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
    c.output().unwrap()
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
        .output()
        .unwrap();
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
        .output()
        .unwrap();
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
    let o = command(bin()).arg("--version").output().unwrap();
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
        .output()
        .expect("util-linux `script` (a pseudo-terminal for the child) must be installed");
    let tty = stdout(&o);
    assert!(o.status.success(), "{tty}");
    assert!(tty.contains("\r\x1b[2Kqhx: loading context 1/3"), "{tty:?}");
    // The line is erased before the banner.
    let erased = tty.rfind("\r\x1b[2K").unwrap();
    assert!(tty[erased..].starts_with("\r\x1b[2Kqhx 0."), "{tty:?}");
    let quiet = Command::new("script")
        .args(["-qec", &cmd("--quiet"), "/dev/null"])
        .output()
        .unwrap();
    assert!(!stdout(&quiet).contains("loading"), "{}", stdout(&quiet));
    // Not on a pipe.
    let o = generate(&m, &d, "2", "hi", &[], &[]);
    assert!(!stderr(&o).contains("loading"), "{}", stderr(&o));
}
