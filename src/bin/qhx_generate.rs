//! `qhx_generate <manifest> <backend_lib> <system_lib> <artifacts_root> [n_tokens] [prompt]`
//! (or `--tokens-in FILE` instead of a prompt)
//!
//! stdout carries the generated text only (or the one `--json` document); the banner,
//! logs and the stats line go to stderr. Exit codes: 0 ok, 1 failure, 2 usage, 3 parity
//! mismatch (`--expect-tokens`).

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use qhx::engine::{Engine, GenConfig, Next};
use qhx::manifest::Manifest;
use qhx::model::{LoadOptions, Model};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    name = "qhx_generate",
    version,
    allow_negative_numbers = true,
    about = "Generate text with a QNN context-binary LLM bundle on the Hexagon NPU",
    after_help = "Argument order is invariant: <manifest> <libQnnHtp.so> <libQnnSystem.so> <artifacts_root> [n_tokens] [prompt]"
)]
struct Args {
    /// Bundle manifest (JSON, schema_version 1).
    manifest: PathBuf,
    /// QNN backend library (libQnnHtp.so / QnnHtp.dll).
    backend_lib: PathBuf,
    /// QNN system library (libQnnSystem.so / QnnSystem.dll).
    system_lib: PathBuf,
    /// Directory the manifest's artifact names resolve against.
    artifacts_root: PathBuf,
    /// Number of tokens to generate.
    #[arg(default_value_t = 64, value_parser = parse_n_tokens)]
    n_tokens: usize,
    /// Prompt text (raw completion; no chat template).
    prompt: Option<std::ffi::OsString>,
    /// Prompt text (alternative to the positional prompt).
    #[arg(short = 'p', long = "prompt", conflicts_with = "prompt")]
    prompt_flag: Option<std::ffi::OsString>,
    /// Print one JSON document on stdout at the end instead of streaming text.
    #[arg(long)]
    json: bool,
    /// More diagnostics on stderr (-v: QNN warnings and info, -vv: verbose QNN log).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Keep going when logits or hidden states contain NaN/Inf.
    #[arg(long)]
    allow_nonfinite: bool,
    /// Parity mode: greedy-generate as many tokens as given and exit 3 at the first
    /// divergence. Takes a comma list of ids, or a JSON file (an array, or an object with
    /// `gold_ids` / `gold_ids_prefix` / `output_ids`).
    #[arg(long, value_name = "IDS|FILE")]
    expect_tokens: Option<String>,
    /// Feed these prompt token ids instead of a text prompt (bypasses the tokenizer; no BOS
    /// is added). The file holds ids separated by whitespace or commas, or a JSON array.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["prompt", "prompt_flag"])]
    tokens_in: Option<PathBuf>,
}

/// Read `--tokens-in`: ids separated by whitespace/commas, or a JSON array of ids.
fn read_tokens_in(p: &std::path::Path, vocab: usize) -> Result<Vec<u32>> {
    let text = std::fs::read_to_string(p)
        .with_context(|| format!("--tokens-in {}: cannot read", p.display()))?;
    let t = text.trim();
    let raw: Vec<String> = if t.starts_with('[') {
        let v: Vec<serde_json::Value> = serde_json::from_str(t)
            .with_context(|| format!("--tokens-in {}: not a JSON array", p.display()))?;
        v.iter().map(|x| x.to_string()).collect()
    } else {
        t.split(|c: char| c.is_whitespace() || c == ',')
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    };
    if raw.is_empty() {
        bail!("--tokens-in {}: no token ids in the file", p.display());
    }
    raw.iter()
        .enumerate()
        .map(|(i, w)| {
            let id: u64 = w.parse().map_err(|_| {
                anyhow::anyhow!(
                    "--tokens-in {}: entry {i} ({w:?}) is not a token id",
                    p.display()
                )
            })?;
            if id >= vocab as u64 {
                bail!(
                    "--tokens-in {}: token id {id} at index {i} is outside the vocabulary (params.vocab {vocab})",
                    p.display()
                );
            }
            Ok(id as u32)
        })
        .collect()
}

