//! `qhx_server <manifest|bundle_dir> <backend_lib> <system_lib> <artifacts_root> [flags]`
//!
//! Loads the bundle once, keeps `--parallel` sessions over it and serves OpenAI's
//! `/v1/chat/completions`, `/v1/completions` and `/v1/models`, plus `/health` and
//! `/metrics`, on `--host:--port`. Logs go to stderr; stdout stays empty. SIGINT / SIGTERM
//! stop taking connections, let in-flight requests finish, and exit 0.

#![forbid(unsafe_code)]

use anyhow::{Context as _, Result};
use clap::Parser;
use qhx::bundle::Spec;
use qhx::load::{LoadOptions, Loaded};
use qhx::session::Session;
use qhx_server::api::Defaults;
use qhx_server::listen::{self, Limits};
use qhx_server::metrics::Metrics;
use qhx_server::pool::Pool;
use qhx_server::routes::{self, App};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(name = "qhx_server", version = qhx::cli::LONG_VERSION, about = "OpenAI-compatible HTTP server over a qhx bundle")]
struct Args {
    /// The bundle's manifest.json / genie_config.json, or its directory.
    manifest: PathBuf,
    /// The QNN backend library (libQnnHtp.so).
    backend_lib: PathBuf,
    /// The QNN system library (libQnnSystem.so).
    system_lib: PathBuf,
    /// Directory the bundle's file names are relative to.
    artifacts_root: PathBuf,
    /// Address to listen on (0.0.0.0 to accept other machines: set --api-key then).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0: any free one; the one taken is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/* (also from QHX_API_KEY).
    #[arg(long, env = "QHX_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Sessions kept over the one loaded model (requests generating at once).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    parallel: u16,
    /// Requests that may wait for a session; past it: 503 with Retry-After.
    #[arg(long, default_value_t = 32)]
    queue: usize,
    /// Name of the model in /v1/models and responses (default: the bundle's directory name).
    #[arg(long, value_name = "NAME")]
    alias: Option<String>,
    /// `max_tokens` of a /v1/completions request that gives none (OpenAI's default is 16).
    #[arg(long, default_value_t = 16, value_name = "N")]
    completion_max_tokens: usize,
    /// Largest request body accepted, bytes (413 past it).
    #[arg(long, default_value_t = 4 << 20, value_name = "BYTES")]
    max_body: usize,
    /// Open connections served at once; more are answered 503 and closed.
    #[arg(long, default_value_t = 256)]
    max_connections: usize,
    /// Seconds a client has to send a request's headers (also an idle keep-alive limit).
    #[arg(long, default_value_t = 10, value_name = "S")]
    header_timeout: u64,
    /// Seconds a client has to send a request's body (408 past it).
    #[arg(long, default_value_t = 30, value_name = "S")]
    body_timeout: u64,
    /// Seconds a stop waits for in-flight requests before cancelling them.
    #[arg(long, default_value_t = 60, value_name = "S")]
    drain_timeout: u64,
    /// Positions a request may use, prompt and reply (default and at most: the bundle's
    /// context).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2..))]
    ctx: Option<u32>,
    #[command(flatten)]
    sampling: qhx::cli::SamplingArgs,
    #[command(flatten)]
    speculation: qhx::cli::SpecArgs,
    /// More log lines on stderr (load details, each request).
    #[arg(short, long)]
    verbose: bool,
}

fn main() -> ExitCode {
    let args = match qhx::cli::parse_or_exit::<Args, _, _>("qhx_server", std::env::args_os()) {
        Ok(a) => a,
        Err(code) => return code,
    };
    if let Err(e) = qhx::os::stdio::isolate_stdout(args.verbose) {
        qhx::elog!("qhx_server: warning: cannot keep stdout private ({e})");
    }
    qhx::cli::finish("qhx_server", run(args))
}

