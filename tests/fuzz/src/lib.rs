//! The fuzz targets' bodies, shared by the libFuzzer entry points in `fuzz_targets/`.
//! Each must return normally for every input: an `Err` is fine, a panic, abort, hang or
//! memory error is a finding.
//!
//! The targets that need the QNN ABI load the emulator cdylib named by `QHX_FUZZ_EMU`
//! (scripts/fuzz.sh points it at `target/release/libqnn_emu.so`).

use qhx::engine::{Engine, GenConfig, Next};
use qhx::bundle::manifest::{EmbedDtype, Manifest};
use qhx::load::{LoadOptions, Model};
use qhx::ops::convert::TypedMut;
use qhx::ops::embed::EmbedTable;
use qhx::qnn::{self, SystemLibrary};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

fn emu_lib() -> PathBuf {
    PathBuf::from(
        std::env::var("QHX_FUZZ_EMU")
            .expect("set QHX_FUZZ_EMU to the emulator cdylib (scripts/fuzz.sh does)"),
    )
}

/// A scratch directory private to this process.
pub fn scratch() -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        // tmpfs when there is one: the embed target writes a file per execution.
        let base = Some(PathBuf::from("/dev/shm"))
            .filter(|p| p.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let d = base.join(format!("qhx-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("scratch dir");
        d
    })
}

/// Manifest parsing and validation from arbitrary bytes.
pub fn manifest(data: &[u8]) {
    let root = scratch();
    if let Ok(m) = Manifest::parse(data, Path::new("fuzz.json"), root) {
        // Derived values must not panic either.
        let _ = m.kv_dim();
        let _ = m.eos.len();
    }
}

/// The emulator's context-binary parser and weight loader.
pub fn emu_format(data: &[u8]) {
    if let Ok(p) = qnn_emu::format::parse(data) {
        let _ = qnn_emu::model::Weights::load(&p);
    }
}

/// Binary-info handling: libQnnSystem (the emulator's) reads arbitrary bytes, then qhx
/// deep-copies what it returns.
pub fn binary_info(data: &[u8]) {
    static SYS: OnceLock<SystemLibrary> = OnceLock::new();
    let sys = SYS.get_or_init(|| SystemLibrary::load(&emu_lib()).expect("load emulator"));
    if let Ok(info) = qnn::read_binary_info_with(sys, data, Path::new("fuzz.bin")) {
        for g in &info.graphs {
            for t in g.inputs.iter().chain(&g.outputs) {
                let _ = (t.describe(), t.bytes());
            }
        }
    }
}

/// The embedding-table loader: the first 9 bytes pick dtype, vocab and hidden, the rest
/// is the table file; then rows are read for a few token ids.
pub fn embed(data: &[u8]) {
    if data.len() < 9 {
        return;
    }
    let dtype = if data[0] & 1 == 0 {
        EmbedDtype::F16
    } else {
        EmbedDtype::F32
    };
    let vocab = u32::from_le_bytes(data[1..5].try_into().unwrap()) as usize;
    let hidden = u32::from_le_bytes(data[5..9].try_into().unwrap()) as usize;
    let body = &data[9..];
    let path = scratch().join("embed.bin");
    if std::fs::write(&path, body).is_err() {
        return;
    }
    let Ok(t) = EmbedTable::open(&path, dtype, vocab, hidden) else {
        return;
    };
    // A valid table with a huge hidden size can only be empty (vocab 0); the row buffers
    // below would then be the harness's allocation, not the loader's.
    if hidden > 1 << 16 {
        return;
    }
    let mut f32_row = vec![0f32; hidden];
    let mut f16_row = vec![half::f16::ZERO; hidden];
    for tok in [
        0u32,
        1,
        (vocab as u32).wrapping_sub(1),
        vocab as u32,
        u32::MAX,
    ] {
        let _ = t.write_row(tok, &mut TypedMut::F32(&mut f32_row), 0);
        let _ = t.write_row(tok, &mut TypedMut::F16(&mut f16_row), 0);
    }
}

/// The model of the prompt target, loaded once per thread (libFuzzer runs one) and kept
/// for the process lifetime. `Model` holds QNN handles and is not `Sync`.
fn prompt_model() -> &'static Arc<Model> {
    thread_local! {
        static M: &'static Arc<Model> = Box::leak(Box::new(Arc::new(load_prompt_model())));
    }
    M.with(|m| *m)
}

fn load_prompt_model() -> Model {
    let dir = scratch().join("bundle");
    std::fs::create_dir_all(&dir).unwrap();
    let spec = qnn_emu::writer::SynthSpec {
        null_compute: true,
        ..Default::default()
    };
    let m = qnn_emu::writer::write_bundle(&dir, &spec).expect("write bundle");
    let manifest = Manifest::load(&m, &dir).expect("manifest");
    let lib = emu_lib();
    qhx::load::manifest::load(manifest, &lib, &lib, &LoadOptions::default()).expect("load model")
}

