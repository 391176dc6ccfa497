//! What qhx_generate reports on stderr: the banner, environment warnings and, at -v, the
//! load details and the sampler chain.

use super::generate::{Mode, Request};
use crate::bundle::Loaded;
use crate::engine::Engine;
use crate::genie::GenieModel;
use crate::model::Model;

/// The banner (unless --quiet), environment warnings, and at -v the details.
pub fn print_banner(req: &Request, loaded: &Loaded, engine: &Engine) {
    let rt = loaded.rt();
    let (dsp_arch, soc_model) = match loaded {
        Loaded::Manifest(model) => {
            if !req.quiet {
                manifest_banner(model);
            }
            (model.manifest.dsp_arch.clone(), model.manifest.soc_model)
        }
        Loaded::Genie(g) => {
            if !req.quiet {
                genie_banner(g);
            }
            (None, None)
        }
    };
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
        bundle_dsp_arch: dsp_arch,
        bundle_soc_model: soc_model,
        device_dsp_arch: rt.device_facts.dsp_arch,
        device_soc_model: rt.device_facts.soc_model,
    };
    for w in crate::envcheck::warnings(&facts, &targets) {
        crate::elog!("qhx: warning: {w}");
    }
    if req.verbose == 0 {
        return;
    }
    if let Loaded::Manifest(model) = loaded {
        for k in &model.manifest.unknown_keys {
            crate::elog!("qhx: note: manifest key {k} is not used by this version (ignored)");
        }
    }
    for (bin, ms) in loaded.context_ms() {
        crate::elog!("qhx: context {} loaded in {ms:.1} ms", bin.display());
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

fn manifest_banner(model: &Model) {
    let m = &model.manifest;
    let rt = &model.rt;
    {
        crate::elog!(
            "qhx {} | {} ({}{}) | {} core API {} | prefill {} | ctx {} | I/O {}",
            env!("CARGO_PKG_VERSION"),
            if m.name.is_empty() { "model" } else { &m.name },
            m.arch.as_str(),
            m.dsp_arch
                .as_deref()
                .map(|a| format!(", {a}"))
                .unwrap_or_default(),
            rt.backend().path.display(),
            rt.backend().core_api,
            match model.plan.steps.as_slice() {
                [pre, _, ..] => format!("P={}", pre.rows),
                _ => "none (decode-over-prompt)".to_string(),
            },
            model.max_ctx,
            model.io_dtype(),
        );
    }
}

fn genie_banner(g: &GenieModel) {
    let rt = &g.rt;
    let variants: Vec<String> = g
        .plan
        .steps
        .iter()
        .map(|v| format!("AR{}/CL{} x{}", v.rows, v.rows + v.past, v.splits.len()))
        .collect();
    crate::elog!(
        "qhx {} | Genie bundle {} | {} core API {} | {} layers, {} variants ({}) | ctx {}",
        env!("CARGO_PKG_VERSION"),
        g.config_path.display(),
        rt.backend().path.display(),
        rt.backend().core_api,
        g.n_layers(),
        g.plan.steps.len(),
        variants.join(", "),
        g.max_ctx(),
    );
}

/// `--verbose-prompt`: the ids as fed, and each id's piece.
pub fn print_prompt(tok: &crate::tokenizer::Tokenizer, ids: &[u32]) {
    crate::elog!("qhx: prompt {} ids: {ids:?}", ids.len());
    for (i, &t) in ids.iter().enumerate() {
        crate::elog!("qhx: {i:5} {t:7} {:?}", tok.token_to_piece(t));
    }
}
