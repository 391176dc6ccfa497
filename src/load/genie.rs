//! A Genie bundle loaded through QNN: its graphs discovered from the binaries' own metadata
//! and grouped the way Genie groups them (variants by tokens-per-step AR and context CL,
//! splits of one variant by sorted graph name), with every tensor given a role.

use super::model::{open_runtime, About, LoadOptions, Model};
use crate::bundle::genie::Resolved;
use crate::error::{Error, Result};
use crate::plan::{self, Plan};
use crate::qnn::{self, Context, Graph, GraphDesc, Runtime};
use crate::tokenizer::Tokenizer;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Load a Genie bundle: the config, its context binaries, the graphs resolved into a plan.
pub fn load(
    config_path: &Path,
    cfg: Resolved,
    backend: &Path,
    system: &Path,
    opts: &LoadOptions,
) -> Result<Model> {
    let t0 = Instant::now();
    for p in cfg.ctx_bins.iter().chain([&cfg.tokenizer]) {
        if !p.is_file() {
            return Err(Error::File {
                path: p.clone(),
                msg: "not found (Genie config paths resolve against the artifacts root)".into(),
            });
        }
    }
    let progress = |stage: &str| {
        if let Some(p) = opts.progress {
            p(stage)
        }
    };
    if opts.cancel.is_cancelled() {
        return Err(Error::Cancelled);
    }
    // As for manifest bundles: the tokenizer parses on its own thread while the
    // contexts are created, and its errors still come first.
    let tok_path = cfg.tokenizer.clone();
    let tok_thread = std::thread::spawn(move || Tokenizer::load(&tok_path));
    let stage2 = (|| -> Result<_> {
        progress("QNN libraries");
        let (rt, rpcmem_note, warnings) = open_runtime(backend, None, system, opts)?;
        let mut graphs: Vec<(Graph, GraphDesc)> = Vec::new();
        let mut context_ms = Vec::new();
        // Contexts one after another (the real backend crashed on overlapping creations).
        let n = cfg.ctx_bins.len();
        for (k, bin) in cfg.ctx_bins.iter().enumerate() {
            if opts.cancel.is_cancelled() {
                return Err(Error::Cancelled);
            }
            let name = bin.file_name().unwrap_or_default().to_string_lossy();
            progress(&format!("context {}/{n} ({name})", k + 1));
            let tc = Instant::now();
            graphs.extend(load_context(&rt, bin)?);
            context_ms.push((
                bin.clone(),
                tc.elapsed().as_secs_f64() * 1000.0,
                crate::os::resident_bytes(),
            ));
        }
        Ok((rt, rpcmem_note, warnings, graphs, context_ms))
    })();
    let tokenizer = tok_thread
        .join()
        .unwrap_or_else(|_| Err(Error::ThreadPanicked("tokenizer-loading")))?;
    let (rt, rpcmem_note, warnings, graphs, context_ms) = stage2?;
    progress("graphs");
    let (plan, _) = plan::genie::resolve(&cfg, config_path, graphs, tokenizer.vocab_size())?;
    Ok(Model {
        eos: end_tokens(&cfg),
        bos: cfg.bos,
        about: about(config_path, &cfg, &plan),
        max_ctx: plan.max_ctx,
        rt,
        tokenizer,
        plan: Arc::new(plan),
        load_ms: t0.elapsed().as_secs_f64() * 1000.0,
        context_ms,
        rpcmem_note,
        warnings,
    })
}

/// End tokens: the config's eos-token(s) and eot-token.
fn end_tokens(cfg: &Resolved) -> Vec<u32> {
    let mut e = cfg.eos.clone();
    let eot = cfg.cfg.dialog.context.eot_token;
    if let Some(t) = eot.and_then(|i| u32::try_from(i).ok()) {
        if !e.contains(&t) {
            e.push(t);
        }
    }
    e
}

