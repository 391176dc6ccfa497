//! Errors stay with the session that had them: two sessions of two models fail at the same
//! time on two threads, and each error quotes only its own graph's backend line. A failed
//! context release is recorded on the runtime, not dropped.

mod common;

use qhx::engine::{Engine, GenConfig, Next};
use qhx::load::Model;
use qhx::qnn::Runtime;
use qnn_emu::writer::SynthSpec;
use std::sync::{Arc, Barrier};

fn load(rt: &Arc<Runtime>, name: &str, seed: u64) -> Arc<Model> {
    let spec = SynthSpec {
        name: name.into(),
        seed,
        prefill: None,
        ..SynthSpec::default()
    };
    common::load_on(rt, &format!("session_errors_{name}"), &spec)
}

#[test]
fn concurrent_failures_quote_only_their_own_backend_line() {
    // Every graphExecute fails, logging an ERROR line that names its graph, then pauses
    // 3 ms before returning: long enough for the other thread's line to arrive, so an error
    // slot shared by threads would hand one session the other's line. Every context release
    // fails too. The only test in this binary: the emulator reads its knobs once.
    std::env::set_var("QNN_EMU_FAIL", "graphExecute=6031,contextFree=5002");
    std::env::set_var("QNN_EMU_LOG_DELAY_MS", "3");
    let lib = common::emu();
    let rt = Arc::new(Runtime::new(&lib, &lib, 0).expect("runtime"));
    let models = [load(&rt, "alpha", 3), load(&rt, "beta", 5)];
    let start = Arc::new(Barrier::new(2));
    let handles: Vec<_> = models
        .iter()
        .map(|m| {
            let (m, start) = (Arc::clone(m), Arc::clone(&start));
            let mut engine = Engine::new(&m).unwrap();
            std::thread::spawn(move || {
                let name = m.plan.decode().name().to_string();
                let ids = m.tokenizer.encode("hello", None).unwrap();
                start.wait();
                for i in 0..30 {
                    engine.reset();
                    let e = engine
                        .generate(&ids, &GenConfig::greedy(4), 0.0, |_| Ok(Next::Continue))
                        .expect_err("every execute fails");
                    let msg = e.to_string();
                    let said = msg
                        .split_once("backend said: ")
                        .unwrap_or_else(|| panic!("run {i}: no backend line in {msg:?}"))
                        .1;
                    assert!(
                        said.contains(&format!("in {name}")),
                        "run {i} of {name}: the backend line is not its own: {msg:?}"
                    );
                }
                name
            })
        })
        .collect();
    let names: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_ne!(names[0], names[1]);

    // Dropping the models frees their contexts; each failed free is recorded on the runtime.
    drop(models);
    let released = rt.release_errors();
    assert_eq!(released.len(), 4, "two binaries per model: {released:?}");
    for e in &released {
        assert!(e.contains("freeing the context of"), "{e}");
        assert!(
            e.contains("5002") || e.to_lowercase().contains("context"),
            "{e}"
        );
    }
}
