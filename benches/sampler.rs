//! Criterion microbenchmarks of the per-step host kernels over a 151,936-entry vocabulary
//! (DeepSeek-R1-Distill-Qwen-1.5B): greedy (argmax fused with the finiteness check),
//! the sampler chain at top-k 40 / top-p 0.95 / temperature 0.8, and the f16 -> f32 logits read.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use half::slice::HalfFloatSliceExt;
use qhx::sampler::{argmax_checked, Sampler, SamplerConfig};

const VOCAB: usize = 151_936;

fn logits() -> Vec<f32> {
    let mut rng = qnn_emu::writer::Rng::new(11);
    (0..VOCAB).map(|_| rng.uniform(8.0)).collect()
}

fn bench(c: &mut Criterion) {
    let v = logits();
    c.bench_function("greedy_argmax_checked_152k", |b| {
        b.iter(|| argmax_checked(black_box(&v)))
    });
    c.bench_function("argmax_two_pass_152k", |b| {
        b.iter(|| qhx::sampler::argmax(black_box(&v)))
    });
    c.bench_function("all_finite_152k", |b| {
        b.iter(|| qhx::sampler::all_finite(black_box(&v)))
    });
    let mut s = Sampler::new(SamplerConfig {
        temp: 0.8,
        top_k: 40,
        top_p: 0.95,
        seed: Some(5),
        ..Default::default()
    });
    // Without a repetition penalty the chain leaves the logits as they are.
    let mut w = v.clone();
    c.bench_function("topk40_topp095_t08_152k", |b| {
        b.iter(|| s.sample(black_box(&mut w), &[]))
    });
    let mut h = vec![half::f16::ZERO; VOCAB];
    h.convert_from_f32_slice(&v);
    let mut out = vec![0f32; VOCAB];
    c.bench_function("greedy_argmax_f16_checked_152k", |b| {
        b.iter(|| qhx::sampler::argmax_f16_checked(black_box(&h)))
    });
    c.bench_function("lmhead_read_f16_to_f32_152k", |b| {
        b.iter(|| black_box(&h).convert_to_f32_slice(&mut out))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
