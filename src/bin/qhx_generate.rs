//! `qhx_generate <manifest> <backend_lib> <system_lib> <artifacts_root> [n_tokens] [prompt]`
//! (or `--tokens-in FILE` instead of a prompt)
//!
//! stdout carries the generated text only (or the one `--json` document); the banner,
//! logs and the stats line go to stderr. Exit codes: 0 ok, 1 failure, 2 usage, 3 parity
//! mismatch (`--expect-tokens`).

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use qhx::engine::{Engine, FinishReason, GenConfig, Next};
use qhx::manifest::Manifest;
use qhx::model::{LoadOptions, Model};
use qhx::qnn::PerfMode;
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
    /// Directory the manifest's artifact names resolve against. (The public clone's order
    /// MANIFEST HTP SYSTEM PROMPT [N] is understood too when this is not a directory.)
    artifacts_root: std::ffi::OsString,
    /// Number of tokens to generate [default: 64].
    n_tokens: Option<String>,
    /// Prompt text (raw completion; no chat template).
    prompt: Option<std::ffi::OsString>,
    /// Prompt text (alternative to the positional prompt).
    #[arg(short = 'p', long = "prompt")]
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
    /// Stop when the output contains STRING (repeatable); the stop string is not printed.
    #[arg(short = 'r', long = "stop", value_name = "STRING")]
    stop: Vec<String>,
    #[command(flatten)]
    sampling: qhx::cli::SamplingArgs,
    /// Teacher forcing for precision checks: feed these ids (same forms as --expect-tokens)
    /// one per step instead of the sampled ones; output_ids are the model's own top-1 picks
    /// at each step.
    #[arg(long, value_name = "IDS|FILE", conflicts_with = "expect_tokens")]
    teacher_force: Option<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Parity mode: greedy-generate as many tokens as given and exit 3 at the first
    /// divergence. Takes a comma list of ids, or a JSON file (an array, or an object with
    /// `gold_ids` / `gold_ids_prefix` / `output_ids`).
    #[arg(long, value_name = "IDS|FILE")]
    expect_tokens: Option<String>,
    /// HTP performance vote held for the run: burst, high, balanced, power_saver, default
    /// (no vote).
    #[arg(long, default_value = "burst", value_parser = parse_perf)]
    perf: PerfMode,
    /// rpcmem library for zero-copy I/O (default libcdsprpc.so; env QHX_RPCMEM_LIB).
    /// Client buffers are used when it cannot be loaded; "none" disables it.
    #[arg(long, value_name = "LIB")]
    rpcmem_lib: Option<PathBuf>,
    /// Benchmark mode: a warm-up, then -r repetitions of prompt processing (--pp tokens)
    /// and token generation (--tg tokens); a llama-bench-like table on stdout (or one JSON
    /// document with --json).
    #[arg(long)]
    bench: bool,
    /// Benchmark repetitions (with --bench, `-r N` means this, as in llama-bench; otherwise
    /// `-r` is --stop, as in llama-cli).
    #[arg(long = "repetitions", default_value_t = 5)]
    repetitions: usize,
    /// Benchmark prompt length.
    #[arg(long, default_value_t = 128)]
    pp: usize,
    /// Benchmark generated tokens.
    #[arg(long, default_value_t = 128)]
    tg: usize,
    /// Prompt from a file (`-` = stdin), instead of the positional prompt / -p.
    #[arg(short = 'f', long = "file", value_name = "FILE", conflicts_with_all = ["prompt", "prompt_flag"])]
    file: Option<PathBuf>,
    /// Print the prompt's ids and pieces on stderr before generating.
    #[arg(long)]
    verbose_prompt: bool,
    /// Render the prompt as a user turn with the bundle's chat template.
    #[arg(long)]
    chat: bool,
    /// System message for --chat / -i (also accepted as `-sys TEXT`).
    #[arg(long = "system", value_name = "TEXT")]
    system: Option<String>,
    /// --chat: the conversation so far, a JSON array of {"role", "content"}; the prompt,
    /// if any, is appended as a user turn.
    #[arg(long, value_name = "FILE")]
    messages: Option<PathBuf>,
    /// Reasoning blocks (`<think> … </think>`): show, hide (print and save only what follows
    /// `</think>`) or strip (print everything, save only the answer).
    #[arg(long, default_value = "show", value_name = "show|hide|strip")]
    reasoning: qhx::reasoning::Mode,
    /// Force `</think>` after N generated tokens while the reasoning block is open.
    #[arg(long, value_name = "N", value_parser = parse_n_tokens)]
    reasoning_budget: Option<usize>,
    /// Interactive chat: read user turns from stdin line by line (/reset, /stats, EOF
    /// exits); n_tokens is the per-turn maximum.
    #[arg(short = 'i', long = "interactive", conflicts_with_all = ["json", "expect_tokens", "messages"])]
    interactive: bool,
    /// -i: rewrite this JSON file ({"messages", "ids"}) after every turn.
    #[arg(long, value_name = "FILE")]
    transcript: Option<PathBuf>,
    /// Feed these prompt token ids instead of a text prompt (bypasses the tokenizer; no BOS
    /// is added). The file holds ids separated by whitespace or commas, or a JSON array.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["prompt", "prompt_flag"])]
    tokens_in: Option<PathBuf>,
}

