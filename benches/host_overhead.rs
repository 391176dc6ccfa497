//! Host overhead per decode step, through the real C ABI with the emulator in null-compute
//! mode (graphExecute validates its arguments and returns at once), so everything timed is
//! qhx's own host work. Run by `scripts/host-overhead.sh [--json]`:
//!
//!     cargo bench --bench host_overhead -- [--json] [--steps N] [--dir DIR]
//!
//! Shapes: DeepSeek-1.5B-like and Llama-1B-like (qnn_emu::writer::preset), f16 and
//! ufixed16 I/O, C in {512, 1024, 4096}, greedy and top-k 40 / top-p 0.95 / temp 0.8.
//! Each component is the minimum over 7 runs of the per-step mean (after one warm-up run).
//! `--shape tiny` (a small preset) is a smoke test of the harness itself.
//!
//! Like `qhx_generate`, this keeps fd 1 to itself (`qhx::os::stdio`): the emulator, as the
//! real backend, prints a banner on stdout, which must not follow the `--json` document.

use qhx::bundle::manifest::Manifest;
use qhx::engine::{Engine, GenConfig, Next};
use qhx::load::{LoadOptions, Model};
use qhx::sampler::SamplerConfig;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

const SHAPES: [&str; 3] = ["deepseek-1.5b", "llama-1b", "gemma3-270m"];
/// What `--shape` accepts: the reference shapes, and `tiny` for smoke tests.
const ALL_SHAPES: [&str; 4] = ["deepseek-1.5b", "llama-1b", "gemma3-270m", "tiny"];
const IOS: [&str; 2] = ["f16", "ufixed16"];
const CTXS: [usize; 3] = [512, 1024, 4096];

fn emu_lib() -> PathBuf {
    if let Some(p) = std::env::var_os("QHX_EMU_LIB") {
        return PathBuf::from(p);
    }
    // target/release/deps/host_overhead-* -> target/release/libqnn_emu.so
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    dir.join("libqnn_emu.so")
}

