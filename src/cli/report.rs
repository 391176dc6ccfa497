//! What qhx_generate reports on stderr: the banner, environment warnings and, at -v, the
//! load details and the sampler chain.

use super::generate::{Mode, Request};
use crate::engine::Engine;
use crate::load::Loaded;

/// The banner (unless --quiet), environment warnings, and at -v the details.
pub fn print_banner(req: &Request, loaded: &Loaded, engine: &Engine) {
    let rt = loaded.rt();
    let about = &loaded.model().about;
    if !req.quiet {
        crate::elog!(
            "qhx {} | {} | {} core API {} | {}",
            env!("CARGO_PKG_VERSION"),
            about.title,
            rt.backend().path.display(),
            rt.backend().core_api,
            about.details,
        );
    }
    for w in loaded.warnings() {
        crate::elog!("qhx: warning: {w}");
    }
    let facts = crate::envcheck::EnvFacts::gather(
        &rt.backend().path,
        &rt.device_facts.build_id,
        &rt.backend().provider_name,
        &rt.system().path,
    );
    let targets = crate::envcheck::Targets {
        bundle_dsp_arch: about.dsp_arch.clone(),
        bundle_soc_model: about.soc_model,
        device_dsp_arch: rt.device_facts.dsp_arch,
        device_soc_model: rt.device_facts.soc_model,
    };
    for w in crate::envcheck::warnings(&facts, &targets) {
        crate::elog!("qhx: warning: {w}");
    }
    if req.verbose == 0 {
        return;
    }
    for k in &about.unused_keys {
        crate::elog!("qhx: note: manifest key {k} is not used by this version (ignored)");
    }
    for (bin, ms, rss) in loaded.context_ms() {
        let rss = rss.map_or(String::new(), |b| {
            format!(", resident {:.1} MB after", b as f64 / 1e6)
        });
        crate::elog!("qhx: context {} loaded in {ms:.1} ms{rss}", bin.display());
    }
    let io_mode = match (rt.rpcmem_path(), rt.zero_copy_refused()) {
        (Some(p), _) if engine.zero_copy() => format!("rpcmem zero-copy ({})", p.display()),
        (_, Some(why)) => {
            crate::elog!("qhx: warning: zero-copy I/O unavailable, using client buffers: {why}");
            format!("client buffers (zero-copy refused: {why})")
        }
        _ => format!(
            "client buffers (rpcmem {})",
            loaded.rpcmem_note().unwrap_or("not used")
        ),
    };
    crate::elog!("qhx: I/O mode: {io_mode}");
    crate::elog!("qhx: perf mode: {}", rt.perf_mode.as_str());
    if !matches!(req.mode, Mode::Bench { .. }) {
        let seed = req.sampler.seed.map_or("none".into(), |s| s.to_string());
        crate::elog!(
            "qhx: sampler: seed {seed} | chain {}{}",
            req.sampler.chain().join(" -> "),
            if req.sampler_from_bundle {
                " (the Genie config's sampler block)"
            } else {
                ""
            }
        );
    }
}

/// `--verbose-prompt`: the ids as fed, and each id's piece.
pub fn print_prompt(tok: &crate::tokenizer::Tokenizer, ids: &[u32]) {
    crate::elog!("qhx: prompt {} ids: {ids:?}", ids.len());
    for (i, &t) in ids.iter().enumerate() {
        crate::elog!("qhx: {i:5} {t:7} {:?}", tok.token_to_piece(t));
    }
}
