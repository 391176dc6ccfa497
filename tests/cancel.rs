//! SIGINT/SIGTERM mid-decode: partial text on stdout, `finish=cancelled`, exit 130, and every
//! emulator handle freed.
#![cfg(unix)]

mod common;

use common::*;
use qnn_emu::writer::SynthSpec;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn run_and_signal(sig: &str, tag: &str) {
    let spec = SynthSpec {
        ctx: 256,
        ..SynthSpec::default()
    };
    let (dir, m) = bundle(tag, &spec);
    let trace = dir.join("trace.json");
    let lib = emu();
    let n = 200;
    let mut child = command(bin())
        .arg(&m)
        .arg(&lib)
        .arg(&lib)
        .arg(&dir)
        .arg(n.to_string())
        .arg("cancel me")
        .env("QNN_EMU_DELAY_MS", "20")
        .env("QNN_EMU_TRACE", &trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Wait until decoding has produced some text, then signal.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    let t = Instant::now();
    stdout.read_exact(&mut first).expect("first streamed byte");
    std::thread::sleep(Duration::from_millis(300));
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(st.success());
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(t.elapsed() < Duration::from_secs(30));
    assert_eq!(status.code(), Some(130), "{sig}: {err}");
    let mut text = first.to_vec();
    text.extend(rest);
    assert!(text.len() > 1 && text.ends_with(b"\n"), "{sig}: {text:?}");
    let stats = err
        .lines()
        .find(|l| l.contains("finish="))
        .unwrap_or_else(|| panic!("{sig}: no stats line: {err}"));
    assert!(stats.ends_with("finish=cancelled"), "{sig}: {stats}");
    let generated: usize = stats
        .split_whitespace()
        .find_map(|w| w.strip_prefix("generated="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(generated > 0 && generated < n, "{sig}: {stats}");
    assert!(!err.contains("panicked"), "{err}");
    let t = assert_all_freed(&trace, sig);
    assert_freed_child_first(&t, sig);
}

#[test]
fn sigint_mid_decode_stops_cleanly() {
    run_and_signal("INT", "cancel-int");
}

#[test]
fn sigterm_mid_decode_stops_cleanly() {
    run_and_signal("TERM", "cancel-term");
}

#[test]
fn sigint_during_the_prompt_stops_before_any_token() {
    use std::io::BufRead;
    // No prefill graph: the prompt runs through decode steps, 20 ms each.
    let spec = SynthSpec {
        prefill: None,
        ctx: 256,
        ..SynthSpec::default()
    };
    let (dir, m) = bundle("cancel-prompt", &spec);
    let trace = dir.join("trace.json");
    let lib = emu();
    let mut child = command(bin())
        .arg(&m)
        .arg(&lib)
        .arg(&lib)
        .arg(&dir)
        .arg("8")
        .arg("a long prompt ".repeat(12))
        .env("QNN_EMU_DELAY_MS", "20")
        .env("QNN_EMU_TRACE", &trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // The banner is printed after loading, just before the prompt runs.
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut banner = String::new();
    err.read_line(&mut banner).unwrap();
    assert!(banner.starts_with("qhx "), "{banner}");
    std::thread::sleep(Duration::from_millis(200));
    let st = Command::new("kill")
        .arg("-INT")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(st.success());
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{rest}");
    assert!(out.iter().all(|b| b.is_ascii_whitespace()), "{out:?}");
    assert!(
        rest.contains("generated=0") && rest.trim_end().ends_with("finish=cancelled"),
        "{rest}"
    );
    assert_all_freed(&trace, "cancel during prefill");
}