fn run(args: Args) -> Result<ExitCode> {
    let mut sampler = args.sampling.config().map_err(qhx::cli::usage)?;
    // A seed given on the command line fixes every request's; none: each request draws one.
    if args.sampling.seed.is_none() {
        sampler.seed = None;
    }
    let mut notes = Vec::new();
    let (manifest, root) = qhx::cli::generate::resolve_manifest(
        &args.manifest,
        args.artifacts_root.clone(),
        &args.backend_lib,
        &args.system_lib,
        &mut notes,
    )?;
    for n in &notes {
        qhx::elog!("qhx_server: {n}");
    }
    let spec = Arc::new(Spec::load(&manifest, &root)?);
    spec.check_files()?;
    let loaded = Loaded::load(
        &spec,
        &args.backend_lib,
        &args.system_lib,
        &LoadOptions::default(),
    )
    .with_context(|| format!("loading {}", manifest.display()))?;
    for w in loaded.warnings() {
        qhx::elog!("qhx_server: {w}");
    }
    let (spec_cfg, note) =
        qhx::session::spec_or_bundle(args.speculation.config().map_err(qhx::cli::usage)?, &spec);
    if let Some(n) = note {
        qhx::elog!("qhx_server: {n}");
    }
    let draft = match spec_cfg.as_ref().and_then(|s| s.draft_bundle.as_deref()) {
        Some(p) => Some((
            qhx::draft::DraftModel::load_bundle(p, &loaded, &LoadOptions::default())
                .with_context(|| format!("loading the draft bundle {}", p.display()))?,
            p.display().to_string(),
        )),
        None => None,
    };
    let sessions = (0..args.parallel)
        .map(|_| {
            let mut s = Session::new(Arc::clone(&spec), loaded.clone())?;
            if let Some((d, name)) = &draft {
                let m = qhx::draft::DraftModel::new(d.model(), loaded.model(), name)?;
                s.engine().set_draft(Some(m));
            }
            Ok(s)
        })
        .collect::<qhx::Result<Vec<_>>>()
        .context("creating the sessions")?;
    let metrics = Arc::new(Metrics::new(sessions.len(), args.queue));
    let pool = Arc::new(Pool::new(sessions, args.queue, Arc::clone(&metrics)));
    let model = args.alias.clone().unwrap_or_else(|| model_name(&manifest));
    let app = Arc::new(App::new(
        Arc::clone(&pool),
        metrics,
        Defaults {
            sampler,
            completion_max_tokens: args.completion_max_tokens,
            spec: spec_cfg,
        },
        model.clone(),
        args.api_key.clone().filter(|k| !k.is_empty()),
        args.max_body,
        Duration::from_secs(args.body_timeout),
        args.ctx.map(|c| c as usize),
        loaded.clone(),
        Arc::clone(&spec),
    ));
    let app_ctx = app.ctx;
    let limits = Limits {
        max_connections: args.max_connections.max(1),
        header_timeout: Duration::from_secs(args.header_timeout.max(1)),
        drain_timeout: Duration::from_secs(args.drain_timeout),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("qhx-http")
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("listening on {addr}"))?;
        let local = listener.local_addr().context("the bound address")?;
        qhx::elog!(
            "qhx_server: listening on http://{local} (model {model:?}, {} session(s), queue {}, context {}){}",
            pool.parallel(),
            args.queue,
            app_ctx,
            if args.api_key.is_some() { ", API key required" } else { "" }
        );
        listen::serve(listener, routes::router(app), limits, stop_signal(), pool).await;
        qhx::elog!("qhx_server: stopped");
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The bundle's name: its directory's (a manifest's parent), else the file stem.
fn model_name(manifest: &std::path::Path) -> String {
    let dir = manifest.parent().and_then(|p| p.file_name());
    dir.or_else(|| manifest.file_stem())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "qhx".into())
}

/// SIGINT or SIGTERM (Ctrl-C / Ctrl-Break on Windows).
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        match (term, int) {
            (Ok(mut t), Ok(mut i)) => {
                tokio::select! { _ = t.recv() => {}, _ = i.recv() => {} }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    qhx::elog!("qhx_server: stopping: finishing in-flight requests");
}