struct Row {
    shape: &'static str,
    io: &'static str,
    ctx: usize,
    sampler: &'static str,
    comps: Vec<(&'static str, f64)>,
    total: f64,
    execute_ms: f64,
    step_bytes: usize,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// Cold start without context creation: manifest, tokenizer, embedding mmap, binary info.
fn cold_start(manifest: &Path, root: &Path, lib: &Path) -> Vec<(&'static str, f64)> {
    let t = Instant::now();
    let m = Manifest::load(manifest, root).expect("manifest");
    let t_manifest = ms(t);
    let t = Instant::now();
    let tok = qhx::tokenizer::Tokenizer::load(&m.tokenizer).expect("tokenizer");
    let t_tok = ms(t);
    assert_eq!(tok.vocab_size(), m.params.vocab);
    let t = Instant::now();
    let emb =
        qhx::ops::embed::EmbedTable::open(&m.embed, m.embed_dtype, m.params.vocab, m.params.hidden)
            .expect("embed");
    let t_embed = ms(t);
    let t = Instant::now();
    let rt = qhx::qnn::Runtime::new(lib, lib, 0).expect("runtime");
    let t_rt = ms(t);
    let t = Instant::now();
    let mut bins: Vec<&PathBuf> = vec![&m.decode.bin, &m.lmhead.bin];
    if let Some(p) = &m.prefill {
        bins.push(&p.bin);
    }
    for b in bins {
        let f = std::fs::File::open(b).expect("bin");
        let map = qhx::os::map_file(&f, b).expect("map");
        let info = qhx::qnn::read_binary_info(&rt, &map, b).expect("binary info");
        assert!(!info.graphs.is_empty());
    }
    let t_info = ms(t);
    drop(emb);
    vec![
        ("manifest", t_manifest),
        ("tokenizer", t_tok),
        ("embed_mmap", t_embed),
        ("binary_info", t_info),
        ("runtime_dlopen", t_rt),
    ]
}

fn measure(
    model: &std::sync::Arc<Model>,
    sampling: SamplerConfig,
    steps: usize,
) -> (Vec<(&'static str, f64)>, f64, usize) {
    let mut engine = Engine::new(model).expect("bind");
    let n = steps.min(model.max_ctx - 2);
    let cfg = GenConfig {
        sampler: SamplerConfig {
            seed: Some(42),
            ..sampling
        },
        ignore_eos: true,
        ..GenConfig::greedy(n)
    };
    let ids = [1u32];
    // One warm-up run (page faults in fresh buffers), then ROUNDS measured runs; each
    // component reports its minimum over the rounds: the host work itself, with as little
    // interference from other processes on a shared machine as the rounds allow.
    const ROUNDS: usize = 7;
    let mut per_round: Vec<(Vec<(&'static str, f64)>, f64)> = Vec::new();
    let mut bytes = 0;
    for round in 0..=ROUNDS {
        engine.reset();
        engine.profile = Some(Default::default());
        let mut stream = model.tokenizer.stream();
        let mut detok_ns = 0u64;
        engine
            .generate(&ids, &cfg, 0.0, |t| {
                let t0 = Instant::now();
                let piece = stream.step(t)?;
                std::hint::black_box(piece);
                detok_ns += t0.elapsed().as_nanos() as u64;
                Ok(Next::Continue)
            })
            .expect("generate");
        let p = engine.profile.take().expect("profile");
        if round == 0 {
            continue;
        }
        let mut comps = p.components_ms();
        // generate() calls on_token once per sampled token: steps + 1 times.
        comps.push(("detokenize", detok_ns as f64 / (p.steps + 1) as f64 / 1e6));
        let exec = p.execute_ns as f64 / p.steps.max(1) as f64 / 1e6;
        per_round.push((comps, exec));
        bytes = engine.decode_bytes_formula;
    }
    let min_of = |v: Vec<f64>| v.into_iter().fold(f64::INFINITY, f64::min);
    let names: Vec<&'static str> = per_round[0].0.iter().map(|c| c.0).collect();
    let comps = names
        .iter()
        .enumerate()
        .map(|(i, n)| (*n, min_of(per_round.iter().map(|r| r.0[i].1).collect())))
        .collect();
    let exec = min_of(per_round.iter().map(|r| r.1).collect());
    (comps, exec, bytes)
}

/// The schema whose mask the grammar row measures: nested objects, arrays, enums, numbers.
const MASK_SCHEMA: &str = r#"{"type": "object", "properties": {
  "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
  "tags": {"type": "array", "items": {"type": "string"}},
  "address": {"type": "object", "properties": {"city": {"type": "string"},
    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city"]},
  "role": {"enum": ["admin", "user", "guest"]}, "score": {"type": "number"}},
  "required": ["name", "age", "tags", "address", "role"]}"#;

/// The structured-output work per token at vocabulary size `vocab`: computing the next mask
/// after a token (llguidance) plus hiding the disallowed logits. Tokens are the masked
/// argmax of pseudo-random logits; a finished document starts a new one (not timed).
/// Returns per-token milliseconds, sorted.
fn grammar_mask(tokenizer: &Path, vocab: usize, steps: usize) -> Vec<f64> {
    use qhx::grammar::{Constraint, Spec, Vocab};
    let tok = qhx::tokenizer::Tokenizer::load(tokenizer).expect("mask tokenizer");
    let eos = tok
        .encode_raw("<｜end▁of▁sentence｜>")
        .ok()
        .filter(|v| v.len() == 1)
        .map_or(tok.vocab_size() as u32 - 1, |v| v[0]);
    let v = Vocab::load(tokenizer, vocab, eos).expect("grammar vocabulary");
    let spec = Spec::JsonSchema(serde_json::from_str(MASK_SCHEMA).expect("schema"));
    let mut c = Constraint::new(&v, &spec).expect("constraint");
    let mut logits = vec![0f32; vocab];
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut times = Vec::with_capacity(steps);
    let mut apply_ms = Vec::with_capacity(steps);
    // The first mask comes with the constraint; each step then applies the current mask
    // and computes the next (commit), as the token loop does.
    while times.len() < steps {
        for l in logits.iter_mut() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *l = (seed >> 40) as f32 / (1u64 << 24) as f32;
        }
        let t = Instant::now();
        c.apply(&mut logits).expect("apply");
        let hide = t.elapsed().as_secs_f64() * 1e3;
        // The pick is the sampler's work, not the grammar's: not timed.
        let pick = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .expect("logits");
        if pick == eos || c.is_done() {
            c = Constraint::new(&v, &spec).expect("constraint");
            continue;
        }
        let t = Instant::now();
        c.commit(pick).expect("commit");
        times.push(hide + t.elapsed().as_secs_f64() * 1e3);
        apply_ms.push(hide);
    }
    times.sort_by(f64::total_cmp);
    apply_ms.sort_by(f64::total_cmp);
    eprintln!(
        "host-overhead: grammar mask: hiding logits p50 {:.3} ms of the per-token total",
        percentile(&apply_ms, 0.5)
    );
    times
}

/// The host work speculation adds per accepted token at vocabulary size `vocab`: the
/// prompt-lookup draft search over a history of up to 4,096 tokens, then the greedy pick
/// of every verify row (argmax over `vocab` f32 logits) checked against the draft. Every
/// draft is accepted (the most rows per verify); the history repeats 64-token segments
/// so that every search finds a 4-gram. Reading a row of graph output into f32 is the
/// plain step's "lm-head output read" and is not counted again. Returns per-token
/// milliseconds, sorted.
fn spec_host(vocab: usize, verifies: usize) -> Vec<f64> {
    let cfg = qhx::speculative::SpecConfig::lookup();
    let k = cfg.draft_max;
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let segment: Vec<u32> = (0..64).map(|_| (next() % vocab as u64) as u32).collect();
    let mut hist: Vec<u32> = segment.iter().copied().cycle().take(2048).collect();
    let rows: Vec<Vec<f32>> = (0..=k)
        .map(|_| {
            (0..vocab)
                .map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32)
                .collect()
        })
        .collect();
    let mut times = Vec::with_capacity(verifies);
    while times.len() < verifies {
        let t = Instant::now();
        let d = qhx::speculative::lookup(&hist, &cfg, k);
        let mut kept = 0;
        for (j, row) in rows.iter().enumerate().take(d.len() + 1) {
            let pick = qhx::sampler::argmax_checked(row).expect("finite logits");
            // Greedy acceptance: the pick against the draft (the draft wins here, as if it
            // matched, so every row is read).
            let tok = d.get(j).copied().unwrap_or(pick);
            std::hint::black_box(pick == tok);
            hist.push(tok);
            kept += 1;
        }
        times.push(t.elapsed().as_secs_f64() * 1e3 / kept as f64);
        if hist.len() > 4096 {
            hist.drain(..2048);
        }
    }
    times.sort_by(f64::total_cmp);
    times
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub fn main() {
    run(std::env::args().skip(1).collect());
}

/// The harness with its arguments (also run by tests/host_overhead.rs in a child process).
pub fn run(args: Vec<String>) {
    // Before any QNN library is loaded: what a library prints must not reach our stdout.
    if let Err(e) = qhx::os::stdio::isolate_stdout(false) {
        eprintln!(
            "host-overhead: warning: cannot keep stdout private ({e}); library output may mix in"
        );
    }
    let json_out = args.iter().any(|a| a == "--json");
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let steps: usize = flag("--steps").and_then(|v| v.parse().ok()).unwrap_or(256);
    let only_shape = flag("--shape");
    // The grammar row needs a real tokenizer (its tokens' bytes build llguidance's trie).
    let mask_tok = flag("--mask-tokenizer").map(PathBuf::from);
    let mask_vocab: usize = flag("--mask-vocab")
        .and_then(|v| v.parse().ok())
        .unwrap_or(151_936);
    let dir = flag("--dir").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bundles/host-overhead")
    });
    let lib = emu_lib();
    assert!(
        lib.is_file(),
        "{} missing: cargo build --release -p qnn-emu",
        lib.display()
    );
    // Null compute for every binary; noise logits so sampling sees a realistic spread.
    std::env::set_var("QNN_EMU_NULL_COMPUTE", "1");
    std::env::set_var("QNN_EMU_NULL_LOGITS", "noise");
    let samplers = [
        ("greedy", SamplerConfig::default()),
        (
            "topk-topp",
            SamplerConfig {
                temp: 0.8,
                top_k: 40,
                top_p: 0.95,
                ..Default::default()
            },
        ),
    ];
    let mut rows = Vec::new();
    let mut colds = Vec::new();
    let shapes: Vec<&'static str> = match only_shape.as_deref() {
        Some(s) => {
            let known = ALL_SHAPES.iter().find(|k| **k == s);
            vec![*known.unwrap_or_else(|| panic!("unknown --shape {s:?} ({ALL_SHAPES:?})"))]
        }
        None => SHAPES.to_vec(),
    };
    for &shape in &shapes {
        let sdir = dir.join(shape);
        for io in IOS {
            for ctx in CTXS {
                let spec = qnn_emu::writer::preset(shape, io, ctx).expect("preset");
                let t = Instant::now();
                let manifest = qnn_emu::writer::write_bundle(&sdir, &spec).expect("write bundle");
                eprintln!(
                    "host-overhead: {shape} {io} C={ctx}: bundle ready in {:.0} ms",
                    ms(t)
                );
                if io == "f16" && ctx == 1024 {
                    // Twice: the first run warms the page cache, the second is reported.
                    let _ = cold_start(&manifest, &sdir, &lib);
                    colds.push((shape, cold_start(&manifest, &sdir, &lib)));
                }
                let m = Manifest::load(&manifest, &sdir).expect("manifest");
                let model = std::sync::Arc::new(
                    qhx::load::manifest::load(m, &lib, &lib, &LoadOptions::default())
                        .expect("load"),
                );
                for (sname, sp) in &samplers {
                    let sname = *sname;
                    let (comps, exec, bytes) = measure(&model, sp.clone(), steps);
                    let total = comps.iter().map(|c| c.1).sum();
                    rows.push(Row {
                        shape,
                        io,
                        ctx,
                        sampler: sname,
                        comps,
                        total,
                        execute_ms: exec,
                        step_bytes: bytes,
                    });
                }
            }
        }
    }
    let mask = mask_tok.map(|t| {
        let n = steps.max(64);
        eprintln!("host-overhead: grammar mask at V={mask_vocab} ({n} tokens)");
        (mask_vocab, grammar_mask(&t, mask_vocab, n))
    });
    let spec = {
        let n = steps.max(64);
        eprintln!("host-overhead: speculation at V={mask_vocab} ({n} verifies of 8 rows)");
        (mask_vocab, spec_host(mask_vocab, n))
    };
    let mut out = qhx::os::stdio::stdout();
    report(
        &mut out,
        json_out,
        &shapes,
        &rows,
        &colds,
        mask.as_ref(),
        &spec,
    )
    .expect("writing the report");
}

/// The per-token goal of the grammar row (p99 mask work, issue 19) and of the speculation
/// row (p99 draft search and acceptance per accepted token, issue 18).
const MASK_GOAL_MS: f64 = 0.3;

type Cold = (&'static str, Vec<(&'static str, f64)>);