/// The banner and bench facts of a Genie bundle. Genie configs name no model and no
/// parameter count: the type is the bundle directory's name, the size the context
/// binaries', the I/O type the activations' (and the KV cache's when it differs, as in AI
/// Hub's w4a16 bundles with uint8 KV).
fn about(config_path: &Path, cfg: &Resolved, plan: &Plan) -> About {
    let short = crate::qnn::short_dtype;
    let variants: Vec<String> = plan
        .steps
        .iter()
        .map(|v| format!("AR{}/CL{} x{}", v.rows, v.rows + v.past, v.splits.len()))
        .collect();
    let dir = config_path
        .canonicalize()
        .ok()
        .and_then(|p| p.parent().and_then(|d| d.file_name()).map(|n| n.to_owned()))
        .map_or_else(|| "genie".to_string(), |n| n.to_string_lossy().into_owned());
    let (act, kv) = plan.io_dtypes();
    About {
        description: config_path.to_path_buf(),
        title: format!("Genie bundle {}", config_path.display()),
        details: format!(
            "{} layers, {} variants ({}) | ctx {}",
            plan.n_layers,
            plan.steps.len(),
            variants.join(", "),
            plan.max_ctx
        ),
        model_type: format!("{dir} (genie)"),
        files: cfg.ctx_bins.clone(),
        n_params: 0,
        io_type: if act == kv {
            short(act)
        } else {
            format!("{}/kv {}", short(act), short(kv))
        },
        dsp_arch: None,
        soc_model: None,
        unused_keys: Vec::new(),
    }
}

/// Create the context of one binary and list its graphs; every I/O dtype must be one the
/// host can fill and read.
fn load_context(rt: &Arc<Runtime>, bin: &Path) -> Result<Vec<(Graph, GraphDesc)>> {
    let file = std::fs::File::open(bin).map_err(|e| Error::io(bin, e))?;
    let map = crate::os::map_file(&file, bin)?;
    let info = qnn::read_binary_info(rt, &map, bin)?;
    qnn::check_loadable(&info, bin)?;
    let ctx: Arc<Context> = Context::from_binary(rt, &map, bin)?;
    drop(map);
    let mut graphs = Vec::new();
    for d in info.graphs {
        plan::check_dtypes(&d)?;
        graphs.push((ctx.graph(&d.name)?, d));
    }
    Ok(graphs)
}

pub use crate::plan::genie::Layout;

