//! The emulator through the real C ABI: dlopen, getProviders, binary info, context,
//! graphRetrieve and graphExecute, checked against an independent computation.

mod common;

use qhx::qnn::{read_binary_info, Binding, Context, Runtime};
use qnn_emu::writer::{context_binary, graphs, weights, SynthSpec};
use std::sync::{Arc, Mutex};

/// The tests share one emulator (and its log) per process: one at a time, so a backend error
/// line quoted in an error belongs to the test that caused it.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn rms_norm_matmul(x: &[f32], norm: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let h = x.len();
    let ms: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>() / h as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    let n: Vec<f64> = x
        .iter()
        .zip(norm)
        .map(|(a, g)| *a as f64 * inv * *g as f64)
        .collect();
    w.chunks_exact(h)
        .map(|row| row.iter().zip(&n).map(|(a, b)| *a as f64 * b).sum::<f64>() as f32)
        .collect()
}

/// A context binary holding only the lm-head graph of `spec`, written under a fresh `tag`
/// directory: (bytes, path).
fn lm_head_binary(spec: &SynthSpec, tag: &str) -> (Vec<u8>, std::path::PathBuf) {
    let w = weights(spec);
    let (_, _, lm, _) = graphs(spec);
    let bin = context_binary(spec, &[lm], &w, |n| {
        n == "output_norm.weight" || n == "output.weight"
    });
    let path = common::tmp(tag).join("lm.bin");
    std::fs::write(&path, &bin).unwrap();
    (bin, path)
}

#[test]
fn lm_head_graph_executes_through_the_c_abi() {
    let _serial = serial();
    let spec = SynthSpec {
        vocab: 300,
        hidden: 48,
        ..Default::default()
    };
    let (bin, path) = lm_head_binary(&spec, "abi");

    let lib = common::emu();
    let rt = Arc::new(Runtime::new(&lib, &lib, 0).expect("load emulator as backend + system"));
    assert_eq!(rt.backend().core_api.major, 2);
    assert!(rt.backend().core_api.minor >= 10);
    let info = read_binary_info(&rt, &bin, &path).expect("binary info");
    assert_eq!(info.graphs.len(), 1);
    let g = &info.graphs[0];
    assert_eq!(g.name, "tiny_lmhead");
    assert_eq!(g.inputs[0].dims, vec![48]);
    assert_eq!(g.outputs[0].dims, vec![300]);
    assert_eq!(info.soc_model, Some(87));

    let ctx = Context::from_binary(&rt, &bin, &path).expect("context");
    let graph = ctx.graph(&g.name).expect("graph");
    let mut b = Binding::new(g);
    let x: Vec<f32> = (0..48).map(|i| ((i * 7) % 11) as f32 / 5.0 - 1.0).collect();
    b.input_mut(0).write_f32(0, &x);
    graph.execute(&mut b).expect("execute");
    let mut got = vec![0f32; 300];
    b.output(0).read_f32(0, &mut got);

    let w = weights(&spec);
    let norm = &w
        .iter()
        .find(|(n, _, _)| n == "output_norm.weight")
        .unwrap()
        .2;
    let head = &w.iter().find(|(n, _, _)| n == "output.weight").unwrap().2;
    let want = rms_norm_matmul(&x, norm, head, 1e-5);
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
            "logit {i}: {a} vs {b}"
        );
    }
}

#[test]
fn execute_rejects_a_wrong_buffer_with_a_graph_error() {
    let _serial = serial();
    let spec = SynthSpec::default();
    let (bin, path) = lm_head_binary(&spec, "abi-bad");
    let lib = common::emu();
    let rt = Arc::new(Runtime::new(&lib, &lib, 0).unwrap());
    let info = read_binary_info(&rt, &bin, &path).unwrap();
    let mut g = info.graphs[0].clone();
    // Claim a wrong shape: the emulator must refuse it with QNN_GRAPH_ERROR_INVALID_TENSOR.
    g.inputs[0].dims = vec![g.inputs[0].dims[0] * 2];
    let ctx = Context::from_binary(&rt, &bin, &path).unwrap();
    let graph = ctx.graph(&g.name).unwrap();
    let mut b = Binding::new(&g);
    let e = graph.execute(&mut b).unwrap_err().to_string();
    assert!(e.contains("6004") && e.contains("tiny_lmhead"), "{e}");
}

#[test]
fn garbage_binary_is_a_malformed_binary_error() {
    let _serial = serial();
    let lib = common::emu();
    let rt = Arc::new(Runtime::new(&lib, &lib, 0).unwrap());
    let junk: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let p = std::path::Path::new("junk.bin");
    let e = read_binary_info(&rt, &junk, p).unwrap_err().to_string();
    assert!(e.contains("30010") && e.contains("junk.bin"), "{e}");
    let e = Context::from_binary(&rt, &junk, p)
        .err()
        .expect("must fail")
        .to_string();
    assert!(e.contains("5005") && e.contains("junk.bin"), "{e}");
}

