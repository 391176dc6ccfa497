//! `qhx_inspect <backend_lib|-> <system_lib> <context.bin>...`
//!
//! Lists every graph of each context binary with its inputs and outputs (name, role guess,
//! dtype, quantization, dims, bytes), read through libQnnSystem. With `-` as the backend
//! only the system library is loaded, so this runs on a host with the SDK's x86_64
//! libQnnSystem to help write a manifest. `--json` prints one JSON document on stdout.
//! A file that cannot be read as a context binary is reported (one line on stderr, and in
//! the JSON document's `errors`) and the next one is inspected.
//! Exit codes: 0 ok, 1 failure (one line on stderr per failed file), 2 usage.

#![forbid(unsafe_code)]

use anyhow::{Context as _, Result};
use clap::Parser;
use qhx::qnn::{self, BinaryInfo, GraphDesc, TensorDesc};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "qhx_inspect",
    version,
    about = "List the graphs and I/O tensors of QNN context binaries (needs only libQnnSystem)",
    after_help = "Argument order: <libQnnHtp.so|-> <libQnnSystem.so> <context.bin>..."
)]
struct Args {
    /// QNN backend library, or `-` to load only the system library.
    backend_lib: String,
    /// QNN system library (libQnnSystem.so / QnnSystem.dll).
    system_lib: PathBuf,
    /// Context binaries to inspect (checked in `run`, to name a misplaced argument).
    bins: Vec<PathBuf>,
    /// Print one JSON document on stdout instead of text.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = match qhx::cli::parse_or_exit::<Args, _, _>("qhx_inspect", std::env::args_os()) {
        Ok(a) => a,
        Err(code) => return code,
    };
    // Before any QNN library is loaded: what a library prints must not reach our stdout.
    if let Err(e) = qhx::os::stdio::isolate_stdout(false) {
        qhx::elog!(
            "qhx_inspect: warning: cannot keep stdout private ({e}); library output may mix in"
        );
    }
    qhx::cli::finish("qhx_inspect", run(&args))
}

/// The argument order, for usage errors.
const ORDER: &str = "the arguments are <libQnnHtp.so|-> <libQnnSystem.so> <context.bin>...";

/// What a file's first bytes say it is, when that is plainly not a context binary.
fn sniff(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(b"\x7fELF") || head.starts_with(b"MZ") {
        Some("a shared library")
    } else if head.starts_with(b"GGUF") {
        Some("a GGUF model file")
    } else if head.trim_ascii_start().first() == Some(&b'{') {
        Some("a JSON file")
    } else {
        None
    }
}

/// Whether a path names a shared library rather than a context binary: by its name
/// (`.so`, `.so.N`, `.dll`, `.dylib`), else by its first bytes (ELF, PE). A path that
/// cannot be read is given the benefit of the doubt: loading it names the problem.
fn looks_like_library(p: &Path) -> bool {
    let name = p.file_name().unwrap_or_default().to_string_lossy();
    if name.ends_with(".so")
        || name.contains(".so.")
        || name.ends_with(".dll")
        || name.ends_with(".dylib")
    {
        return true;
    }
    if p.extension().is_some_and(|e| e == "bin") {
        return false;
    }
    let mut head = [0u8; 4];
    match std::fs::File::open(p).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head)) {
        Ok(()) => sniff(&head) == Some("a shared library"),
        Err(_) => true,
    }
}

/// Usage errors clap cannot see: no context binary, or a context binary where a library
/// belongs (`qhx_inspect LIB x.bin`, the `-` forgotten).
fn check_order(args: &Args) -> Result<()> {
    let backend = Path::new(&args.backend_lib);
    if args.backend_lib != "-" && !looks_like_library(backend) {
        return Err(qhx::cli::usage(format!(
            "{} is not a QNN backend library (a context binary?): {ORDER}",
            backend.display()
        )));
    }
    if !looks_like_library(&args.system_lib) {
        // `qhx_inspect LIB x.bin...`: LIB is the system library and `-` was forgotten.
        let fix = if args.backend_lib != "-" {
            format!(
                "; to load only the system library, put `-` first: qhx_inspect - {} {}{}",
                args.backend_lib,
                args.system_lib.display(),
                if args.bins.is_empty() { "" } else { " ..." }
            )
        } else {
            String::new()
        };
        return Err(qhx::cli::usage(format!(
            "{} is a context binary, not the system library: {ORDER}{fix}",
            args.system_lib.display()
        )));
    }
    if args.bins.is_empty() {
        return Err(qhx::cli::usage(format!("no context binary given: {ORDER}")));
    }
    Ok(())
}

