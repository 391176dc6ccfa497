//! Shared helpers for the integration tests: paths of the built binary and emulator, and
//! synthetic bundles written by `qnn_emu::writer`.
#![allow(dead_code)]

use qnn_emu::writer::{write_bundle, SynthSpec};
use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The binary under test: this build's, or `QHX_TEST_BIN` (e.g. an older build, to show
/// that a regression test fails there; the emulator is taken from beside it).
pub fn bin() -> PathBuf {
    match std::env::var_os("QHX_TEST_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(env!("CARGO_BIN_EXE_qhx_generate")),
    }
}

/// The runner prefix for child binaries when the tests run under an emulator (cross builds:
/// the kernel cannot exec an aarch64 program itself). `QHX_TEST_RUNNER` wins; otherwise the
/// runner cargo itself was given through the environment for this target, e.g.
/// `CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /"`. Words split on
/// whitespace, as cargo does.
pub fn runner() -> Vec<String> {
    let target_var = format!(
        "CARGO_TARGET_{}_UNKNOWN_{}_{}_RUNNER",
        std::env::consts::ARCH,
        std::env::consts::OS,
        if cfg!(target_env = "gnu") {
            "gnu"
        } else {
            "musl"
        }
    )
    .to_uppercase();
    std::env::var("QHX_TEST_RUNNER")
        .or_else(|_| std::env::var(target_var))
        .map(|v| v.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// `Command::new(program)`, through the test runner when one is set (see [`runner`]). The
/// child's pid is the program's own: qemu-user runs the guest in its own process, so signals
/// sent to it reach the program.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    match runner().split_first() {
        None => Command::new(program),
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(program);
            c
        }
    }
}

/// The emulator cdylib next to the binary (built by `cargo build --workspace`).
pub fn emu() -> PathBuf {
    let dir = bin().parent().expect("bin dir").to_path_buf();
    let name = if cfg!(windows) {
        "qnn_emu.dll"
    } else if cfg!(target_os = "macos") {
        "libqnn_emu.dylib"
    } else {
        "libqnn_emu.so"
    };
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "{} is missing: build the workspace first (scripts/test.sh does `cargo build --workspace`)",
        p.display()
    );
    p
}

/// A bundle built by scripts/build-parity.sh (`QHX_PARITY_BUNDLES`, else
/// target/bundles/parity): (its dir, its manifest).
pub fn parity_bundle(dir: &str, manifest: &str) -> (PathBuf, PathBuf) {
    let root = std::env::var_os("QHX_PARITY_BUNDLES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bundles/parity"));
    let d = root.join(dir);
    let m = d.join(manifest);
    assert!(
        m.is_file(),
        "{} is missing: run scripts/build-parity.sh (scripts/test.sh does)",
        m.display()
    );
    (d, m)
}