fn report(
    out: &mut impl Write,
    json_out: bool,
    shapes: &[&'static str],
    rows: &[Row],
    colds: &[Cold],
    mask: Option<&(usize, Vec<f64>)>,
    spec: &(usize, Vec<f64>),
) -> std::io::Result<()> {
    let stats = |(v, t): &(usize, Vec<f64>)| {
        let mean = t.iter().sum::<f64>() / t.len() as f64;
        (*v, t.len(), percentile(t, 0.5), percentile(t, 0.99), mean)
    };
    let mask_stats = mask.map(stats);
    let (sv, sn, s50, s99, smean) = stats(spec);
    if json_out {
        let mut arr = Vec::new();
        for r in rows {
            let comps: serde_json::Map<String, serde_json::Value> = r
                .comps
                .iter()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect();
            arr.push(
                json!({"shape": r.shape, "io": r.io, "ctx": r.ctx, "sampler": r.sampler,
                "total_ms_per_step": r.total, "components": comps,
                "emulator_execute_ms": r.execute_ms, "host_bytes_per_step": r.step_bytes}),
            );
        }
        for (shape, c) in colds {
            let total: f64 = c
                .iter()
                .filter(|x| x.0 != "runtime_dlopen")
                .map(|x| x.1)
                .sum();
            let comps: serde_json::Map<String, serde_json::Value> =
                c.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
            arr.push(json!({"shape": shape, "cold_start_ms": total, "components": comps}));
        }
        if let Some((v, n, p50, p99, mean)) = mask_stats {
            arr.push(
                json!({"grammar_mask": {"vocab": v, "tokens": n, "p50_ms": p50,
                "p99_ms": p99, "mean_ms": mean, "goal_p99_ms": MASK_GOAL_MS,
                "meets_goal": p99 <= MASK_GOAL_MS}}),
            );
        }
        arr.push(
            json!({"speculation": {"vocab": sv, "verifies": sn, "rows_per_verify": 8,
            "p50_ms_per_token": s50, "p99_ms_per_token": s99, "mean_ms_per_token": smean,
            "goal_p99_ms": MASK_GOAL_MS, "meets_goal": s99 <= MASK_GOAL_MS}}),
        );
        writeln!(out, "{}", serde_json::Value::Array(arr))?;
        return out.flush();
    }
    let names: Vec<&str> = rows
        .first()
        .map(|r| r.comps.iter().map(|c| c.0).collect())
        .unwrap_or_default();
    write!(
        out,
        "{:<14} {:<9} {:>5} {:<10}",
        "shape", "io", "C", "sampler"
    )?;
    for n in &names {
        write!(out, " {:>11}", n)?;
    }
    writeln!(out, " {:>9} {:>9} {:>8}", "total_ms", "exec_ms*", "bytes")?;
    for r in rows {
        write!(
            out,
            "{:<14} {:<9} {:>5} {:<10}",
            r.shape, r.io, r.ctx, r.sampler
        )?;
        for c in &r.comps {
            write!(out, " {:>11.4}", c.1)?;
        }
        writeln!(
            out,
            " {:>9.4} {:>9.3} {:>8}",
            r.total, r.execute_ms, r.step_bytes
        )?;
    }
    writeln!(
        out,
        "(* exec_ms: the emulator's graphExecute, not host overhead; excluded from total)"
    )?;
    for &shape in shapes {
        for io in IOS {
            for s in ["greedy", "topk-topp"] {
                let t = |c| {
                    rows.iter()
                        .find(|r| r.shape == shape && r.io == io && r.sampler == s && r.ctx == c)
                        .map(|r| r.total)
                };
                if let (Some(a), Some(b)) = (t(512), t(4096)) {
                    writeln!(
                        out,
                        "ratio total(C=4096)/total(C=512) {shape} {io} {s}: {:.3}",
                        b / a
                    )?;
                }
            }
        }
    }
    for (shape, c) in colds {
        let total: f64 = c
            .iter()
            .filter(|x| x.0 != "runtime_dlopen")
            .map(|x| x.1)
            .sum();
        let parts: Vec<String> = c.iter().map(|(k, v)| format!("{k} {v:.1}")).collect();
        writeln!(
            out,
            "cold start {shape}: {total:.1} ms ({})",
            parts.join(", ")
        )?;
    }
    match mask_stats {
        Some((v, n, p50, p99, mean)) => writeln!(
            out,
            "grammar mask (JSON schema, V={v}, {n} tokens): p50 {p50:.3} ms, p99 {p99:.3} ms, \
             mean {mean:.3} ms per token (goal p99 <= {MASK_GOAL_MS} ms: {})",
            if p99 <= MASK_GOAL_MS {
                "met"
            } else {
                "NOT met"
            }
        )?,
        None => writeln!(out, "grammar mask: not measured (no --mask-tokenizer)")?,
    }
    writeln!(
        out,
        "speculation (lookup draft + greedy acceptance, V={sv}, {sn} verifies of 8 rows): \
         p50 {s50:.3} ms, p99 {s99:.3} ms, mean {smean:.3} ms per accepted token \
         (goal p99 <= {MASK_GOAL_MS} ms: {})",
        if s99 <= MASK_GOAL_MS {
            "met"
        } else {
            "NOT met"
        }
    )?;
    out.flush()
}
