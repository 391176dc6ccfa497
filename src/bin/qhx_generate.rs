//! `qhx_generate <manifest> <backend_lib> <system_lib> <artifacts_root> [n_tokens] [prompt]`
//!
//! stdout carries the generated text only (or the one `--json` document, or the `--bench`
//! table); the banner, logs and the stats line go to stderr. Exit codes: 0 ok, 1 failure,
//! 2 usage, 3 parity mismatch (`--expect-tokens`), 130 cancelled (Ctrl-C).
//!
//! This file parses, loads and prints; generation lives in the library
//! ([`qhx::text`], [`qhx::interactive`], [`qhx::bench`]).

#![forbid(unsafe_code)]

use anyhow::{Context as _, Result};
use qhx::cancel::CancelToken;
use qhx::cli::generate::{first_mismatch, map_argv, Args, Mode, Prompt, Request};
use qhx::cli::report::{print_banner, print_prompt};
use qhx::engine::FinishReason;
use qhx::load::Loaded;
use qhx::session::Session;
use qhx::text::{TextDriver, TextSink, WriteSink};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Instant;

/// Exit code after SIGINT/SIGTERM (128 + SIGINT, the shell convention).
const EXIT_CANCELLED: u8 = 130;

/// SIGINT/SIGTERM (Ctrl-C / Ctrl-Break on Windows): the first one cancels the running
/// generation after its current graph call; a second one before it is reset exits at once.
fn install_signal_handler(cancel: CancelToken) {
    let r = ctrlc::set_handler(move || {
        if cancel.is_cancelled() {
            std::process::exit(EXIT_CANCELLED as i32);
        }
        cancel.cancel();
    });
    if let Err(e) = r {
        qhx::elog!("qhx: warning: no SIGINT/SIGTERM handler ({e}); Ctrl-C will not stop cleanly");
    }
}

fn main() -> ExitCode {
    let cancel = CancelToken::new();
    install_signal_handler(cancel.clone());
    let argv = map_argv(std::env::args_os());
    let args = match qhx::cli::parse_or_exit::<Args, _, _>("qhx_generate", argv) {
        Ok(a) => a,
        Err(code) => return code,
    };
    // Before any QNN library is loaded: what a library prints must not reach our stdout.
    if let Err(e) = qhx::os::stdio::isolate_stdout(args.verbose > 0) {
        qhx::elog!(
            "qhx_generate: warning: cannot keep stdout private ({e}); library output may mix in"
        );
    }
    qhx::cli::finish("qhx_generate", run(args, cancel))
}

/// One `\r`-rewritten line on a terminal's stderr while the bundle loads.
fn show_progress(stage: &str) {
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "\r\x1b[2Kqhx: loading {stage}…");
    let _ = err.flush();
}