/// Parse `--expect-tokens`: a file path or a comma-separated id list.
fn parse_expected(spec: &str) -> Result<Vec<u32>> {
    let p = std::path::Path::new(spec);
    if p.is_file() {
        let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        let v: serde_json::Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is not JSON", p.display()))?;
        let arr = match &v {
            serde_json::Value::Array(_) => &v,
            obj => ["gold_ids", "gold_ids_prefix", "output_ids"]
                .iter()
                .find_map(|k| obj.get(*k))
                .with_context(|| {
                    format!(
                        "{}: no gold_ids, gold_ids_prefix or output_ids array",
                        p.display()
                    )
                })?,
        };
        let ids = arr
            .as_array()
            .with_context(|| format!("{}: expected ids must be an array", p.display()))?
            .iter()
            .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
            .collect::<Option<Vec<u32>>>()
            .with_context(|| format!("{}: ids must be non-negative integers", p.display()))?;
        if ids.is_empty() {
            bail!("{}: no expected ids", p.display());
        }
        return Ok(ids);
    }
    let ids = spec
        .split(',')
        .map(|t| t.trim().parse::<u32>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| {
            anyhow::anyhow!("--expect-tokens {spec:?} is neither a file nor a comma list of ids")
        })?;
    if ids.is_empty() {
        bail!("--expect-tokens: no ids");
    }
    Ok(ids)
}

fn parse_n_tokens(s: &str) -> std::result::Result<usize, String> {
    let n: i64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number of tokens"))?;
    if n <= 0 {
        return Err(format!("must be at least 1 (got {n})"));
    }
    if n > 1_000_000 {
        return Err(format!("{n} is beyond any context length"));
    }
    Ok(n as usize)
}

/// Exit code after SIGINT/SIGTERM (128 + SIGINT, the shell convention).
const EXIT_CANCELLED: u8 = 130;

/// SIGINT/SIGTERM (Ctrl-C / Ctrl-Break on Windows): the first one asks the engine to stop
/// after the current graph call; a second one exits at once.
fn install_signal_handler() {
    let r = ctrlc::set_handler(|| {
        if qhx::cancel::is_requested() {
            std::process::exit(EXIT_CANCELLED as i32);
        }
        qhx::cancel::request();
    });
    if let Err(e) = r {
        eprintln!("qhx: warning: no SIGINT/SIGTERM handler ({e}); Ctrl-C will not stop cleanly");
    }
}

