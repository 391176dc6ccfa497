//! No leak across repeated use: 200 generations (a fresh engine each) and a 200-turn
//! session (one engine, reset between turns) in one process, through the library API and
//! the emulator. Resident set size must stay within 5 % of its post-warm-up value.
#![cfg(target_os = "linux")]

mod common;

use qhx::engine::{Engine, GenConfig, Next};
use qhx::manifest::Manifest;
use qhx::model::{LoadOptions, Model};
use qnn_emu::writer::SynthSpec;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn check_flat(what: &str, samples: &[u64]) {
    let base = samples[0];
    let max = *samples.iter().max().unwrap();
    let last = *samples.last().unwrap();
    println!(
        "rss {what}: after warm-up {} KiB, max {} KiB, last {} KiB ({:+.2} %)",
        base / 1024,
        max / 1024,
        last / 1024,
        (last as f64 / base as f64 - 1.0) * 100.0
    );
    assert!(
        (max as f64) <= base as f64 * 1.05,
        "{what}: RSS grew from {base} to {max} bytes: {samples:?}"
    );
}

#[test]
fn rss_is_flat_over_200_generations_and_200_turns() {
    let (dir, m) = common::bundle("rss", &SynthSpec::default());
    let lib = common::emu();
    let manifest = Manifest::load(&m, &dir).unwrap();
    let model = Model::load(manifest, &lib, &lib, &LoadOptions::default()).unwrap();
    let cfg = GenConfig::greedy(8);
    let prompts = ["hello there", "a", "the quick brown fox", "rss"];
    let run = |engine: &mut Engine<'_>, i: usize| {
        let ids = model
            .tokenizer
            .encode(
                prompts[i % prompts.len()],
                model.manifest.params.bos_token_id,
            )
            .unwrap();
        let mut stream = model.tokenizer.stream();
        let mut text = String::new();
        let out = engine
            .generate(&ids, &cfg, 0.0, |t| {
                if let Some(p) = stream.step(t)? {
                    text.push_str(&p);
                }
                Ok(Next::Continue)
            })
            .unwrap();
        assert!(!out.output_ids.is_empty());
        out.output_ids
    };

    // 200 generations, a fresh engine (bindings, RoPE table, buffers) each time.
    let warmup = 20;
    let mut samples = Vec::new();
    let mut first = None;
    for i in 0..200 {
        let mut e = Engine::new(&model).unwrap();
        let ids = run(&mut e, i);
        // Deterministic: the same prompt gives the same tokens every time.
        if i % prompts.len() == 0 {
            match &first {
                None => first = Some(ids),
                Some(f) => assert_eq!(f, &ids, "generation {i} differs"),
            }
        }
        if i + 1 >= warmup {
            samples.push(rss_bytes());
        }
    }
    check_flat("200 generations", &samples);

    // A 200-turn session on one engine, reset between turns.
    let mut e = Engine::new(&model).unwrap();
    let mut samples = Vec::new();
    for i in 0..200 {
        e.reset();
        run(&mut e, i);
        if i + 1 >= warmup {
            samples.push(rss_bytes());
        }
    }
    check_flat("200 turns", &samples);
}