fn run(args: Args, cancel: CancelToken) -> Result<ExitCode> {
    let mut req = Request::from_args(args, cancel)?;
    for n in &req.notes {
        qhx::elog!("qhx: {n}");
    }
    // A prompt that cannot fit is reported before the load (the tokenizer alone decides).
    req.check_prompt_fits()?;
    let progress = std::io::stderr().is_terminal() && !req.quiet;
    if progress {
        req.load.progress = Some(show_progress);
    }
    let loaded = Loaded::load(&req.bundle, &req.backend_lib, &req.system_lib, &req.load);
    if progress {
        let _ = write!(std::io::stderr(), "\r\x1b[2K");
    }
    // Ctrl-C while loading: stop now, before any prompt is fed.
    if matches!(loaded, Err(qhx::Error::Cancelled)) || req.cancel.is_cancelled() {
        drop(loaded);
        qhx::elog!("qhx: cancelled while loading");
        return Ok(ExitCode::from(EXIT_CANCELLED));
    }
    let model = loaded.context("loading the bundle")?;
    let mut session = Session::new(std::sync::Arc::clone(&req.bundle), model.clone())
        .context("binding graph I/O")?;
    if let Some(d) = req.spec.as_ref().and_then(|s| s.draft_bundle.as_ref()) {
        session
            .attach_draft(req.spec.as_ref(), &req.load)
            .with_context(|| format!("loading the draft bundle {}", d.display()))?;
    }
    print_banner(&req, &model, session.engine());
    let mut out = qhx::os::stdio::stdout();
    match &req.mode {
        Mode::Bench { cfg, format } => {
            let (tests, warnings) = qhx::bench::plan(cfg, model.max_ctx());
            for w in warnings {
                qhx::elog!("qhx: warning: bench {w}");
            }
            let info = qhx::bench::RunInfo::new(
                &model,
                session.engine().zero_copy(),
                env!("CARGO_PKG_VERSION"),
                qhx::cli::BUILD_COMMIT,
            );
            let mut printer = qhx::bench::Printer::new(*format, &mut out);
            let vocab = req.bundle.vocab();
            qhx::bench::run(session.engine(), cfg, &info, &tests, vocab, &mut printer)
                .context("benchmark run")?;
            Ok(if cfg.cancel.is_cancelled() {
                ExitCode::from(EXIT_CANCELLED)
            } else {
                ExitCode::SUCCESS
            })
        }
        Mode::Interactive { transcript } => {
            let eos = model.eos();
            let driver = TextDriver::new(
                model.tokenizer(),
                &eos,
                session.text_options(&req.text_request())?,
            );
            let tmpl = session.template()?;
            let opts = qhx::interactive::Options {
                system: req.system.clone(),
                cfg: req.turn_config(),
                verbose_prompt: req.verbose_prompt,
                transcript: transcript.clone(),
                quiet: req.quiet,
            };
            // A prompt given on the command line is the first turn.
            let first = match &req.prompt {
                Prompt::Text(p) => format!("{}\n", p.replace(['\r', '\n'], " ")),
                _ => String::new(),
            };
            let input = std::io::Read::chain(std::io::Cursor::new(first), std::io::stdin().lock());
            qhx::interactive::run(session.engine(), &driver, &tmpl, &opts, input, out)?;
            Ok(ExitCode::SUCCESS)
        }
        Mode::OneShot { json, expected, .. } => {
            let t_tok = Instant::now();
            let ids = session.prompt_ids(&req.session_prompt())?;
            let tokenize_ms = t_tok.elapsed().as_secs_f64() * 1000.0;
            if req.verbose_prompt {
                print_prompt(model.tokenizer(), &ids);
            }
            let (cfg, wanted) = req.one_shot_config(ids.len(), model.max_ctx())?;
            if cfg.n_tokens < wanted {
                qhx::elog!(
                    "qhx: warning: n_tokens {wanted} clamped to {} (prompt {} + generated must fit max_ctx {})",
                    cfg.n_tokens,
                    ids.len(),
                    model.max_ctx()
                );
            }
            let mut stdout_sink = WriteSink(&mut out);
            let sink = (!json).then_some(&mut stdout_sink as &mut dyn TextSink);
            let text = req.text_request();
            let turn = session.generate(&ids, &cfg, wanted, &text, tokenize_ms, sink)?;
            if *json {
                let mut doc = serde_json::json!({
                    "input_ids": turn.output.input_ids,
                    "output_ids": turn.output.output_ids,
                    "text": turn.saved,
                    "finish_reason": turn.finish.as_str(),
                    "stats": turn.output.stats,
                    "sampling": {"seed": cfg.sampler.seed, "chain": cfg.sampler.chain()},
                });
                if let Some(t) = &req.tools {
                    doc["tool_calls"] = serde_json::json!(t.parse_calls(&turn.saved));
                }
                if let Some(sp) = &turn.output.spec {
                    doc["spec"] = serde_json::json!(sp);
                }
                writeln!(out, "{doc}")?;
                out.flush()?;
            }
            if !req.quiet {
                let spec = turn.output.spec.as_ref().map_or(String::new(), |sp| {
                    format!(
                        " tokens_per_verify={:.2} decode_executes_per_token={:.2}",
                        sp.tokens_per_verify, sp.decode_executes_per_token
                    )
                });
                qhx::elog!(
                    "{}{spec} finish={}",
                    turn.output.stats.line(),
                    turn.finish.as_str()
                );
            }
            if turn.finish == FinishReason::Cancelled {
                // Model (contexts, device, backend, log) is dropped on return, child-first.
                return Ok(ExitCode::from(EXIT_CANCELLED));
            }
            let Some(exp) = expected else {
                return Ok(ExitCode::SUCCESS);
            };
            let got = &turn.output.output_ids;
            let piece = |id: Option<&u32>| match id {
                Some(&t) => format!(
                    "{t} {:?}",
                    model.tokenizer().decode(&[t]).unwrap_or_default()
                ),
                None => "nothing (generation ended)".to_string(),
            };
            match first_mismatch(exp, got) {
                None => {
                    qhx::elog!("parity: {}/{} tokens match", exp.len(), exp.len());
                    Ok(ExitCode::SUCCESS)
                }
                Some(i) => {
                    qhx::elog!(
                        "parity: mismatch at step {i} of {}: expected {}, got {}",
                        exp.len(),
                        piece(exp.get(i)),
                        piece(got.get(i))
                    );
                    Ok(ExitCode::from(3))
                }
            }
        }
    }
}