fn main() -> ExitCode {
    install_signal_handler();
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) if !e.use_stderr() => {
            // --help / --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line: clap's first line without its own prefix, then where to look.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("qhx_generate: usage error: {first} (see qhx_generate --help)");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("qhx_generate: error: {msg}");
            ExitCode::from(1)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn run(args: Args) -> Result<ExitCode> {
    let prompt = match (args.prompt.clone(), args.prompt_flag.clone()) {
        (Some(p), _) | (None, Some(p)) => match p.into_string() {
            Ok(p) => p,
            Err(raw) => {
                let lossy = raw.to_string_lossy();
                let at = lossy.find('\u{FFFD}').unwrap_or(0);
                eprintln!(
                    "qhx_generate: usage error: the prompt is not valid UTF-8 (first bad byte near offset {at}); pass text, or ids with --tokens-in"
                );
                return Ok(ExitCode::from(2));
            }
        },
        (None, None) if args.tokens_in.is_some() => String::new(),
        (None, None) => {
            eprintln!(
                "qhx_generate: error: no prompt given (positional after n_tokens, or -p TEXT)"
            );
            return Ok(ExitCode::from(2));
        }
    };
    if !args.artifacts_root.is_dir() {
        bail!(
            "artifacts root {} is not a directory",
            args.artifacts_root.display()
        );
    }
    let manifest = Manifest::load(&args.manifest, &args.artifacts_root)?;
    let given_ids = args
        .tokens_in
        .as_deref()
        .map(|p| read_tokens_in(p, manifest.params.vocab))
        .transpose()?;
    let log_level = match args.verbose {
        0 => 0,
        1 => qnn_sys::log_level::INFO,
        _ => qnn_sys::log_level::VERBOSE,
    };
    let model = Model::load(
        manifest,
        &args.backend_lib,
        &args.system_lib,
        &LoadOptions { log_level },
    )
    .context("loading the bundle")?;
    let m = &model.manifest;
    let io_dtype = qnn_sys::dtype::name(model.decode.0.desc.inputs[model.decode.1.x].dtype);
    eprintln!(
        "qhx {} | {} ({:?}{}) | {} core API {} | prefill {} | ctx {} | I/O {}",
        env!("CARGO_PKG_VERSION"),
        if m.name.is_empty() { "model" } else { &m.name },
        m.arch,
        m.dsp_arch
            .as_deref()
            .map(|a| format!(", {a}"))
            .unwrap_or_default(),
        model.rt.backend().path.display(),
        model.rt.backend().core_api,
        model
            .prefill
            .as_ref()
            .map_or("none (decode-over-prompt)".to_string(), |(_, io)| format!(
                "P={}",
                io.rows
            )),
        model.max_ctx,
        io_dtype,
    );
    let facts = qhx::envcheck::EnvFacts::gather(
        &model.rt.backend().path,
        &model.rt.device_facts.build_id,
        &model.rt.backend().provider_name,
        &model.rt.system().path,
    );
    let targets = qhx::envcheck::Targets {
        bundle_dsp_arch: m.dsp_arch.clone(),
        bundle_soc_model: m.soc_model,
        device_dsp_arch: model.rt.device_facts.dsp_arch,
        device_soc_model: model.rt.device_facts.soc_model,
    };
    for w in qhx::envcheck::warnings(&facts, &targets) {
        eprintln!("qhx: warning: {w}");
    }
    if args.verbose > 0 {
        for (bin, ms) in &model.context_ms {
            eprintln!("qhx: context {} loaded in {ms:.1} ms", bin.display());
        }
    }

    let t_tok = Instant::now();
    let ids = match given_ids {
        Some(v) => v,
        None => model.tokenizer.encode(&prompt, m.params.bos_token_id)?,
    };
    let tokenize_ms = t_tok.elapsed().as_secs_f64() * 1000.0;
    if ids.len() >= model.max_ctx {
        bail!(
            "the prompt is {} tokens, which leaves no room in max_ctx {} to generate",
            ids.len(),
            model.max_ctx
        );
    }
    let budget = model.max_ctx - ids.len();
    let expected = args
        .expect_tokens
        .as_deref()
        .map(parse_expected)
        .transpose()?;
    let mut n_tokens = expected.as_ref().map_or(args.n_tokens, Vec::len);
    if n_tokens > budget {
        eprintln!(
            "qhx: warning: n_tokens {} clamped to {budget} (prompt {} + generated must fit max_ctx {})",
            n_tokens,
            ids.len(),
            model.max_ctx
        );
        n_tokens = budget;
    }
    let cfg = GenConfig {
        n_tokens,
        allow_nonfinite: args.allow_nonfinite,
    };

    let mut engine = Engine::new(&model);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut stream = model.tokenizer.stream();
    let json = args.json;
    let mut printed = String::new();
    let result = engine.generate(&ids, &cfg, tokenize_ms, |tok| {
        if !json {
            if let Some(piece) = stream.step(tok)? {
                out.write_all(piece.as_bytes())
                    .map_err(|e| qhx::Error::io("<stdout>", e))?;
                out.flush().map_err(|e| qhx::Error::io("<stdout>", e))?;
                printed.push_str(&piece);
            }
        }
        Ok(Next::Continue)
    });
    let output = match result {
        Ok(o) => o,
        Err(e) => {
            // Keep what was generated so far, ended by a newline; nothing if nothing was.
            if !json && !printed.is_empty() {
                let _ = writeln!(out);
                let _ = out.flush();
            }
            return Err(e.into());
        }
    };
    let stats = &output.stats;
    // When the context clamp, not the request, ended the run, say so.
    let finish = if output.finish == qhx::engine::FinishReason::Length && n_tokens < args.n_tokens {
        qhx::engine::FinishReason::CtxFull
    } else {
        output.finish
    };
    // Text without the end token, decoded in one shot (equals the streamed text).
    let text_ids: Vec<u32> = output
        .output_ids
        .iter()
        .copied()
        .filter(|t| !(finish == qhx::engine::FinishReason::Eos && m.eos.contains(t)))
        .collect();
    let text = model.tokenizer.decode(&text_ids)?;
    if json {
        let doc = serde_json::json!({
            "input_ids": output.input_ids,
            "output_ids": output.output_ids,
            "text": text,
            "finish_reason": finish.as_str(),
            "stats": stats,
        });
        writeln!(out, "{doc}")?;
    } else {
        // Text the stream held back (an incomplete UTF-8 tail at the end) goes out now, so
        // stdout always equals the one-shot decode.
        if let Some(rest) = text.strip_prefix(printed.as_str()) {
            out.write_all(rest.as_bytes())?;
        }
        writeln!(out)?;
    }
    out.flush()?;
    eprintln!("{} finish={}", stats.line(), finish.as_str());
    if finish == qhx::engine::FinishReason::Cancelled {
        // Model (contexts, device, backend, log) is dropped on return, child-first.
        return Ok(ExitCode::from(EXIT_CANCELLED));
    }
    if let Some(exp) = expected {
        let got = &output.output_ids;
        let piece = |id: Option<&u32>| match id {
            Some(&t) => format!("{t} {:?}", model.tokenizer.decode(&[t]).unwrap_or_default()),
            None => "nothing (generation ended)".to_string(),
        };
        match (0..exp.len()).find(|&i| got.get(i) != Some(&exp[i])) {
            None => eprintln!("parity: {}/{} tokens match", exp.len(), exp.len()),
            Some(i) => {
                eprintln!(
                    "parity: mismatch at step {i} of {}: expected {}, got {}",
                    exp.len(),
                    piece(exp.get(i)),
                    piece(got.get(i))
                );
                return Ok(ExitCode::from(3));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
