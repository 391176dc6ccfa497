//! The fuzz targets' bodies, shared by the libFuzzer entry points in `fuzz_targets/`.
//! Each must return normally for every input: an `Err` is fine, a panic, abort, hang or
//! memory error is a finding.
//!
//! The targets that need the QNN ABI load the emulator cdylib named by `QHX_FUZZ_EMU`
//! (scripts/fuzz.sh points it at `target/release/libqnn_emu.so`).

use qhx::engine::{Engine, GenConfig, Next};
use qhx::manifest::{EmbedDtype, Manifest};
use qhx::model::{LoadOptions, Model};
use qhx::ops::convert::TypedMut;
use qhx::ops::embed::EmbedTable;
use qhx::qnn::{self, SystemLibrary};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

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
fn prompt_model() -> &'static Model {
    thread_local! {
        static M: &'static Model = Box::leak(Box::new(load_prompt_model()));
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
    Model::load(manifest, &lib, &lib, &LoadOptions::default()).expect("load model")
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
        .encode(&text, model.manifest.params.bos_token_id)
    else {
        return;
    };
    // One engine per thread, reset per input (as an interactive session does); fresh
    // engines are covered by the RSS test.
    thread_local! {
        static ENGINE: std::cell::RefCell<Option<Engine<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    ENGINE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let engine = slot.get_or_insert_with(|| Engine::new(model).expect("bind the fuzz bundle"));
        engine.reset();
        run_prompt(model, engine, &ids, n);
    });
}

fn run_prompt(model: &Model, engine: &mut Engine<'_>, ids: &[u32], n: usize) {
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
