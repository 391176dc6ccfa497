//! The whole public path in one screen: read a bundle's description, load it onto the QNN
//! backend, and generate greedily from a prompt through a `Session`.
//!
//!   cargo run --release --example simple -- <manifest.json> <libQnnHtp.so> <libQnnSystem.so> \
//!       <artifacts_root> <n_tokens> '<prompt>'
//!
//! (the emulator: `target/release/libqnn_emu.so` for both libraries, with the demo bundle of
//! `scripts/build-bundle.sh`). Text goes to stdout as it is decided; the speed line to stderr.

use anyhow::{Context, Result};
use qhx::bundle::Spec;
use qhx::engine::GenConfig;
use qhx::load::{LoadOptions, Loaded};
use qhx::session::{Prompt, Session, TextRequest};
use qhx::text::WriteSink;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [manifest, htp, system, root, n, prompt] = args.as_slice() else {
        anyhow::bail!("usage: simple <manifest> <backend_lib> <system_lib> <artifacts_root> <n_tokens> <prompt>");
    };
    let n: usize = n.parse().context("n_tokens")?;
    // 0. Before any QNN library loads: what a library prints must not reach our stdout.
    qhx::os::stdio::isolate_stdout(false)?;

    // 1. The description: what the bundle declares, checked before anything loads.
    let spec = Arc::new(Spec::load(Path::new(manifest), Path::new(root))?);
    spec.check_files()?;
    // 2. The load: libraries, backend, one context per binary, graphs resolved into a plan.
    let loaded = Loaded::load(
        &spec,
        Path::new(htp),
        Path::new(system),
        &LoadOptions::default(),
    )?;
    // 3. A session: an engine over the loaded model, and the one place a request is composed.
    let mut session = Session::new(Arc::clone(&spec), loaded)?;
    let ids = session.prompt_ids(&Prompt::Text(prompt.clone()))?;
    let cfg = GenConfig::greedy(n);
    // 4. Generate: text streams to stdout; stops, EOS and the context limit end the turn.
    let mut out = qhx::os::stdio::stdout();
    let turn = session.generate(
        &ids,
        &cfg,
        n,
        &TextRequest::default(),
        0.0,
        Some(&mut WriteSink(&mut out)),
    )?;
    writeln!(out)?;
    eprintln!(
        "{} (finish: {})",
        turn.output.stats.line(),
        turn.finish.as_str()
    );
    Ok(())
}
