//! The runner's state operations on both bundle kinds (a manifest bundle and a Genie bundle
//! of the same synthetic weights, on the emulator): a snapshot restored after other tokens
//! gives back bit-identical logits, and the logits of every token of one multi-row execute
//! equal those of feeding the prompt up to that token alone.

mod common;

use common::*;
use qhx::bundle::Spec;
use qhx::load::LoadOptions;
use qhx::load::Loaded;
use qhx::runner::Runner;
use qnn_emu::writer::{write_genie_bundle, SynthSpec};
use std::path::Path;

fn load(config: &Path, dir: &Path) -> Loaded {
    let spec = Spec::load(config, dir).expect("spec");
    let lib = emu();
    Loaded::load(&spec, &lib, &lib, &LoadOptions::default()).expect("load")
}

/// Both kinds of one model: (label, loaded).
fn both(tag: &str) -> Vec<(&'static str, Loaded)> {
    let spec = SynthSpec::default();
    let (d, m) = bundle(&format!("{tag}-manifest"), &spec);
    let manifest = load(&m, &d);
    let g = tmp(&format!("{tag}-genie"));
    let cfg = write_genie_bundle(&g, &spec, &[4, 1]).expect("genie bundle");
    let genie = load(&cfg, &g);
    vec![("manifest", manifest), ("genie", genie)]
}

fn prompt(l: &Loaded, text: &str) -> Vec<u32> {
    let ids = l.tokenizer().encode(text, None).expect("encode");
    assert!(ids.len() >= 4, "{ids:?}");
    ids
}

fn logits(r: &mut Runner) -> Vec<f32> {
    let t = r.logits().expect("logits");
    let mut v = vec![0.0; t.len()];
    t.read_f32(0, &mut v);
    v
}

fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap() as u32
}

fn never() -> bool {
    false
}

#[test]
fn a_restored_snapshot_continues_exactly() {
    for (what, l) in both("runner-snapshot") {
        let mut r = Runner::new(l.plan()).expect("bind");
        let ids = prompt(&l, "the quick brown fox jumps");
        r.feed(&ids, &never, None).unwrap();
        let first = argmax(&logits(&mut r));
        let snap = r.snapshot();
        assert_eq!(snap.pos(), ids.len());
        r.feed(&[first], &never, None).unwrap();
        let want = logits(&mut r);
        // Other tokens, some in a multi-row chunk (another Genie variant takes the cache).
        r.feed(&[3, 5, 7, 11, 13], &never, None).unwrap();
        r.feed(&[17], &never, None).unwrap();
        let elsewhere = logits(&mut r);
        r.restore(&snap).unwrap();
        assert_eq!(r.pos(), ids.len(), "{what}");
        r.feed(&[first], &never, None).unwrap();
        let got = logits(&mut r);
        assert_ne!(
            got, elsewhere,
            "{what}: the disturbance must change the logits"
        );
        assert_eq!(got, want, "{what}: logits after restore differ");
    }
}

#[test]
fn every_row_of_one_execute_has_the_logits_of_its_own_prefix() {
    for (what, l) in both("runner-rows") {
        let ids = prompt(&l, "one two three");
        let n = ids.len().min(4);
        let ids = &ids[..n];
        let mut r = Runner::new(l.plan()).expect("bind");
        r.feed(ids, &never, None).unwrap();
        for j in 0..n {
            let row = {
                let t = r
                    .row_logits(j)
                    .unwrap_or_else(|e| panic!("{what} row {j}: {e}"));
                let mut v = vec![0.0; t.len()];
                t.read_f32(0, &mut v);
                v
            };
            let mut alone = Runner::new(l.plan()).expect("bind");
            alone.feed(&ids[..=j], &never, None).unwrap();
            assert_eq!(row, logits(&mut alone), "{what}: token {j} of {n}");
        }
        let e = r.row_logits(n).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(&format!("there is no token {n}")), "{e}");
    }
}