/// The checks of [`load`] on graph metadata alone (no QNN handles): group the
/// graphs of every context binary into variants, give each tensor a role, and check the
/// shapes against each other, against the config (`kv-dim`) and against the tokenizer's
/// vocabulary size.
pub fn check_graphs(
    cfg: &Resolved,
    config_path: &Path,
    graphs: Vec<GraphDesc>,
    tokenizer_vocab: usize,
) -> Result<Layout> {
    let graphs = graphs.into_iter().map(|d| ((), d)).collect();
    plan::genie::resolve(cfg, config_path, graphs, tokenizer_vocab).map(|(_, l)| l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::genie::GenieConfig;
    use crate::qnn::TensorDesc;

    fn t(name: &str, dtype: u32, dims: &[u32]) -> TensorDesc {
        TensorDesc {
            id: 0,
            name: name.into(),
            tensor_type: 0,
            dtype,
            dims: dims.to_vec(),
            quant: None,
            raw_quant: Default::default(),
        }
    }

    /// One graph of one layer: AR tokens, context CL, 2 K/V heads of dim 8, vocab 32.
    fn graph(name: &str, ar: u32, cl: u32) -> GraphDesc {
        let f = qnn_sys::dtype::FLOAT_32;
        let past = cl - ar;
        GraphDesc {
            name: name.into(),
            inputs: vec![
                t("input_ids", qnn_sys::dtype::INT_32, &[1, ar]),
                t("attention_mask", f, &[1, 1, ar, cl]),
                t("position_ids_cos", f, &[1, 1, ar, 4]),
                t("position_ids_sin", f, &[1, 1, ar, 4]),
                t("past_key_0_in", f, &[2, 1, 8, past]),
                t("past_value_0_in", f, &[2, 1, past, 8]),
            ],
            outputs: vec![
                t("logits", f, &[1, 1, ar, 32]),
                t("past_key_0_out", f, &[2, 1, 8, ar]),
                t("past_value_0_out", f, &[2, 1, ar, 8]),
            ],
            tensor_version: 1,
            weights: None,
        }
    }

    fn config(kv_dim: usize) -> Resolved {
        let v = serde_json::json!({"dialog": {"version": 1, "type": "basic",
            "context": {"version": 1, "size": 64, "n-vocab": 32, "bos-token": 1, "eos-token": 2},
            "tokenizer": {"version": 1, "path": "tokenizer.json"},
            "engine": {"version": 1, "n-threads": 1,
                "backend": {"version": 1, "type": "QnnHtp", "QnnHtp": {"version": 1, "kv-dim": kv_dim}},
                "model": {"version": 1, "type": "binary",
                    "binary": {"version": 1, "ctx-bins": ["a.bin"]}}}}});
        GenieConfig::resolve(
            v.to_string().as_bytes(),
            Path::new("/b/g.json"),
            Path::new("/b"),
        )
        .unwrap()
    }

    #[test]
    fn graph_metadata_is_checked_without_qnn_handles() {
        let p = Path::new("/b/g.json");
        let graphs = vec![graph("ar1_cl64", 1, 64), graph("ar16_cl64", 16, 64)];
        let l = check_graphs(&config(8), p, graphs.clone(), 30).unwrap();
        assert_eq!(
            l,
            Layout {
                n_kv: 2,
                head_dim: 8,
                vocab: 32
            }
        );
        let e = check_graphs(&config(16), p, graphs.clone(), 30).unwrap_err();
        assert!(e.to_string().contains("kv-dim 16"), "{e}");
        let e = check_graphs(&config(8), p, graphs, 33).unwrap_err();
        assert!(e.to_string().contains("33 tokens"), "{e}");
    }

    /// Context binaries without a single graph: an error naming the config, not an index
    /// out of bounds (`load` indexed the first variant unchecked).
    #[test]
    fn no_graph_at_all_is_an_error() {
        let e = check_graphs(&config(8), Path::new("/b/g.json"), Vec::new(), 30).unwrap_err();
        assert!(e.to_string().contains("no graph"), "{e}");
    }

    /// A layer whose K/V input and output sit in different splits: a load error naming both
    /// graphs (the runner copies K/V within one split and panicked on such a bundle).
    #[test]
    fn kv_in_and_out_in_different_splits_is_a_load_error() {
        let f = qnn_sys::dtype::FLOAT_32;
        let mut a = graph("ar4_cl64_1_of_2", 4, 64);
        let k_out = a.outputs.remove(1);
        a.outputs.push(t("hidden", f, &[1, 1, 4, 16]));
        let b = GraphDesc {
            name: "ar4_cl64_2_of_2".into(),
            inputs: vec![
                t("attention_mask", f, &[1, 1, 4, 64]),
                t("hidden", f, &[1, 1, 4, 16]),
            ],
            outputs: vec![k_out],
            tensor_version: 1,
            weights: None,
        };
        let e = check_graphs(&config(8), Path::new("/b/g.json"), vec![a, b], 30).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("past_key_0_out"), "{msg}");
        assert!(msg.contains("ar4_cl64_2_of_2"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }

    #[test]
    fn kv_names_follow_genie() {
        use crate::plan::genie::kv_name;
        assert_eq!(kv_name("past_key_12_in", true), Some((true, 12)));
        assert_eq!(kv_name("past_value_0_out", false), Some((false, 0)));
        assert_eq!(kv_name("layers_3_past_value_in", true), Some((false, 3)));
        assert_eq!(kv_name("past_key_in", true), None);
        assert_eq!(kv_name("hidden_3_in", true), None);
        assert_eq!(kv_name("past_key_1_in", false), None);
    }
}