/// The real backend scopes a mem handle to the context it was registered in; the emulator
/// refuses one from another context, or a host bug sharing handles would pass here. Since
/// `Graph::execute` checks that a binding belongs to its graph, the host refuses such a
/// binding first, before graphExecute (the emulator's check stays as a second line).
#[test]
fn a_mem_handle_from_another_context_is_rejected() {
    let _serial = serial();
    let spec = SynthSpec::default();
    let (bin, path) = lm_head_binary(&spec, "abi-memctx");
    let lib = common::emu();
    let mut rt = Runtime::new(&lib, &lib, 0).unwrap();
    rt.load_rpcmem(&lib).expect("the emulator exports rpcmem");
    let rt = Arc::new(rt);
    let info = read_binary_info(&rt, &bin, &path).unwrap();
    let g = &info.graphs[0];
    let (c1, c2) = (
        Context::from_binary(&rt, &bin, &path).unwrap(),
        Context::from_binary(&rt, &bin, &path).unwrap(),
    );
    let (g1, g2) = (c1.graph(&g.name).unwrap(), c2.graph(&g.name).unwrap());
    let mut b = Binding::for_graph(&g1, g).unwrap();
    assert!(b.is_shared(), "registered in context 1");
    g1.execute(&mut b)
        .expect("its own context accepts the handles");
    let e = g2.execute(&mut b).unwrap_err().to_string();
    assert!(e.contains("another graph or context"), "{e}");
}

/// Fixed-point tensors must carry the binary's own scale/offset at execute.
#[test]
fn fixed_point_tensors_must_carry_the_binarys_quantization() {
    let _serial = serial();
    let spec = SynthSpec {
        io: "ufixed16".into(),
        ..Default::default()
    };
    let w = weights(&spec);
    // The decode graph: its hidden state and K/V are fixed point (the lm-head is f16).
    let (_, dec, _, _) = graphs(&spec);
    let bin = context_binary(&spec, &[dec], &w, |n| n.starts_with("blk."));
    let path = common::tmp("abi-quant").join("lm.bin");
    std::fs::write(&path, &bin).unwrap();
    let lib = common::emu();
    let rt = Arc::new(Runtime::new(&lib, &lib, 0).unwrap());
    let info = read_binary_info(&rt, &bin, &path).unwrap();
    let g = info.graphs[0].clone();
    assert!(g.inputs[0].quant.is_some(), "{:?}", g.inputs[0]);
    let ctx = Context::from_binary(&rt, &bin, &path).unwrap();
    let graph = ctx.graph(&g.name).unwrap();
    graph
        .execute(&mut Binding::new(&g))
        .expect("the binary's own params pass");
    let mut bad = g.clone();
    // SAFETY: the SCALE_OFFSET member is the one this tensor's encoding selects.
    unsafe { bad.inputs[0].raw_quant.encoding.scale_offset.scale *= 2.0 };
    let e = graph
        .execute(&mut Binding::new(&bad))
        .unwrap_err()
        .to_string();
    assert!(e.contains("6004"), "{e}");
    assert!(e.contains("quantization differs"), "{e}");
}

/// A binding built for one graph, executed on another: a graph error naming both before any
/// C call (the graph ids and buffer sizes would not match what the graph registered).
#[test]
fn execute_refuses_a_binding_of_another_graph() {
    let _serial = serial();
    let spec = SynthSpec::default();
    let w = weights(&spec);
    let (_, decode, lm, _) = graphs(&spec);
    let bin = context_binary(&spec, &[decode, lm], &w, |_| true);
    let path = common::tmp("abi-other-graph").join("both.bin");
    std::fs::write(&path, &bin).unwrap();
    let lib = common::emu();
    let rt = Arc::new(Runtime::new(&lib, &lib, 0).unwrap());
    let info = read_binary_info(&rt, &bin, &path).unwrap();
    let ctx = Context::from_binary(&rt, &bin, &path).unwrap();
    let (dd, ld) = (&info.graphs[0], &info.graphs[1]);
    let (dec, lmh) = (ctx.graph(&dd.name).unwrap(), ctx.graph(&ld.name).unwrap());
    for mut b in [Binding::new(ld), Binding::for_graph(&lmh, ld).unwrap()] {
        let e = dec.execute(&mut b).unwrap_err().to_string();
        assert!(
            e.contains("tiny_decode") && e.contains("built for graph tiny_lmhead"),
            "{e}"
        );
        lmh.execute(&mut b).expect("its own graph runs");
    }
    // A same-named graph of another context: the recorded handle tells them apart.
    let ctx2 = Context::from_binary(&rt, &bin, &path).unwrap();
    let lmh2 = ctx2.graph(&ld.name).unwrap();
    let mut b = Binding::for_graph(&lmh, ld).unwrap();
    let e = lmh2.execute(&mut b).unwrap_err().to_string();
    assert!(e.contains("another graph or context"), "{e}");
}
