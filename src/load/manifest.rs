//! Loading a bundle: libraries, context binaries, graph discovery and validation of every
//! graph tensor against the manifest. Bindings are built from the binaries' descriptors.

use super::model::{open_runtime, About, ContextLoad, LoadOptions, Model};
use crate::bundle::manifest::{GraphRef, GraphRole, Manifest};
use crate::error::{Error, Result};
use crate::ops::embed::EmbedTable;
use crate::plan::{self, Plan};
use crate::qnn::{self, BinaryInfo, Context, Graph, GraphDesc, Runtime};
use crate::tokenizer::Tokenizer;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Choose the graph for `role` from a binary: by manifest name, else the only graph, else
/// the one whose name contains a role word.
fn pick_graph<'a>(info: &'a BinaryInfo, r: &GraphRef, role: GraphRole) -> Result<&'a GraphDesc> {
    let role_key = role.as_str();
    let names = || {
        info.graphs
            .iter()
            .map(|g| g.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(want) = &r.graph {
        return info
            .graphs
            .iter()
            .find(|g| &g.name == want)
            .ok_or_else(|| Error::File {
                path: r.bin.clone(),
                msg: format!(
                    "no graph named {want:?} for {role_key} (the binary has: {})",
                    names()
                ),
            });
    }
    if info.graphs.len() == 1 {
        return Ok(&info.graphs[0]);
    }
    let hits: Vec<_> = info
        .graphs
        .iter()
        .filter(|g| {
            let n = g.name.to_lowercase();
            role.name_words().iter().any(|w| n.contains(w))
        })
        .collect();
    match hits.as_slice() {
        [g] => Ok(g),
        _ => Err(Error::File {
            path: r.bin.clone(),
            msg: format!(
                "cannot tell which graph is the {role_key} graph (the binary has: {}); set artifacts.contexts.{role_key}.graph",
                names()
            ),
        }),
    }
}

/// End-of-turn / end-of-text tokens of common chat models (Llama-3 instruct, DeepSeek-R1,
/// ChatML): generation stops on them as on the manifest's eos ids.
pub const END_TOKENS: &[&str] = &[
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
    "<|im_end|>",
    "<|endoftext|>",
];

/// Run `load` over `bins` as `mode` says; results in `bins` order.
fn run_in_order<T: Send>(
    bins: &[PathBuf],
    mode: ContextLoad,
    load: impl Fn(&PathBuf) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    match (mode, bins.split_first()) {
        (ContextLoad::FirstThenParallel, Some((first, rest))) if rest.len() > 1 => {
            let head = load(first);
            if head.is_err() {
                return vec![head];
            }
            let tail: Vec<Result<T>> = std::thread::scope(|sc| {
                let hs: Vec<_> = rest.iter().map(|b| sc.spawn(|| load(b))).collect();
                hs.into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(Error::ThreadPanicked("context-loading")))
                    })
                    .collect()
            });
            std::iter::once(head).chain(tail).collect()
        }
        _ => {
            // Stop at the first failure: later contexts would be freed unused.
            let mut out = Vec::with_capacity(bins.len());
            for b in bins {
                let r = load(b);
                let failed = r.is_err();
                out.push(r);
                if failed {
                    break;
                }
            }
            out
        }
    }
}

/// Contexts created from the bundle's binaries, by file.
type Contexts = HashMap<PathBuf, (Arc<Context>, BinaryInfo)>;