/// The prompt path: bytes (lossily as text) through the tokenizer and the token loop with
/// the null-compute emulator, then streaming and one-shot detokenization.
pub fn prompt(data: &[u8]) {
    let model = prompt_model();
    let (n, text) = match data.split_first() {
        Some((&n, rest)) => ((n % 4) as usize + 1, String::from_utf8_lossy(rest)),
        None => (1, String::from_utf8_lossy(data)),
    };
    let Ok(ids) = model
        .tokenizer
        .encode(&text, model.bos)
    else {
        return;
    };
    // One engine per thread, reset per input (as an interactive session does); fresh
    // engines are covered by the RSS test.
    thread_local! {
        static ENGINE: std::cell::RefCell<Option<Engine>> =
            const { std::cell::RefCell::new(None) };
    }
    ENGINE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let engine = slot.get_or_insert_with(|| Engine::new(model).expect("bind the fuzz bundle"));
        engine.reset();
        run_prompt(model, engine, &ids, n);
    });
}

fn run_prompt(model: &Model, engine: &mut Engine, ids: &[u32], n: usize) {
    let cfg = GenConfig {
        allow_nonfinite: true,
        ..GenConfig::greedy(n)
    };
    let mut stream = model.tokenizer.stream();
    let mut streamed = String::new();
    if let Ok(out) = engine.generate(ids, &cfg, 0.0, |t| {
        if let Some(p) = stream.step(t)? {
            streamed.push_str(&p);
        }
        Ok(Next::Continue)
    }) {
        let _ = model.tokenizer.decode(&out.output_ids);
    }
    // Round trip of the prompt's own ids through the streaming decoder.
    let mut s = model.tokenizer.stream();
    for &t in ids {
        let _ = s.step(t);
    }
}

/// The shape of synthetic Genie graph metadata, from 8 header bytes (see [`genie_config`]).
#[derive(Debug, Clone, Copy)]
pub struct GenieShape {
    pub layers: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub cl: usize,
    /// The prompt variant's tokens per step (0: only the AR-1 variant).
    pub ar_big: usize,
    pub splits: usize,
}

impl GenieShape {
    pub fn from_header(h: &[u8; 8]) -> GenieShape {
        let cl = [16, 32, 64, 128][h[4] as usize % 4];
        GenieShape {
            layers: 1 + h[0] as usize % 3,
            n_kv: 1 + h[1] as usize % 4,
            head_dim: [4, 8, 16, 64][h[2] as usize % 4],
            vocab: 16 + h[3] as usize,
            cl,
            ar_big: [0, 4, 8, 16][(h[5] >> 2) as usize % 4].min(cl - 1),
            splits: 1 + h[5] as usize % 3,
        }
    }
}

fn tensor(name: String, dtype: u32, dims: &[usize]) -> qnn::TensorDesc {
    qnn::TensorDesc {
        id: 0,
        name,
        tensor_type: 0,
        dtype,
        dims: dims.iter().map(|&d| d as u32).collect(),
        quant: None,
        raw_quant: Default::default(),
    }
}

/// Graph metadata as AI Hub's Genie bundles declare it: one variant per AR (AR-1 and
/// optionally a prompt variant), each cut into `splits` graphs that pass a hidden state
/// along; layers spread over the splits; the last split has the logits.
pub fn genie_graphs(s: &GenieShape) -> Vec<qnn::GraphDesc> {
    use qnn_sys::dtype::{FLOAT_32, INT_32};
    let mut out = Vec::new();
    let ars: Vec<usize> = [1, s.ar_big].into_iter().filter(|&a| a > 0).collect();
    for ar in ars {
        let past = s.cl - ar;
        for k in 0..s.splits {
            let mut ins = Vec::new();
            let mut outs = Vec::new();
            if k == 0 {
                ins.push(tensor("input_ids".into(), INT_32, &[1, ar]));
            } else {
                ins.push(tensor(format!("hidden_{k}"), FLOAT_32, &[1, ar, 8]));
            }
            ins.push(tensor("attention_mask".into(), FLOAT_32, &[1, 1, ar, s.cl]));
            for n in ["position_ids_cos", "position_ids_sin"] {
                ins.push(tensor(n.into(), FLOAT_32, &[1, 1, ar, s.head_dim / 2]));
            }
            for l in (0..s.layers).filter(|l| l % s.splits == k) {
                let (kv, hd) = (s.n_kv, s.head_dim);
                ins.push(tensor(
                    format!("past_key_{l}_in"),
                    FLOAT_32,
                    &[kv, 1, hd, past],
                ));
                ins.push(tensor(
                    format!("past_value_{l}_in"),
                    FLOAT_32,
                    &[kv, 1, past, hd],
                ));
                outs.push(tensor(
                    format!("past_key_{l}_out"),
                    FLOAT_32,
                    &[kv, 1, hd, ar],
                ));
                outs.push(tensor(
                    format!("past_value_{l}_out"),
                    FLOAT_32,
                    &[kv, 1, ar, hd],
                ));
            }
            if k + 1 == s.splits {
                outs.push(tensor("logits".into(), FLOAT_32, &[1, 1, ar, s.vocab]));
            } else {
                outs.push(tensor(format!("hidden_{}", k + 1), FLOAT_32, &[1, ar, 8]));
            }
            out.push(qnn::GraphDesc {
                name: format!("ar{ar}_cl{}_{}_of_{}", s.cl, k + 1, s.splits),
                inputs: ins,
                outputs: outs,
                tensor_version: 1,
            weights: None,
        });
        }
    }
    out
}