/// Read one context binary's info, with a hint when its contents show what it is instead.
fn inspect_one(libs: &Libs, bin: &Path) -> Result<(usize, BinaryInfo)> {
    let bytes = std::fs::read(bin).with_context(|| format!("reading {}", bin.display()))?;
    if bytes.is_empty() {
        anyhow::bail!("{}: the file is empty (a truncated copy?)", bin.display());
    }
    let info = match libs {
        Libs::Full(rt) => qnn::read_binary_info(rt, &bytes, bin),
        Libs::System(sys) => qnn::read_binary_info_with(sys, &bytes, bin),
    };
    let info = match (info, sniff(&bytes[..bytes.len().min(64)])) {
        (Ok(info), _) => info,
        (Err(e), Some(what)) => {
            return Err(anyhow::Error::new(e)
                .context(format!("{} is {what}, not a context binary", bin.display())))
        }
        (Err(e), None) => return Err(e.into()),
    };
    Ok((bytes.len(), info))
}

/// What a tensor is probably for: its meaning under the manifest or Genie naming contract
/// (the names the loaders resolve), else a guess from common export names.
fn role_guess(t: &TensorDesc, input: bool, graph_has_past: bool) -> &'static str {
    if let Some(role) = qhx::plan::contract::contract_role(&t.name, input) {
        return role;
    }
    let n = t.name.to_lowercase();
    let ends = |s: &str| n == s || n.ends_with(&format!("_{s}")) || n.ends_with(&format!("/{s}"));
    if n.starts_with("past_k") || n.contains("past_key") {
        return "past K cache";
    }
    if n.starts_with("past_v") || n.contains("past_value") {
        return "past V cache";
    }
    if n.starts_with("new_k") || n.contains("present_key") || n.contains("key_out") {
        return "new K rows";
    }
    if n.starts_with("new_v") || n.contains("present_value") || n.contains("value_out") {
        return "new V rows";
    }
    if n.contains("cos") {
        return "RoPE cos";
    }
    if n.contains("sin") {
        return "RoPE sin";
    }
    if n.contains("mask") {
        return "attention mask";
    }
    if n.contains("logit") {
        return "logits";
    }
    if n.contains("input_ids") || n.contains("token") {
        return "token ids";
    }
    if n.contains("position") || n.contains("pos_id") {
        return "position ids";
    }
    if input && (ends("x") || n.contains("hidden") || n.contains("embed")) {
        return "hidden state in";
    }
    if !input && (ends("y") || n.contains("hidden")) {
        return if graph_has_past {
            "hidden state out"
        } else {
            "hidden state out / logits"
        };
    }
    "unknown"
}

/// What the graph is probably for.
fn graph_role(g: &GraphDesc) -> &'static str {
    let has_past = g.inputs.iter().any(|t| t.name.starts_with("past_"));
    let rows = g
        .inputs
        .iter()
        .find(|t| t.name == "x")
        .and_then(|t| t.dims.first().copied());
    let n = g.name.to_lowercase();
    if has_past {
        "decode"
    } else if g.inputs.len() == 1 && g.outputs.len() == 1 {
        "lm-head"
    } else if rows.is_some_and(|r| r > 1) || n.contains("prefill") {
        "prefill"
    } else {
        "unknown"
    }
}

fn quant_json(t: &TensorDesc) -> Value {
    match t.quant {
        Some(q) => json!({"scale": q.scale, "offset": q.offset}),
        None => Value::Null,
    }
}

fn tensor_json(t: &TensorDesc, input: bool, has_past: bool) -> Value {
    json!({
        "name": t.name,
        "id": t.id,
        "role": role_guess(t, input, has_past),
        "dtype": qnn_sys::dtype::name(t.dtype),
        "quant": quant_json(t),
        "dims": t.dims,
        "bytes": t.bytes(),
    })
}

