//! stdout is ours alone, stderr may go away: behaviours found on the real QNN backend and
//! taught to the emulator (its backendCreate prints a banner on stdout through C stdio, like
//! the x86 HTP backend; `QNN_EMU_MEM=unsupported` refuses memRegister like the simulator).

mod common;

use common::*;
use qnn_emu::writer::SynthSpec;
use std::io::{BufRead, BufReader};

const BANNER: &str = "backend banner on stdout";

#[test]
fn json_stdout_is_one_document_although_the_backend_prints_on_stdout() {
    let (dir, m) = bundle("streams-json", &SynthSpec::default());
    let o = generate(&m, &dir, "6", "hello", &["--json"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The whole of stdout parses as one JSON value (serde rejects trailing text).
    let v = json(&o);
    assert_eq!(ids(&v, "output_ids").len(), 6);
    assert!(!stdout(&o).contains(BANNER));
    // Discarded by default (a bad input stays one line on stderr), shown at -v.
    assert!(!stderr(&o).contains(BANNER), "{}", stderr(&o));
    let v1 = generate(&m, &dir, "6", "hello", &["--json", "-v"], &[]);
    assert_eq!(ids(&json(&v1), "output_ids"), ids(&v, "output_ids"));
    assert!(stderr(&v1).contains(BANNER), "{}", stderr(&v1));
    // Text mode: stdout is exactly the generated text of the JSON run and the final newline.
    let t = generate(&m, &dir, "6", "hello", &[], &[]);
    assert!(t.status.success(), "{}", stderr(&t));
    assert_eq!(stdout(&t), format!("{}\n", v["text"].as_str().unwrap()));
}

#[test]
fn inspect_json_is_one_document_too() {
    let (dir, _) = bundle("streams-inspect", &SynthSpec::default());
    let bin = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.extension().is_some_and(|x| x == "bin") && p.to_string_lossy().contains("decode")
        })
        .expect("a decode binary");
    let inspect = env!("CARGO_BIN_EXE_qhx_inspect");
    let lib = emu();
    let o = command(inspect)
        .args([lib.as_os_str(), lib.as_os_str(), bin.as_os_str()])
        .arg("--json")
        .output_within();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(&o)));
    assert_eq!(v["binaries"].as_array().unwrap().len(), 1);
    assert!(!stdout(&o).contains(BANNER));
}

/// `qhx_generate … -v 2>&1 | head -1`: the reader leaves after one line; every later write
/// to stdout or stderr (the backend's log callback included) meets a closed pipe. The run
/// must end quietly with exit 0, not abort (134: a panic inside the C log callback) or
/// panic (101: `eprintln!` on a closed stderr).
#[test]
fn a_closed_stderr_pipe_is_not_a_crash() {
    let (dir, m) = bundle("streams-epipe", &SynthSpec::default());
    let (reader, writer) = std::io::pipe().unwrap();
    let mut c = generate_command(
        &m,
        &dir,
        "8",
        "hello",
        &["-vv"],
        &[("QNN_EMU_DELAY_MS", "30")],
    );
    c.stdout(writer.try_clone().unwrap()).stderr(writer);
    let mut child = c.spawn().unwrap();
    drop(c);
    let mut first = String::new();
    BufReader::new(reader).read_line(&mut first).unwrap();
    assert!(!first.is_empty());
    // The reader is gone now (dropped with the BufReader).
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(0), "first line: {first}");
}

#[test]
fn a_refused_mem_register_falls_back_to_client_buffers() {
    let (dir, m) = bundle("streams-mem", &SynthSpec::default());
    let lib = emu();
    let rpc = ["-v", "--json", "--rpcmem-lib", lib.to_str().unwrap()];
    let o = generate(
        &m,
        &dir,
        "8",
        "hello",
        &rpc,
        &[("QNN_EMU_MEM", "unsupported")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(
        err.matches("zero-copy I/O unavailable").count(),
        1,
        "warned once: {err}"
    );
    assert!(err.contains("I/O mode: client buffers"), "{err}");
    let want = generate(&m, &dir, "8", "hello", &["--json"], &[]);
    assert_eq!(
        ids(&json(&o), "output_ids"),
        ids(&json(&want), "output_ids")
    );
    // Without -v the fallback is silent.
    let q = generate(
        &m,
        &dir,
        "8",
        "hello",
        &rpc[1..],
        &[("QNN_EMU_MEM", "unsupported")],
    );
    assert!(q.status.success());
    assert!(!stderr(&q).contains("zero-copy"), "{}", stderr(&q));
}