/// Change one thing in the graph metadata, picked by `kind` and `at`: a dim, a name, a
/// dtype, a tensor or graph dropped, or all graphs gone.
fn perturb(graphs: &mut Vec<qnn::GraphDesc>, kind: u8, at: u8) {
    let n_t: usize = graphs
        .iter()
        .map(|g| g.inputs.len() + g.outputs.len())
        .sum();
    if graphs.is_empty() || n_t == 0 {
        return;
    }
    let mut i = at as usize % n_t;
    let mut pick = None;
    for (gi, g) in graphs.iter().enumerate() {
        let len = g.inputs.len() + g.outputs.len();
        if i < len {
            pick = Some((gi, i));
            break;
        }
        i -= len;
    }
    let Some((gi, ti)) = pick else { return };
    let g = &mut graphs[gi];
    let n_in = g.inputs.len();
    let list = if ti < n_in {
        &mut g.inputs
    } else {
        &mut g.outputs
    };
    let ti = if ti < n_in { ti } else { ti - n_in };
    match kind % 8 {
        0 => {
            if let Some(d) = list[ti].dims.last_mut() {
                *d = d.wrapping_add(1);
            }
        }
        1 => {
            if let Some(d) = list[ti].dims.first_mut() {
                *d = 0;
            }
        }
        2 => list[ti].name.push('x'),
        3 => list[ti].dtype = qnn_sys::dtype::FLOAT_16,
        4 => {
            list.remove(ti);
        }
        5 => list[ti].dims.clear(),
        6 => {
            graphs.remove(gi);
        }
        _ => graphs.clear(),
    }
}

/// `genie_config.json`: the first 8 bytes shape synthetic graph metadata (layers, heads,
/// head dim, vocabulary, context, variants, splits, and one optional perturbation), the
/// rest is the config text. The config is parsed and resolved, then checked against the
/// graphs as `qhx::load::genie::load` checks a bundle. Unperturbed graphs with a config whose
/// `kv-dim` (if any) matches must pass, with the shape's layout.
pub fn genie_config(data: &[u8]) {
    use qhx::bundle::genie::{looks_like_genie, GenieConfig};
    use qhx::load::genie::{check_graphs, Layout};
    let Some((h, text)) = data.split_first_chunk::<8>() else {
        return;
    };
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(text) {
        let _ = looks_like_genie(&v);
    }
    let path = Path::new("genie_config.json");
    let Ok(cfg) = GenieConfig::resolve(text, path, scratch()) else {
        return;
    };
    // Derived values must not panic either.
    let _ = (cfg.eos.len(), cfg.stop.len(), cfg.ctx_bins.len());
    if let Some(s) = &cfg.sampling {
        let _ = s.config.is_greedy();
    }
    let shape = GenieShape::from_header(h);
    let mut graphs = genie_graphs(&shape);
    let perturbed = h[6] >= 128;
    if perturbed {
        perturb(&mut graphs, h[6], h[7]);
    }
    let tok_vocab = shape.vocab - (h[7] % 3) as usize;
    let r = check_graphs(&cfg, path, graphs, tok_vocab);
    if !perturbed && cfg.kv_dim.is_none_or(|k| k == shape.head_dim) {
        let want = Layout {
            n_kv: shape.n_kv,
            head_dim: shape.head_dim,
            vocab: shape.vocab,
        };
        match r {
            Ok(l) => assert_eq!(l, want, "{shape:?}"),
            Err(e) => panic!("well-formed graphs {shape:?} refused: {e}"),
        }
    }
}

/// qhx_server's request reader: the first byte picks the endpoint, the rest is the body.
/// Whatever arrives is a checked request or a 4xx error naming what is wrong, never a panic.
pub fn server_request(data: &[u8]) {
    use qhx_server::api::{parse, Defaults, Endpoint};
    let (ep, body) = match data.split_first() {
        Some((b, rest)) if b % 2 == 1 => (Endpoint::Completions, rest),
        Some((_, rest)) => (Endpoint::Chat, rest),
        None => (Endpoint::Chat, data),
    };
    let d = Defaults {
        sampler: Default::default(),
        completion_max_tokens: 16,
        spec: None,
    };
    match parse(ep, body, &d) {
        Ok(w) => {
            if let qhx::session::Prompt::Chat(c) = &w.prompt {
                assert!(!c.messages.is_empty(), "a chat request without messages was accepted");
            }
            assert!(w.stops.len() <= 4 && w.stops.iter().all(|s| !s.is_empty()));
            assert!(w.max_tokens != Some(0));
        }
        Err(e) => {
            assert!(e.status.is_client_error(), "{e}");
            assert!(!e.message.is_empty());
        }
    }
}