fn info_json(path: &Path, size: usize, info: &BinaryInfo) -> Value {
    json!({
        "file": path.display().to_string(),
        "file_bytes": size,
        "build_id": info.build_id,
        "core_api": info.core_api.to_string(),
        "soc_model": info.soc_model,
        "graphs": info.graphs.iter().map(|g| {
            let past = g.inputs.iter().any(|t| t.name.starts_with("past_"));
            json!({
                "name": g.name,
                "role": graph_role(g),
                "inputs": g.inputs.iter().map(|t| tensor_json(t, true, past)).collect::<Vec<_>>(),
                "outputs": g.outputs.iter().map(|t| tensor_json(t, false, past)).collect::<Vec<_>>(),
                "weight_bytes": g.weights.map(|w| json!({"own": w.own, "shared": w.shared})),
            })
        }).collect::<Vec<_>>(),
    })
}

fn write_text(out: &mut impl Write, path: &Path, size: usize, info: &BinaryInfo) -> Result<()> {
    writeln!(
        out,
        "{} ({size} bytes): {} graph(s), build {:?}, core API {}{}",
        path.display(),
        info.graphs.len(),
        info.build_id,
        info.core_api,
        info.soc_model
            .map(|s| format!(", soc_model {s}"))
            .unwrap_or_default()
    )?;
    for g in &info.graphs {
        let past = g.inputs.iter().any(|t| t.name.starts_with("past_"));
        let weights = g.weights.map_or(String::new(), |w| {
            format!(
                "; weights {:.1} MB own, {:.1} MB shared",
                w.own as f64 / 1e6,
                w.shared as f64 / 1e6
            )
        });
        writeln!(
            out,
            "  graph {} (role guess: {}): {} inputs, {} outputs{weights}",
            g.name,
            graph_role(g),
            g.inputs.len(),
            g.outputs.len()
        )?;
        for (side, list) in [("in ", &g.inputs), ("out", &g.outputs)] {
            for t in list.iter() {
                let q = t
                    .quant
                    .map(|q| format!(" scale={} offset={}", q.scale, q.offset))
                    .unwrap_or_default();
                writeln!(
                    out,
                    "    {side} {:<16} {:<18} {:<16} {:?} {} bytes{q}",
                    t.name,
                    role_guess(t, side == "in ", past),
                    qnn_sys::dtype::name(t.dtype),
                    t.dims,
                    t.bytes()
                )?;
            }
        }
    }
    Ok(())
}

enum Libs {
    Full(Box<qnn::Runtime>),
    System(qnn::SystemLibrary),
}

fn run(args: &Args) -> Result<ExitCode> {
    check_order(args)?;
    let libs = if args.backend_lib == "-" {
        Libs::System(
            qnn::SystemLibrary::load(&args.system_lib)
                .with_context(|| format!("loading {}", args.system_lib.display()))?,
        )
    } else {
        Libs::Full(Box::new(
            qnn::Runtime::new(Path::new(&args.backend_lib), &args.system_lib, 0)
                .context("loading the QNN libraries")?,
        ))
    };
    let mut docs = Vec::new();
    let mut errors = Vec::new();
    let mut out = qhx::os::stdio::stdout();
    for bin in &args.bins {
        match inspect_one(&libs, bin) {
            Ok((size, info)) => {
                if args.json {
                    docs.push(info_json(bin, size, &info));
                } else {
                    write_text(&mut out, bin, size, &info)?;
                }
            }
            Err(e) => {
                // One line per file, as `cli::finish` prints a fatal error; then the next.
                let msg = format!("{e:#}").replace('\n', " ");
                qhx::elog!("qhx_inspect: error: {msg}");
                errors.push(json!({"file": bin.display().to_string(), "error": msg}));
            }
        }
    }
    if args.json {
        let backend = match &libs {
            Libs::Full(rt) => json!({
                "path": rt.backend().path.display().to_string(),
                "core_api": rt.backend().core_api.to_string(),
                "build_id": rt.device_facts.build_id,
                "soc_model": rt.device_facts.soc_model,
                "dsp_arch": rt.device_facts.dsp_arch,
            }),
            Libs::System(_) => Value::Null,
        };
        let doc = json!({"backend": backend, "binaries": docs, "errors": errors});
        writeln!(out, "{doc}")?;
    }
    out.flush()?;
    Ok(if errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