fn parse_perf(s: &str) -> std::result::Result<PerfMode, String> {
    PerfMode::parse(s).ok_or_else(|| {
        format!("--perf {s:?}: expected burst, high, balanced, power_saver or default")
    })
}

/// `-sys TEXT` is llama.cpp's spelling of the system-prompt flag; clap has no multi-letter
/// short flags, so it is mapped to `--system`.
fn map_legacy_args(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    args.map(|a| if a == "-sys" { "--system".into() } else { a })
        .collect()
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
    // `-r` is llama-cli's stop string, but llama-bench's repetition count: with --bench it
    // means the latter.
    let mut argv = map_legacy_args(std::env::args_os());
    if argv.iter().any(|a| a == "--bench") {
        for a in argv.iter_mut().skip(1) {
            if a == "-r" {
                *a = "--repetitions".into();
            }
        }
    }
    let args = match qhx::cli::parse_or_exit::<Args, _, _>("qhx_generate", argv) {
        Ok(a) => a,
        Err(code) => return code,
    };
    qhx::cli::finish("qhx_generate", run(args))
}

/// The positional arguments after the libraries, resolved.
struct Positional {
    root: PathBuf,
    n_tokens: usize,
    prompt: Option<std::ffi::OsString>,
}

/// The prompt as text; non-UTF-8 bytes are a usage error that points at them.
fn utf8_prompt(p: std::ffi::OsString) -> std::result::Result<String, ExitCode> {
    p.into_string().map_err(|raw| {
        let lossy = raw.to_string_lossy();
        let at = lossy.find('\u{FFFD}').unwrap_or(0);
        usage(format!(
            "the prompt is not valid UTF-8 (first bad byte near offset {at}); pass text, or ids with --tokens-in"
        ))
    })
}

fn usage(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("qhx_generate: usage error: {msg} (see qhx_generate --help)");
    ExitCode::from(2)
}

/// `ROOT [N] [PROMPT]`, or the public clone's `PROMPT [N]` when the fourth argument is not a
/// directory (and there is no sixth); the latter resolves artifacts beside the manifest.
fn positional(args: &Args) -> std::result::Result<Positional, ExitCode> {
    let fourth = PathBuf::from(&args.artifacts_root);
    let n = |s: Option<&String>| -> std::result::Result<usize, ExitCode> {
        match s {
            None => Ok(64),
            Some(s) => parse_n_tokens(s).map_err(|e| usage(format!("invalid n_tokens {s:?}: {e}"))),
        }
    };
    if fourth.is_dir() || args.prompt.is_some() || fourth.exists() {
        return Ok(Positional {
            root: fourth,
            n_tokens: n(args.n_tokens.as_ref())?,
            prompt: args.prompt.clone(),
        });
    }
    let root = args
        .manifest
        .parent()
        .map(|p| {
            if p.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                p.to_path_buf()
            }
        })
        .unwrap_or_else(|| PathBuf::from("."));
    eprintln!(
        "qhx: note: {:?} is not a directory: reading the arguments as MANIFEST HTP SYSTEM PROMPT [N] \
         (artifacts resolve against {})",
        args.artifacts_root,
        root.display()
    );
    Ok(Positional {
        root,
        n_tokens: n(args.n_tokens.as_ref())?,
        prompt: Some(args.artifacts_root.clone()),
    })
}

