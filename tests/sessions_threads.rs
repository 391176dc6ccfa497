//! Shareable models, sendable sessions: two sessions of two models, built on one thread and
//! moved to two others, generate at the same time on one shared runtime and give exactly
//! the tokens each gives alone.

mod common;

use qhx::engine::{Engine, GenConfig, Next};
use qhx::load::Model;
use qhx::qnn::Runtime;
use qnn_emu::writer::SynthSpec;
use std::sync::{Arc, Barrier};
use std::time::Instant;

// Compile-time: a session moves between threads, a model is shared between them.
const _: () = {
    const fn send<T: Send>() {}
    const fn shared<T: Send + Sync>() {}
    send::<Engine>();
    shared::<Model>();
    shared::<Runtime>();
};

fn load(rt: &Arc<Runtime>, name: &str, seed: u64, n_layers: usize) -> Arc<Model> {
    let spec = SynthSpec {
        name: name.into(),
        seed,
        n_layers,
        ..SynthSpec::default()
    };
    common::load_on(rt, &format!("sessions_threads_{name}"), &spec)
}

/// Greedy ids for `prompt`, ignoring end tokens so that every run has the same length.
fn run(model: &Model, engine: &mut Engine, prompt: &str) -> Vec<u32> {
    let ids = model.tokenizer.encode(prompt, model.bos).expect("encode");
    let cfg = GenConfig {
        ignore_eos: true,
        ..GenConfig::greedy(24)
    };
    engine.reset();
    let out = engine
        .generate(&ids, &cfg, 0.0, |_| Ok(Next::Continue))
        .expect("generate");
    out.output_ids
}

#[test]
fn two_sessions_of_two_models_generate_at_once_from_two_threads() {
    // Every graphExecute sleeps 2 ms first, so that the two runs (~80 executes each)
    // overlap whatever the scheduler does. The only test in this binary: the emulator reads
    // its knobs once per process.
    std::env::set_var("QNN_EMU_DELAY_MS", "2");
    let lib = common::emu();
    let rt = Arc::new(Runtime::new(&lib, &lib, 0).expect("runtime"));
    let a = load(&rt, "alpha", 11, 2);
    let b = load(&rt, "beta", 23, 3);
    let prompt = "the quick brown fox";

    // References: each model alone, on this thread.
    let want_a = run(&a, &mut Engine::new(&a).unwrap(), prompt);
    let want_b = run(&b, &mut Engine::new(&b).unwrap(), prompt);
    assert_eq!(want_a.len(), 24);
    assert_ne!(
        want_a, want_b,
        "two different models must not agree token for token"
    );

    // Sessions built here and moved; the models' last handles outside the sessions are
    // dropped before the threads finish (each session keeps its model alive).
    let sessions = [
        (Arc::clone(&a), Engine::new(&a).unwrap(), want_a),
        (Arc::clone(&b), Engine::new(&b).unwrap(), want_b),
    ];
    drop((a, b));
    let start = Arc::new(Barrier::new(2));
    let t0 = Instant::now();
    let handles: Vec<_> = sessions
        .into_iter()
        .map(|(model, mut engine, want)| {
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                let mut spans = Vec::new();
                for round in 0..3 {
                    let s = t0.elapsed();
                    let got = run(&model, &mut engine, prompt);
                    spans.push((s, t0.elapsed()));
                    assert_eq!(got, want, "round {round}: ids differ from the run alone");
                }
                spans
            })
        })
        .collect();
    let spans: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("session thread"))
        .collect();
    let (a_first, a_last) = (spans[0][0].0, spans[0][2].1);
    let (b_first, b_last) = (spans[1][0].0, spans[1][2].1);
    eprintln!("alpha ran {a_first:?}..{a_last:?}, beta {b_first:?}..{b_last:?}");
    assert!(
        a_first < b_last && b_first < a_last,
        "the two sessions did not run at the same time: alpha {a_first:?}..{a_last:?}, \
         beta {b_first:?}..{b_last:?}"
    );
    assert_eq!(rt.release_errors(), Vec::<String>::new());
}