/// Load a manifest bundle: check its files, open the QNN libraries, create a context per binary,
/// pick and validate the prefill, decode and lm-head graphs.
pub fn load(m: Manifest, backend: &Path, system: &Path, opts: &LoadOptions) -> Result<Model> {
    let t0 = Instant::now();
    let progress = |stage: &str| {
        if let Some(p) = opts.progress {
            p(stage)
        }
    };
    check_files(&m)?;
    progress("embedding table");
    let embed = EmbedTable::open(&m.embed, m.embed_dtype, m.params.vocab, m.params.hidden)?;
    // Graph names and I/O need only libQnnSystem: a wrong name or shape is reported
    // before the backend starts and any context is created.
    progress("graph metadata");
    // On a shared runtime its system library reads them; otherwise ours, kept for the
    // runtime opened below.
    let (sys, infos) = match &opts.runtime {
        Some(rt) => (None, read_infos(&m, rt.system())?),
        None => {
            let s = qnn::SystemLibrary::load(system)?;
            let infos = read_infos(&m, &s)?;
            (Some(s), infos)
        }
    };
    check_graphs(&m, &infos)?;
    if opts.cancel.is_cancelled() {
        return Err(Error::Cancelled);
    }
    // The tokenizer (the slowest host part of a cold start: a 150k-token BPE) loads on
    // its own thread while the embedding is mapped and the contexts are created. Its
    // errors still take precedence, as when it loaded first.
    let tok_path = m.tokenizer.clone();
    let tok_thread = std::thread::spawn(move || Tokenizer::load(&tok_path));
    let stage2 = || -> Result<_> {
        progress("QNN libraries");
        let (rt, rpcmem_note, warnings) = open_runtime(backend, sys, system, opts)?;
        let (contexts, context_ms) = create_contexts(&rt, &m, &infos, opts, &progress)?;
        Ok((rt, rpcmem_note, warnings, contexts, context_ms))
    };
    let stage2 = stage2();
    let tokenizer = tok_thread
        .join()
        .unwrap_or_else(|_| Err(Error::ThreadPanicked("tokenizer-loading")))?;
    if tokenizer.vocab_size() > m.params.vocab {
        return Err(Error::Tokenizer {
            path: m.tokenizer.clone(),
            msg: format!(
                "has {} tokens but params.vocab (embedding rows) is {}",
                tokenizer.vocab_size(),
                m.params.vocab
            ),
        });
    }
    let (rt, rpcmem_note, warnings, contexts, context_ms) = stage2?;
    progress("graphs");
    let graphs = plan::manifest::Graphs::pick(&m, |r, role| load_graph(&contexts, r, role))?;
    let plan = plan::manifest::resolve(&m, graphs, Some(embed))?;
    let max_ctx = plan.max_ctx;
    let eos = end_tokens(&m, &tokenizer);
    let about = about(&m, &plan, max_ctx);
    Ok(Model {
        eos,
        bos: m.params.bos_token_id,
        about,
        rt,
        plan: Arc::new(plan),
        tokenizer,
        max_ctx,
        load_ms: t0_ms(t0),
        context_ms,
        rpcmem_note,
        warnings,
    })
}

/// Rows of the plan's verify step (the one that admits a chunk of drafts), if any.
fn verify_rows(plan: &Plan) -> Option<usize> {
    plan.steps
        .iter()
        .find(|s| matches!(s.admit, plan::Admit::Chunk { .. }))
        .map(|s| s.rows)
}

/// `C1→C2→` before the largest context of a ladder (empty without one).
fn ladder_prefix(plan: &Plan) -> String {
    let rungs = plan.rungs();
    let (_, smaller) = rungs.split_last().expect("a plan has a rung");
    smaller
        .iter()
        .map(|&s| format!("{}→", plan.steps[s].past))
        .collect()
}

/// The banner and bench facts of a manifest bundle.
fn about(m: &Manifest, plan: &Plan, max_ctx: usize) -> About {
    let name = if m.name.is_empty() { "model" } else { &m.name };
    let io = plan.io_dtypes().0;
    let mut files = vec![m.embed.clone()];
    for r in m.graph_refs() {
        if !files.contains(&r.bin) {
            files.push(r.bin.clone());
        }
    }
    About {
        description: m.path.clone(),
        title: format!(
            "{name} ({}{})",
            m.arch.as_str(),
            m.dsp_arch
                .as_deref()
                .map(|a| format!(", {a}"))
                .unwrap_or_default()
        ),
        details: format!(
            "prefill {}{} | ctx {}{max_ctx} | I/O {io}",
            match (&m.prefill, plan.steps.first()) {
                (Some(_), Some(pre)) => format!("P={}", pre.rows),
                _ => "none (decode-over-prompt)".to_string(),
            },
            match (&m.verify, verify_rows(plan)) {
                (Some(_), Some(rows)) => format!(" | verify {rows} rows"),
                _ => String::new(),
            },
            ladder_prefix(plan),
        ),
        model_type: format!("{name} ({})", m.arch.as_str()),
        files,
        n_params: m.n_params.unwrap_or(0),
        io_type: crate::qnn::short_dtype(io),
        dsp_arch: m.dsp_arch.clone(),
        soc_model: m.soc_model,
        unused_keys: m.unknown_keys.clone(),
    }
}

/// Files first: a missing artifact should not wait for the NPU.
fn check_files(m: &Manifest) -> Result<()> {
    for (what, p) in [("tokenizer", &m.tokenizer), ("embedding table", &m.embed)] {
        if !p.is_file() {
            return Err(Error::File {
                path: p.clone(),
                msg: format!(
                    "{what} not found (artifact paths resolve against the artifacts root)"
                ),
            });
        }
    }
    Ok(())
}