fn run(args: Args) -> Result<ExitCode> {
    let pos = match positional(&args) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let prompt = match (pos.prompt.clone(), args.prompt_flag.clone(), &args.file) {
        (Some(_), Some(_), _) => {
            return Ok(usage(
                "give the prompt either positionally or with -p, not both",
            ))
        }
        (Some(p), None, _) | (None, Some(p), _) => match utf8_prompt(p) {
            Ok(p) => p,
            Err(code) => return Ok(code),
        },
        (None, None, Some(f)) => read_prompt_file(f)?,
        (None, None, None)
            if args.tokens_in.is_some() || args.interactive || args.messages.is_some() =>
        {
            String::new()
        }
        (None, None, None) => {
            return Ok(usage(
                "no prompt given (positional after n_tokens, -p TEXT or -f FILE)",
            ))
        }
    };
    let sampler = match args.sampling.config() {
        Ok(c) => c,
        Err(e) => return Ok(usage(e)),
    };
    if !pos.root.is_dir() {
        bail!("artifacts root {} is not a directory", pos.root.display());
    }
    let requested = pos.n_tokens;
    let manifest = Manifest::load(&args.manifest, &pos.root)?;
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
        &LoadOptions {
            log_level,
            perf: args.perf,
            rpcmem_lib: match args
                .rpcmem_lib
                .clone()
                .or_else(|| std::env::var_os("QHX_RPCMEM_LIB").map(PathBuf::from))
                .as_ref()
            {
                Some(p) if p.as_os_str() == "none" => None,
                Some(p) => Some(p.clone()),
                None => LoadOptions::default().rpcmem_lib,
            },
        },
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
    let mut engine = Engine::new(&model).context("binding graph I/O")?;
    let io_mode = if engine.zero_copy() {
        format!(
            "rpcmem zero-copy ({})",
            model
                .rt
                .rpcmem_path()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        )
    } else {
        format!(
            "client buffers (rpcmem {})",
            model.rpcmem_note.as_deref().unwrap_or("not used")
        )
    };
    if args.verbose > 0 {
        for k in &m.unknown_keys {
            eprintln!("qhx: note: manifest key {k} is not used by this version (ignored)");
        }
        for (bin, ms) in &model.context_ms {
            eprintln!("qhx: context {} loaded in {ms:.1} ms", bin.display());
        }
        eprintln!("qhx: I/O mode: {io_mode}");
        eprintln!("qhx: perf mode: {}", model.rt.perf_mode.as_str());
    }
    if args.bench {
        let zc = engine.zero_copy();
        return bench(&args, &model, &mut engine, &prompt, zc);
    }

    let chat_mode = args.chat || args.interactive || args.messages.is_some();
    let template = if chat_mode {
        Some(qhx::chat::ChatTemplate::for_bundle(m, &model.tokenizer)?)
    } else {
        None
    };
    let budget = args
        .reasoning_budget
        .map(|max| -> Result<qhx::reasoning::Budget> {
            Ok(qhx::reasoning::Budget {
                max,
                close: model.tokenizer.encode_raw(qhx::reasoning::THINK_CLOSE)?,
            })
        })
        .transpose()?;
    if args.interactive {
        let tmpl = template.as_ref().expect("chat mode loads the template");
        let opts = qhx::interactive::Options {
            system: args.system.clone(),
            cfg: GenConfig {
                n_tokens: requested,
                allow_nonfinite: args.allow_nonfinite,
                ignore_eos: args.ignore_eos,
                sampler: sampler.clone(),
                teacher: None,
            },
            reasoning: args.reasoning,
            budget,
            eos: m.eos.clone(),
            verbose_prompt: args.verbose_prompt,
            transcript: args.transcript.clone(),
        };
        // A prompt given on the command line is the first turn.
        let first = if prompt.is_empty() {
            String::new()
        } else {
            format!("{}\n", prompt.replace(['\r', '\n'], " "))
        };
        let stdin = std::io::stdin();
        qhx::interactive::run(
            &mut engine,
            &model.tokenizer,
            tmpl,
            &opts,
            std::io::Read::chain(std::io::Cursor::new(first), stdin.lock()),
            std::io::stdout().lock(),
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let t_tok = Instant::now();
    let ids = match (given_ids, &template) {
        (Some(v), _) => v,
        (None, Some(t)) => {
            let mut msgs = match &args.messages {
                Some(f) => qhx::chat::load_messages(f)?,
                None => Vec::new(),
            };
            if let Some(s) = &args.system {
                if msgs.first().is_none_or(|x| x.role != "system") {
                    msgs.insert(0, qhx::chat::Message::new("system", s));
                }
            }
            if !prompt.is_empty() || msgs.is_empty() {
                msgs.push(qhx::chat::Message::new("user", &prompt));
            }
            t.encode(&model.tokenizer, &msgs, true)?
        }
        (None, None) => model.tokenizer.encode(&prompt, m.params.bos_token_id)?,
    };
    let tokenize_ms = t_tok.elapsed().as_secs_f64() * 1000.0;
    if args.verbose_prompt {
        print_prompt(&model.tokenizer, &ids);
    }
    if ids.len() >= model.max_ctx {
        bail!(
            "the prompt is {} tokens, which leaves no room in max_ctx {} to generate",
            ids.len(),
            model.max_ctx
        );
    }
    let room = model.max_ctx - ids.len();
    let expected = args
        .expect_tokens
        .as_deref()
        .map(parse_expected)
        .transpose()?;
    let teacher = args
        .teacher_force
        .as_deref()
        .map(parse_expected)
        .transpose()?;
    let mut n_tokens = expected
        .as_ref()
        .or(teacher.as_ref())
        .map_or(requested, Vec::len);
    if n_tokens > room {
        eprintln!(
            "qhx: warning: n_tokens {} clamped to {room} (prompt {} + generated must fit max_ctx {})",
            n_tokens,
            ids.len(),
            model.max_ctx
        );
        n_tokens = room;
    }
    let cfg = GenConfig {
        n_tokens,
        allow_nonfinite: args.allow_nonfinite,
        ignore_eos: args.ignore_eos,
        sampler: if expected.is_some() || teacher.is_some() {
            Default::default()
        } else {
            sampler
        },
        teacher: teacher.clone(),
    };

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut stream = model.tokenizer.stream();
    let json = args.json;
    // Text released so far: streamed pieces minus anything a stop string may still claim.
    let mut printed = String::new();
    let mut stops = qhx::stop::StopMatcher::new(&args.stop);
    let mut filter = qhx::reasoning::Filter::new(args.reasoning);
    let result = qhx::reasoning::generate(
        &mut engine,
        &ids,
        &cfg,
        tokenize_ms,
        budget.as_ref(),
        |tok| {
            if json && stops.is_empty() {
                return Ok(Next::Continue);
            }
            let Some(piece) = stream.step(tok)? else {
                return Ok(Next::Continue);
            };
            let pushed = stops.push(&piece);
            if !json {
                let shown = filter.push(&pushed.emit);
                if !shown.is_empty() {
                    out.write_all(shown.as_bytes())
                        .map_err(|e| qhx::Error::io("<stdout>", e))?;
                    out.flush().map_err(|e| qhx::Error::io("<stdout>", e))?;
                }
            }
            printed.push_str(&pushed.emit);
            Ok(if pushed.stopped {
                Next::Stop(FinishReason::Stop)
            } else {
                Next::Continue
            })
        },
    );
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
    let finish = output.finish_for(n_tokens, requested);
    // Text without the end token, decoded in one shot (equals the streamed text).
    let text_ids = output.text_ids(finish, &model.eos);
    let full_text = if finish == FinishReason::Stop {
        printed.clone()
    } else {
        model.tokenizer.decode(&text_ids)?
    };
    let text = qhx::reasoning::saved(args.reasoning, &full_text).to_string();
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
        if let Some(rest) = full_text.strip_prefix(printed.as_str()) {
            let rest = filter.push(rest);
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

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1) as f64
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// `--bench`: warm-up, then `-r` repetitions of pp (prompt processing) and tg (generation).
fn bench(
    args: &Args,
    model: &Model,
    engine: &mut Engine<'_>,
    prompt: &str,
    zero_copy: bool,
) -> Result<ExitCode> {
    let m = &model.manifest;
    let mut base = model.tokenizer.encode(prompt, m.params.bos_token_id)?;
    if base.is_empty() {
        base.push(0);
    }
    let room = model.max_ctx.saturating_sub(1);
    let pp = args.pp.clamp(1, room);
    let tg = args.tg.clamp(1, room);
    if pp != args.pp || tg != args.tg {
        eprintln!(
            "qhx: warning: bench sizes clamped to pp {pp} / tg {tg} (max_ctx {})",
            model.max_ctx
        );
    }
    let ids: Vec<u32> = base.iter().copied().cycle().take(pp).collect();
    let reps = args.repetitions.max(1);
    let run = |engine: &mut Engine<'_>, ids: &[u32], n: usize| -> Result<qhx::stats::Stats> {
        engine.reset();
        let cfg = GenConfig {
            ignore_eos: true,
            allow_nonfinite: args.allow_nonfinite,
            ..GenConfig::greedy(n)
        };
        Ok(engine
            .generate(ids, &cfg, 0.0, |_| Ok(Next::Continue))
            .context("benchmark run")?
            .stats)
    };
    // Warm-up: one of each.
    run(engine, &ids, 1)?;
    run(engine, &ids[..1], tg + 1)?;
    let mut pp_tps = Vec::new();
    let mut tg_tps = Vec::new();
    for _ in 0..reps {
        let s = run(engine, &ids, 1)?;
        pp_tps.push(pp as f64 / (s.prefill_ms / 1000.0));
        let s = run(engine, &ids[..1], tg + 1)?;
        tg_tps.push(tg as f64 / (s.decode_ms / 1000.0));
    }
    let rows = [
        (format!("pp{pp}"), pp, pp_tps),
        (format!("tg{tg}"), tg, tg_tps),
    ];
    let io_dtype = qnn_sys::dtype::name(model.decode.0.desc.inputs[model.decode.1.x].dtype);
    let api = model.rt.backend().core_api;
    let facts = &model.rt.device_facts;
    let name = if m.name.is_empty() { "model" } else { &m.name };
    let io_mode = if zero_copy { "rpcmem" } else { "client" };
    let mut out = std::io::stdout().lock();
    if args.json {
        let results: Vec<serde_json::Value> = rows
            .iter()
            .map(|(test, n, v)| {
                let (mean, sd) = mean_sd(v);
                serde_json::json!({"test": test, "n_tokens": n, "reps": v.len(),
                    "mean_tok_s": mean, "stddev_tok_s": sd, "ms_per_tok": 1000.0 / mean,
                    "samples_tok_s": v})
            })
            .collect();
        let doc = serde_json::json!({
            "model": name,
            "device": {"soc_model": facts.soc_model, "dsp_arch": facts.dsp_arch,
                       "build_id": facts.build_id,
                       "manifest_dsp_arch": m.dsp_arch, "manifest_soc_model": m.soc_model},
            "qnn_api": format!("{}.{}.{}", api.major, api.minor, api.patch),
            "backend": model.rt.backend().path.display().to_string(),
            "perf_mode": model.rt.perf_mode.as_str(),
            "io_mode": io_mode,
            "io_dtype": io_dtype,
            "max_ctx": model.max_ctx,
            "load_ms": model.load_ms,
            "results": results,
        });
        writeln!(out, "{doc}")?;
    } else {
        writeln!(
            out,
            "| model | io | perf | mem | test | t/s | ms/tok |\n| --- | --- | --- | --- | --- | ---: | ---: |"
        )?;
        for (test, _, v) in &rows {
            let (mean, sd) = mean_sd(v);
            writeln!(
                out,
                "| {name} | {io_dtype} | {} | {io_mode} | {test} | {mean:.2} ± {sd:.2} | {:.3} |",
                model.rt.perf_mode.as_str(),
                1000.0 / mean
            )?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `-f FILE` / `-f -` (stdin): the whole file is the prompt, one trailing newline dropped.
fn read_prompt_file(f: &std::path::Path) -> Result<String> {
    let mut text = if f.as_os_str() == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .context("reading the prompt from stdin")?;
        s
    } else {
        std::fs::read_to_string(f)
            .with_context(|| format!("reading prompt file {}", f.display()))?
    };
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(text)
}

/// `--verbose-prompt`: the ids as fed, and each id's piece.
fn print_prompt(tok: &qhx::tokenizer::Tokenizer, ids: &[u32]) {
    eprintln!("qhx: prompt {} ids: {ids:?}", ids.len());
    for (i, &t) in ids.iter().enumerate() {
        eprintln!("qhx: {i:5} {t:7} {:?}", tok.token_to_piece(t));
    }
}