pub fn tmp(tag: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(tag);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

/// Write a synthetic bundle into a fresh directory; returns (dir, manifest path).
pub fn bundle(tag: &str, spec: &SynthSpec) -> (PathBuf, PathBuf) {
    let d = tmp(tag);
    let m = write_bundle(&d, spec).expect("write bundle");
    (d, m)
}

/// A qhx_generate command with the standard positional order plus extra args and env.
pub fn generate_command(
    manifest: &Path,
    root: &Path,
    n: &str,
    prompt: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Command {
    let lib = emu();
    let mut c = command(bin());
    c.arg(manifest)
        .arg(&lib)
        .arg(&lib)
        .arg(root)
        .arg(n)
        .arg(prompt)
        .args(extra);
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Run qhx_generate with the standard positional order plus extra args and env.
pub fn generate(
    manifest: &Path,
    root: &Path,
    n: &str,
    prompt: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Output {
    generate_command(manifest, root, n, prompt, extra, env).output_within()
}

/// How long one child process may run before the test fails: `QHX_TEST_CHILD_TIMEOUT`
/// seconds, else 600 (2400 through a runner such as qemu-user). A hung child then fails its
/// test with what it printed instead of holding the whole suite until CI's own limit.
pub fn child_limit() -> Duration {
    let default = if runner().is_empty() { 600 } else { 2400 };
    let secs = std::env::var("QHX_TEST_CHILD_TIMEOUT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Duration::from_secs(secs)
}

/// `Command::output` with a deadline ([`child_limit`]): past it the child is killed and the
/// test panics with the command and the output so far.
pub trait OutputWithin {
    fn output_within(&mut self) -> Output;
}

impl OutputWithin for Command {
    fn output_within(&mut self) -> Output {
        let limit = child_limit();
        let what = format!("{self:?}");
        let mut child = self
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        // Readers on their own threads: a child blocked on a full pipe never exits.
        let drain = |r: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut buf);
                }
                buf
            })
        };
        let out = drain(
            child
                .stdout
                .take()
                .map(|r| Box::new(r) as Box<dyn Read + Send>),
        );
        let err = drain(
            child
                .stderr
                .take()
                .map(|r| Box::new(r) as Box<dyn Read + Send>),
        );
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait for child") {
                break s;
            }
            if t0.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                let stderr = err.join().unwrap_or_default();
                panic!(
                    "child still running after {} s, killed: {what}\nstderr so far:\n{}",
                    limit.as_secs(),
                    String::from_utf8_lossy(&stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Output {
            status,
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        }
    }
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Parse the --json document on stdout.
pub fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr: {}",
            stdout(o),
            stderr(o)
        )
    })
}

pub fn ids(v: &serde_json::Value, key: &str) -> Vec<u64> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key}"))
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// Read an emulator trace (`QNN_EMU_TRACE`) and assert every handle was freed exactly
/// once: no handle kind left live, no free of an unknown handle. `what` labels failures.
pub fn assert_all_freed(trace: &Path, what: &str) -> serde_json::Value {
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(trace).unwrap()).unwrap();
    for (k, v) in t["live"].as_object().unwrap() {
        assert_eq!(v, 0, "{what}: {k} handles left live: {t}");
    }
    let ev = t["events"].to_string();
    assert!(!ev.contains("bad free"), "{what}: {ev}");
    t
}

/// Assert a trace freed child-first: contexts, then the device, the backend, the log.
pub fn assert_freed_child_first(t: &serde_json::Value, what: &str) {
    let ev: Vec<&str> = t["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    let pos = |s: &str| {
        ev.iter()
            .rposition(|e| *e == s)
            .unwrap_or_else(|| panic!("{what}: no {s} in {ev:?}"))
    };
    assert!(pos("free context") < pos("free device"), "{what}: {ev:?}");
    assert!(pos("free device") < pos("free backend"), "{what}: {ev:?}");
    assert!(pos("free backend") < pos("free log"), "{what}: {ev:?}");
}

/// The SmolLM2 emulator bundle (scripts/build-bundle.sh writes it; scripts/test.sh sets
/// QHX_SMOLLM2_BUNDLE). A missing bundle is a failure, not a skip.
pub fn smollm2_dir() -> PathBuf {
    let d = std::env::var_os("QHX_SMOLLM2_BUNDLE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bundles/smollm2")
        });
    assert!(
        d.join("smollm2.json").is_file(),
        "SmolLM2 bundle not found at {}: run scripts/build-bundle.sh (scripts/test.sh does)",
        d.display()
    );
    d
}

/// Write the synthetic bundle `spec` under `tag` and load it onto the shared runtime `rt`
/// (several models on one backend, as the C API does).
pub fn load_on(
    rt: &std::sync::Arc<qhx::qnn::Runtime>,
    tag: &str,
    spec: &SynthSpec,
) -> std::sync::Arc<qhx::load::Model> {
    let (dir, m) = bundle(tag, spec);
    let manifest = qhx::bundle::manifest::Manifest::load(&m, &dir).expect("manifest");
    let lib = emu();
    let opts = qhx::load::LoadOptions {
        runtime: Some(std::sync::Arc::clone(rt)),
        ..Default::default()
    };
    std::sync::Arc::new(qhx::load::manifest::load(manifest, &lib, &lib, &opts).expect("load"))
}