/// The distinct binaries of a bundle, in manifest order.
fn binaries(m: &Manifest) -> Vec<PathBuf> {
    let mut bins: Vec<PathBuf> = Vec::new();
    for r in m.graph_refs() {
        if !bins.contains(&r.bin) {
            bins.push(r.bin.clone());
        }
    }
    bins
}

/// Map a context binary (an empty file is an error, not a mapping).
fn map_binary(bin: &Path) -> Result<memmap2::Mmap> {
    let file = std::fs::File::open(bin).map_err(|e| Error::io(bin, e))?;
    let len = file.metadata().map_err(|e| Error::io(bin, e))?.len();
    if len == 0 {
        return Err(Error::File {
            path: bin.to_path_buf(),
            msg: "context binary is empty".into(),
        });
    }
    crate::os::map_file(&file, bin)
}

/// Each binary's graphs and tensors, read with the system library alone.
fn read_infos(m: &Manifest, sys: &qnn::SystemLibrary) -> Result<HashMap<PathBuf, BinaryInfo>> {
    binaries(m)
        .into_iter()
        .map(|bin| {
            let map = map_binary(&bin)?;
            let info = qnn::read_binary_info_with(sys, &map, &bin)?;
            Ok((bin, info))
        })
        .collect()
}

/// Every check of the graphs that needs only their metadata: the manifest's graph names
/// (or the role guess), dtypes, the layer I/O contract and the lm-head's shape — the plan
/// resolved without graph handles.
fn check_graphs(m: &Manifest, infos: &HashMap<PathBuf, BinaryInfo>) -> Result<()> {
    let graphs = plan::manifest::Graphs::pick(m, |r, role| {
        Ok(((), pick_graph(&infos[&r.bin], r, role)?.clone()))
    })?;
    plan::manifest::resolve(m, graphs, None).map(drop)
}

/// Each distinct binary once: map it, create its context, and drop the mapping right away,
/// so peak RSS holds at most the binaries still being created. The first failure in
/// manifest order is reported; contexts already created are freed on return. A cancel
/// stops the load before the next context.
fn create_contexts(
    rt: &Arc<Runtime>,
    m: &Manifest,
    infos: &HashMap<PathBuf, BinaryInfo>,
    opts: &LoadOptions,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<(Contexts, Vec<super::model::ContextStat>)> {
    let bins = binaries(m);
    let n = bins.len();
    type Loaded = (Arc<Context>, BinaryInfo, f64, Option<u64>);
    let load_one = |bin: &PathBuf| -> Result<Loaded> {
        if opts.cancel.is_cancelled() {
            return Err(Error::Cancelled);
        }
        let i = bins.iter().position(|b| b == bin).unwrap_or(0);
        let name = bin.file_name().unwrap_or_default().to_string_lossy();
        progress(&format!("context {}/{n} ({name})", i + 1));
        let tc = Instant::now();
        qnn::check_loadable(&infos[bin], bin)?;
        let map = map_binary(bin)?;
        let ctx = Context::from_binary(rt, &map, bin)?;
        drop(map);
        let ms = t0_ms(tc);
        Ok((ctx, infos[bin].clone(), ms, crate::os::resident_bytes()))
    };
    let results = run_in_order(&bins, opts.context_load, load_one);
    let mut contexts = Contexts::new();
    let mut context_ms = Vec::new();
    for (bin, r) in bins.iter().zip(results) {
        let (ctx, info, ms, rss) = r?;
        context_ms.push((bin.clone(), ms, rss));
        contexts.insert(bin.clone(), (ctx, info));
    }
    Ok((contexts, context_ms))
}

fn load_graph(contexts: &Contexts, r: &GraphRef, role: GraphRole) -> Result<(Graph, GraphDesc)> {
    let (ctx, info) = &contexts[&r.bin];
    let desc = pick_graph(info, r, role)?.clone();
    plan::check_dtypes(&desc)?;
    let graph = ctx.graph(&desc.name)?;
    Ok((graph, desc))
}

/// The manifest's eos ids plus the tokenizer's well-known end tokens.
fn end_tokens(m: &Manifest, tokenizer: &Tokenizer) -> Vec<u32> {
    let mut eos = m.eos.clone();
    for t in END_TOKENS {
        if let Some(id) = tokenizer.token_id(t) {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    eos
}

fn t0_ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}
