//! Writing emulator bundles from Rust: synthetic models of any shape (deterministic
//! pseudo-random f32 weights), for tests and host-overhead benchmarks. Real-weight bundles
//! come from the exporter (`scripts/qhx-export.sh ... --target emu`).

use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Shape and I/O choices of a synthetic bundle.
#[derive(Debug, Clone)]
pub struct SynthSpec {
    pub name: String,
    pub arch: String,
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    /// Prefill rows P (None: no prefill graph).
    pub prefill: Option<usize>,
    pub ctx: usize,
    /// I/O dtype name (f32, f16, ufixed16, ...).
    pub io: String,
    /// Weights are omitted and the emulator runs in null-compute mode.
    pub null_compute: bool,
    pub seed: u64,
    pub rope_theta: f64,
    pub eos: u32,
    /// Head-major KV tensors.
    pub head_major: bool,
    /// Prefill graph with past K/V inputs (chunked prefill) instead of an AR=P window.
    pub prefill_past: bool,
    /// Prefill and decode graphs in one binary (`contexts.shared`).
    pub shared: bool,
    /// Rows of a verify graph (past K/V over the decode cache; `contexts.verify`, in the
    /// decode binary), for speculative decoding. None: no verify graph.
    pub verify: Option<usize>,
    /// tokenizer.json to copy into the bundle.
    pub tokenizer: Option<PathBuf>,
    pub embed_f16: bool,
    /// Value ranges per role (x, y, k_<i>, v_<i>, as QNN_EMU_CALIBRATE records them) for
    /// fixed-point I/O; roles without a range get a wide default.
    pub ranges: std::collections::BTreeMap<String, (f32, f32)>,
    /// Write a synthetic byte-level BPE tokenizer with this many tokens (merges included)
    /// instead of the 258-token byte tokenizer, for cold-start measurements.
    pub tokenizer_vocab: Option<usize>,
    /// Name of the embedding file; when set and a file of the right size already exists,
    /// it is reused (bundles of one shape at several C share it).
    pub embed_file: Option<String>,
    /// One per layer (`full_attention`, `sliding_attention`, `conv`); empty: all full.
    pub layer_types: Vec<String>,
    /// Window of the sliding layers (their inputs are `cos_local`/`sin_local`/`cmask_local`).
    pub sliding_window: Option<usize>,
    /// RoPE base of the sliding layers.
    pub local_rope_theta: f64,
}

impl Default for SynthSpec {
    fn default() -> Self {
        SynthSpec {
            name: "tiny".into(),
            arch: "llama".into(),
            hidden: 32,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 8,
            ffn: 64,
            vocab: TINY_VOCAB,
            prefill: Some(16),
            ctx: 64,
            io: "f32".into(),
            null_compute: false,
            seed: 1,
            rope_theta: 10000.0,
            eos: 257,
            head_major: false,
            prefill_past: false,
            shared: false,
            verify: None,
            tokenizer: None,
            embed_f16: false,
            ranges: Default::default(),
            tokenizer_vocab: None,
            embed_file: None,
            layer_types: Vec::new(),
            sliding_window: None,
            local_rope_theta: 10000.0,
        }
    }
}

impl SynthSpec {
    /// Layer `i`'s type name.
    pub fn layer_type(&self, i: usize) -> &str {
        self.layer_types
            .get(i)
            .map_or("full_attention", String::as_str)
    }

    fn has_kv(&self, i: usize) -> bool {
        self.layer_type(i) != "conv"
    }

    fn has_sliding(&self) -> bool {
        self.layer_types.iter().any(|t| t == "sliding_attention")
    }
}

/// SplitMix64: a tiny deterministic generator (reproducible weights without a dependency).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-a, a).
    pub fn uniform(&mut self, a: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        (u * 2.0 - 1.0) * a
    }
}

/// QNN scale/offset so that [lo, hi] (with 5 % headroom) spans the fixed-point range.
pub fn scale_offset(dtype: &str, lo: f32, hi: f32) -> (f32, i32) {
    let levels = match dtype {
        "ufixed16" => 65535.0,
        "ufixed8" => 255.0,
        _ => return (1.0, 0),
    };
    let pad = 0.05 * (hi - lo).max(1e-3);
    let (lo, hi) = (lo.min(0.0) - pad, hi.max(0.0) + pad);
    let scale = (hi - lo) / levels;
    (scale, (lo / scale).round() as i32)
}

/// The range role of an I/O tensor name (past and new K/V of a layer share one).
fn role(name: &str) -> String {
    match name {
        "x" | "hidden" => "x".into(),
        "y" => "y".into(),
        "cos" | "sin" => "rope".into(),
        "cmask" => "mask".into(),
        n => n
            .trim_start_matches("past_")
            .trim_start_matches("new_")
            .to_string(),
    }
}

fn tensor_q(s: &SynthSpec, name: &str, dtype: &str, dims: &[usize]) -> Value {
    let r = role(name);
    let (lo, hi) = match r.as_str() {
        "rope" => (-1.0, 1.0),
        // The hidden-mask value is the range minimum. It must beat any score against a cache
        // slot never written (zero bytes decode to the range minimum, not to 0.0); 0 itself
        // is exact because the zero-point is an integer.
        "mask" => (-30000.0, 0.0),
        _ => s.ranges.get(&r).copied().unwrap_or((-32.0, 32.0)),
    };
    let (lo, hi) = if name == "hidden" {
        s.ranges.get("y").copied().unwrap_or((lo, hi))
    } else {
        (lo, hi)
    };
    let (scale, offset) = scale_offset(dtype, lo, hi);
    json!({"name": name, "dtype": dtype, "dims": dims, "scale": scale, "offset": offset})
}

/// Graph headers in the FORMAT.md contract.
/// (prefill, decode, lmhead, verify).
pub fn graphs(s: &SynthSpec) -> (Option<Value>, Value, Value, Option<Value>) {
    let tensor = |n: &str, d: &str, dims: &[usize]| tensor_q(s, n, d, dims);
    let k = s.n_kv_heads * s.head_dim;
    let kv = |rows: usize| -> Vec<usize> {
        if s.head_major {
            vec![s.n_kv_heads, rows, s.head_dim]
        } else {
            vec![rows, k]
        }
    };
    let layout = if s.head_major {
        "head_major"
    } else {
        "pos_major"
    };
    let io = s.io.as_str();
    // P rows (the emulator's `prefill` kind), from an empty cache or over `past` slots.
    let rows_graph = |tag: &str, p: usize, past: bool| {
        let cols = if past { s.ctx + p } else { p };
        let mut inputs = vec![
            tensor("x", io, &[p, s.hidden]),
            tensor("cos", io, &[p, s.head_dim]),
            tensor("sin", io, &[p, s.head_dim]),
            tensor("cmask", io, &[p, cols]),
        ];
        if s.has_sliding() {
            inputs.push(tensor("cos_local", io, &[p, s.head_dim]));
            inputs.push(tensor("sin_local", io, &[p, s.head_dim]));
            inputs.push(tensor("cmask_local", io, &[p, cols]));
        }
        if past {
            for i in (0..s.n_layers).filter(|&i| s.has_kv(i)) {
                inputs.push(tensor(&format!("past_k_{i}"), io, &kv(s.ctx)));
                inputs.push(tensor(&format!("past_v_{i}"), io, &kv(s.ctx)));
            }
        }
        let mut outputs = vec![tensor("y", io, &[p, s.hidden])];
        for i in 0..s.n_layers {
            if s.has_kv(i) {
                outputs.push(tensor(&format!("new_k_{i}"), io, &kv(p)));
                outputs.push(tensor(&format!("new_v_{i}"), io, &kv(p)));
            } else {
                outputs.push(tensor(&format!("conv_bx_{i}"), io, &[p, s.hidden]));
            }
        }
        let ctx = if past { s.ctx } else { 0 };
        json!({"name": format!("{}_{tag}", s.name), "kind": "prefill", "seq": p, "ctx": ctx,
               "kv_layout": layout, "inputs": inputs, "outputs": outputs})
    };
    let prefill = s.prefill.map(|p| rows_graph("prefill", p, s.prefill_past));
    let verify = s.verify.map(|k| rows_graph("verify", k, true));
    let mut inputs = vec![
        tensor("x", io, &[s.hidden]),
        tensor("cos", io, &[s.head_dim]),
        tensor("sin", io, &[s.head_dim]),
        tensor("cmask", io, &[s.ctx]),
    ];
    if s.has_sliding() {
        inputs.push(tensor("cos_local", io, &[s.head_dim]));
        inputs.push(tensor("sin_local", io, &[s.head_dim]));
        inputs.push(tensor("cmask_local", io, &[s.ctx]));
    }
    let mut outputs = vec![tensor("y", io, &[s.hidden])];
    for i in 0..s.n_layers {
        if s.has_kv(i) {
            inputs.push(tensor(&format!("past_k_{i}"), io, &kv(s.ctx)));
            inputs.push(tensor(&format!("past_v_{i}"), io, &kv(s.ctx)));
            outputs.push(tensor(&format!("new_k_{i}"), io, &kv(1)));
            outputs.push(tensor(&format!("new_v_{i}"), io, &kv(1)));
        } else {
            inputs.push(tensor(&format!("past_conv_{i}"), io, &[s.hidden, 3]));
            outputs.push(tensor(&format!("present_conv_{i}"), io, &[s.hidden, 3]));
        }
    }
    let decode = json!({"name": format!("{}_decode", s.name), "kind": "decode", "seq": 1, "ctx": s.ctx,
                        "kv_layout": layout, "inputs": inputs, "outputs": outputs});
    let lm_io = if io.starts_with('u') || io.starts_with('s') {
        "f16"
    } else {
        io
    };
    let lmhead = json!({"name": format!("{}_lmhead", s.name), "kind": "lmhead", "seq": 1, "ctx": 0,
                        "inputs": [tensor("hidden", lm_io, &[s.hidden])],
                        "outputs": [tensor("logits", lm_io, &[s.vocab])]});
    (prefill, decode, lmhead, verify)
}

/// Deterministic f32 weights for every tensor name the emulator reads.
pub fn weights(s: &SynthSpec) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut rng = Rng::new(s.seed);
    let (h, q, kv, f) = (
        s.hidden,
        s.n_heads * s.head_dim,
        s.n_kv_heads * s.head_dim,
        s.ffn,
    );
    let mut out = Vec::new();
    let mut mat = |name: String, shape: Vec<usize>, scale: f32, rng: &mut Rng| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.uniform(scale)).collect();
        out.push((name, shape, v));
    };
    let wscale = |fan_in: usize| (3.0 / fan_in as f32).sqrt();
    mat("token_embd.weight".into(), vec![s.vocab, h], 1.0, &mut rng);
    for i in 0..s.n_layers {
        let b = |t: &str| format!("blk.{i}.{t}");
        mat(b("attn_norm.weight"), vec![h], 0.2, &mut rng);
        if !s.has_kv(i) {
            mat(
                b("shortconv.in_proj.weight"),
                vec![3 * h, h],
                wscale(h),
                &mut rng,
            );
            mat(b("shortconv.conv.weight"), vec![h, 3], 0.5, &mut rng);
            mat(
                b("shortconv.out_proj.weight"),
                vec![h, h],
                wscale(h),
                &mut rng,
            );
            mat(b("ffn_norm.weight"), vec![h], 0.2, &mut rng);
            mat(b("ffn_gate.weight"), vec![f, h], wscale(h), &mut rng);
            mat(b("ffn_up.weight"), vec![f, h], wscale(h), &mut rng);
            mat(b("ffn_down.weight"), vec![h, f], wscale(f), &mut rng);
            continue;
        }
        mat(b("attn_q.weight"), vec![q, h], wscale(h), &mut rng);
        mat(b("attn_k.weight"), vec![kv, h], wscale(h), &mut rng);
        mat(b("attn_v.weight"), vec![kv, h], wscale(h), &mut rng);
        if s.arch == "qwen2" {
            mat(b("attn_q.bias"), vec![q], 0.1, &mut rng);
            mat(b("attn_k.bias"), vec![kv], 0.1, &mut rng);
            mat(b("attn_v.bias"), vec![kv], 0.1, &mut rng);
        }
        mat(b("attn_output.weight"), vec![h, q], wscale(q), &mut rng);
        mat(b("ffn_norm.weight"), vec![h], 0.2, &mut rng);
        mat(b("ffn_gate.weight"), vec![f, h], wscale(h), &mut rng);
        mat(b("ffn_up.weight"), vec![f, h], wscale(h), &mut rng);
        mat(b("ffn_down.weight"), vec![h, f], wscale(f), &mut rng);
    }
    mat("output_norm.weight".into(), vec![h], 0.2, &mut rng);
    // Untied head: a tied one makes a random model echo its last token forever.
    mat("output.weight".into(), vec![s.vocab, h], 1.0, &mut rng);
    // Norm weights near 1 keep activations in range.
    for (name, _, v) in out.iter_mut() {
        if name.ends_with("norm.weight") {
            v.iter_mut().for_each(|x| *x += 1.0);
        }
    }
    out
}

/// Serialise one context binary (FORMAT.md) holding `graphs` and the weights `keep` selects.
pub fn context_binary(
    s: &SynthSpec,
    graphs: &[Value],
    w: &[(String, Vec<usize>, Vec<f32>)],
    keep: impl Fn(&str) -> bool,
) -> Vec<u8> {
    let mut data: Vec<u8> = Vec::new();
    let mut entries = Vec::new();
    if !s.null_compute {
        for (name, shape, vals) in w.iter().filter(|(n, _, _)| keep(n)) {
            while data.len() % 64 != 0 {
                data.push(0);
            }
            let off = data.len();
            for v in vals {
                data.extend_from_slice(&v.to_le_bytes());
            }
            entries.push(json!({"name": name, "enc": "f32", "shape": shape, "offset": off, "nbytes": vals.len() * 4}));
        }
    }
    let header = json!({
        "model": {"arch": s.arch, "hidden": s.hidden, "n_layers": s.n_layers, "n_heads": s.n_heads,
                  "n_kv_heads": s.n_kv_heads, "head_dim": s.head_dim, "ffn": s.ffn, "vocab": s.vocab,
                  "rms_eps": 1e-5, "layer_types": s.layer_types, "sliding_window": s.sliding_window},
        "soc_model": 87, "dsp_arch": "v81", "null_compute": s.null_compute,
        "graphs": graphs, "weights": entries,
    });
    let hb = serde_json::to_vec(&header).expect("json");
    let mut out = Vec::with_capacity(64 + hb.len() + data.len());
    out.extend_from_slice(crate::format::MAGIC);
    out.extend_from_slice(&crate::format::FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(hb.len() as u32).to_le_bytes());
    out.extend_from_slice(&hb);
    while out.len() % 64 != 0 {
        out.push(0);
    }
    out.extend_from_slice(&data);
    out
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
    }
    std::fs::rename(&tmp, path)
}

/// Write a whole bundle (binaries, embed table, tokenizer, manifest) into `dir`; returns
/// the manifest path.
pub fn write_bundle(dir: &Path, s: &SynthSpec) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    // Null-compute binaries carry no weights: only the embedding table is needed, and that
    // is written straight from the generator (no vocab x hidden f32 copies of the model).
    let w = if s.null_compute {
        Vec::new()
    } else {
        weights(s)
    };
    let (prefill, decode, lmhead, verify) = graphs(s);
    let layer = |n: &str| n.starts_with("blk.");
    let head = |n: &str| n == "output_norm.weight" || n == "output.weight";
    let name = &s.name;
    let mut contexts = serde_json::Map::new();
    let gref = |kind: &str, bin: bool| {
        let mut r = json!({"graph": format!("{name}_{kind}")});
        if bin {
            r["bin"] = format!("{name}_{kind}.bin").into();
        }
        r
    };
    if s.verify.is_some() {
        // Beside the decode graph, whose weights it shares.
        contexts.insert("verify".into(), gref("verify", false));
    }
    if s.shared {
        let mut both = vec![decode];
        both.extend(prefill.clone());
        both.extend(verify);
        write_atomic(
            &dir.join(format!("{name}_shared.bin")),
            &context_binary(s, &both, &w, layer),
        )?;
        contexts.insert(
            "shared".into(),
            json!({"bin": format!("{name}_shared.bin")}),
        );
        contexts.insert("decode".into(), gref("decode", false));
        if prefill.is_some() {
            contexts.insert("prefill".into(), gref("prefill", false));
        }
    } else {
        if let Some(p) = &prefill {
            write_atomic(
                &dir.join(format!("{name}_prefill.bin")),
                &context_binary(s, std::slice::from_ref(p), &w, layer),
            )?;
            contexts.insert("prefill".into(), gref("prefill", true));
        }
        let mut dec = vec![decode];
        dec.extend(verify);
        write_atomic(
            &dir.join(format!("{name}_decode.bin")),
            &context_binary(s, &dec, &w, layer),
        )?;
        contexts.insert("decode".into(), gref("decode", true));
        if let Some(v) = contexts.get_mut("verify") {
            v["bin"] = format!("{name}_decode.bin").into();
        }
    }
    write_atomic(
        &dir.join(format!("{name}_lmhead.bin")),
        &context_binary(s, &[lmhead], &w, head),
    )?;
    contexts.insert("lmhead".into(), gref("lmhead", true));
    let dt = if s.embed_f16 { "f16" } else { "f32" };
    let embed_file = s
        .embed_file
        .clone()
        .unwrap_or_else(|| format!("{name}_embed_{dt}.bin"));
    let embed_dtype = dt;
    let epath = dir.join(&embed_file);
    let want = (s.vocab * s.hidden * if s.embed_f16 { 2 } else { 4 }) as u64;
    let reuse = s.embed_file.is_some() && std::fs::metadata(&epath).is_ok_and(|m| m.len() == want);
    if !reuse {
        let mut gen_rng = Rng::new(s.seed);
        let mut next = |i: usize| -> f32 {
            if w.is_empty() {
                gen_rng.uniform(1.0)
            } else {
                w[0].2[i]
            }
        };
        let n = s.vocab * s.hidden;
        let mut bytes = Vec::with_capacity(want as usize);
        for i in 0..n {
            let v = next(i);
            if s.embed_f16 {
                bytes.extend_from_slice(&half::f16::from_f32(v).to_le_bytes());
            } else {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        write_atomic(&epath, &bytes)?;
    }
    match (&s.tokenizer, s.tokenizer_vocab) {
        (Some(t), _) => {
            std::fs::copy(t, dir.join("tokenizer.json"))?;
        }
        (None, Some(v)) => write_atomic(
            &dir.join("tokenizer.json"),
            synthetic_bpe_tokenizer_json(v, s.seed).as_bytes(),
        )?,
        (None, None) => write_atomic(
            &dir.join("tokenizer.json"),
            tiny_tokenizer_json().as_bytes(),
        )?,
    }
    // Null-compute bundles hold no weights to count.
    let n_params = (!w.is_empty()).then(|| w.iter().map(|(_, _, v)| v.len()).sum::<usize>());
    let manifest = json!({
        "schema_version": 1,
        "model": {"name": name, "family": "llm", "arch": s.arch, "dsp_arch": "v81", "soc_model": 87,
                  "n_params": n_params},
        "params": {"hidden": s.hidden, "vocab": s.vocab, "n_layers": s.n_layers, "n_heads": s.n_heads,
                   "n_kv_heads": s.n_kv_heads, "head_dim": s.head_dim, "max_ctx": s.ctx,
                   "rope_theta": s.rope_theta, "bos_token_id": null, "eos_token_id": s.eos},
        "artifacts": {"contexts": contexts, "embed": {"file": embed_file, "dtype": embed_dtype},
                      "tokenizer": "tokenizer.json"},
        "plan": {"op": "llama_generate", "ar": s.prefill.unwrap_or(1)},
        "source": {"writer": "qnn_emu::writer (synthetic)", "seed": s.seed},
    });
    let mut manifest = manifest;
    if !s.layer_types.is_empty() {
        let mut layers = json!({"types": s.layer_types});
        if s.has_sliding() {
            layers["sliding_window"] = s.sliding_window.into();
            layers["rope"] = json!({"sliding_attention":
                {"theta": s.local_rope_theta, "cos": "cos_local", "sin": "sin_local"}});
            layers["masks"] = json!({"sliding_attention": "cmask_local"});
        }
        manifest["layers"] = layers;
    }
    let mpath = dir.join(format!("{name}.json"));
    write_atomic(
        &mpath,
        serde_json::to_string_pretty(&manifest)
            .expect("json")
            .as_bytes(),
    )?;
    Ok(mpath)
}

/// Graph headers of a Genie-named graph (FORMAT.md `kind: genie`): `ar` tokens per step,
/// context `cl` (past slots `cl - ar`), float32 I/O, the logits of every row.
pub fn genie_graph(s: &SynthSpec, ar: usize, cl: usize) -> Value {
    let t = |n: &str, d: &str, dims: &[usize]| json!({"name": n, "dtype": d, "dims": dims});
    let (past, nkv, hd) = (cl - ar, s.n_kv_heads, s.head_dim);
    let mut inputs = vec![
        t("input_ids", "int32", &[1, ar]),
        t("attention_mask", "f32", &[1, 1, ar, cl]),
        t("position_ids_cos", "f32", &[1, 1, ar, hd / 2]),
        t("position_ids_sin", "f32", &[1, 1, ar, hd / 2]),
    ];
    let mut outputs = vec![t("logits", "f32", &[1, 1, ar, s.vocab])];
    for i in 0..s.n_layers {
        inputs.push(t(&format!("past_key_{i}_in"), "f32", &[nkv, 1, hd, past]));
        inputs.push(t(&format!("past_value_{i}_in"), "f32", &[nkv, 1, past, hd]));
        outputs.push(t(&format!("past_key_{i}_out"), "f32", &[nkv, 1, hd, ar]));
        outputs.push(t(&format!("past_value_{i}_out"), "f32", &[nkv, 1, ar, hd]));
    }
    json!({"name": format!("{}_ar{ar}_cl{cl}", s.name), "kind": "genie", "seq": ar, "ctx": past,
           "inputs": inputs, "outputs": outputs})
}

/// Write a Genie bundle of the same weights as [`write_bundle`]'s into `dir`: one context
/// binary holding a Genie-named graph per AR in `ars` (context `s.ctx`), the tokenizer and
/// `genie_config.json` (no bos-token, so prompts match a manifest bundle's); returns the
/// config path.
pub fn write_genie_bundle(dir: &Path, s: &SynthSpec, ars: &[usize]) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let w = weights(s);
    let graphs: Vec<Value> = ars.iter().map(|&ar| genie_graph(s, ar, s.ctx)).collect();
    let bin = format!("{}_genie.bin", s.name);
    write_atomic(&dir.join(&bin), &context_binary(s, &graphs, &w, |_| true))?;
    write_atomic(
        &dir.join("tokenizer.json"),
        tiny_tokenizer_json().as_bytes(),
    )?;
    let cfg = json!({"dialog": {
        "version": 1, "type": "basic",
        "context": {"version": 1, "size": s.ctx, "n-vocab": s.vocab, "eos-token": s.eos},
        "tokenizer": {"version": 1, "path": "tokenizer.json"},
        "engine": {"version": 1, "n-threads": 1,
            "backend": {"version": 1, "type": "QnnHtp",
                "QnnHtp": {"version": 1, "kv-dim": s.head_dim}},
            "model": {"version": 1, "type": "binary",
                "binary": {"version": 1, "ctx-bins": [bin]},
                "positional-encoding": {"type": "rope", "rope-dim": s.head_dim / 2,
                    "rope-theta": s.rope_theta}}}}});
    let path = dir.join("genie_config.json");
    write_atomic(
        &path,
        serde_json::to_string_pretty(&cfg).expect("json").as_bytes(),
    )?;
    Ok(path)
}

/// The GPT-2 byte-to-character map used by byte-level BPE vocabularies.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = ('!' as u32..='~' as u32).collect();
    printable.extend('¡' as u32..='¬' as u32);
    printable.extend('®' as u32..='ÿ' as u32);
    let mut map = vec!['\0'; 256];
    let mut extra = 0;
    for b in 0..256u32 {
        map[b as usize] = if printable.contains(&b) {
            char::from_u32(b).unwrap_or('?')
        } else {
            extra += 1;
            char::from_u32(255 + extra).unwrap_or('?')
        };
    }
    map
}

/// Vocabulary size of [`tiny_tokenizer_json`]: 256 byte tokens, then `<|bos|>`, `<|eos|>`.
pub const TINY_VOCAB: usize = 258;

/// A byte-level BPE tokenizer of `vocab` tokens (at least 258): the 256 byte tokens, then
/// merged tokens, each the concatenation of two earlier ones with its merge rule, then
/// `<|bos|>` and `<|eos|>` as the last two ids. Its size and merge count resemble a real
/// 150k-vocabulary tokenizer, so loading it costs what loading a real one costs.
pub fn synthetic_bpe_tokenizer_json(vocab: usize, seed: u64) -> String {
    let chars = byte_chars();
    let mut toks: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    let mut seen: std::collections::HashSet<String> = toks.iter().cloned().collect();
    let mut merges = Vec::new();
    let mut rng = Rng::new(seed);
    let n_merged = vocab.saturating_sub(258);
    // Printable ASCII letters are the usual merge material; bias picks to short tokens.
    let letters: Vec<usize> = (b'a'..=b'z')
        .chain(b'A'..=b'Z')
        .map(|b| b as usize)
        .collect();
    while merges.len() < n_merged {
        let pick = |rng: &mut Rng, n: usize| -> usize {
            let r = rng.next_u64();
            if r % 3 == 0 {
                letters[(r >> 8) as usize % letters.len()]
            } else {
                // Quadratic bias toward earlier (shorter) tokens.
                let u = ((r >> 11) as f64) / ((1u64 << 53) as f64);
                ((u * u) * n as f64) as usize
            }
        };
        let a = pick(&mut rng, toks.len());
        let b = pick(&mut rng, toks.len());
        let t = format!("{}{}", toks[a], toks[b]);
        if t.chars().count() > 16 || !seen.insert(t.clone()) {
            continue;
        }
        merges.push(json!(format!("{} {}", toks[a], toks[b])));
        toks.push(t);
    }
    let vocab_map: serde_json::Map<String, Value> = toks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    let n = toks.len();
    let added = |id: usize, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": true})
    };
    json!({
        "version": "1.0",
        "truncation": null, "padding": null,
        "added_tokens": [added(n, "<|bos|>"), added(n + 1, "<|eos|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab_map, "merges": merges}
    })
    .to_string()
}

/// A byte-level BPE tokenizer with no merges: every UTF-8 byte is one token.
pub fn tiny_tokenizer_json() -> String {
    let chars = byte_chars();
    let vocab: serde_json::Map<String, Value> = chars
        .iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), json!(i)))
        .collect();
    let added = |id: usize, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": true})
    };
    json!({
        "version": "1.0",
        "truncation": null, "padding": null,
        "added_tokens": [added(256, "<|bos|>"), added(257, "<|eos|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []}
    })
    .to_string()
}

/// Null-compute synthetic bundles of the two reference shapes of the host-overhead
/// benchmark: `deepseek-1.5b` (V=151,936, H=1536, L=28, 12/2 heads, head_dim 128, qwen2) and
/// `llama-1b` (V=128,256, H=2048, L=16, 32/8 heads, head_dim 64). `io` is the graph I/O
/// dtype (f16 or ufixed16); the embedding table is f16 and the tokenizer has the full
/// vocabulary, as in the seed bundles. `tiny` (V=1024, H=64, L=2) is for smoke tests.
pub fn preset(shape: &str, io: &str, ctx: usize) -> Option<SynthSpec> {
    let base = SynthSpec {
        io: io.into(),
        ctx,
        prefill: None,
        null_compute: true,
        embed_f16: true,
        ..Default::default()
    };
    let s = match shape {
        "deepseek-1.5b" => SynthSpec {
            name: format!("ds15b_{io}_c{ctx}"),
            arch: "qwen2".into(),
            vocab: 151_936,
            hidden: 1536,
            n_layers: 28,
            n_heads: 12,
            n_kv_heads: 2,
            head_dim: 128,
            ffn: 8960,
            rope_theta: 10000.0,
            ..base
        },
        // A small shape for smoke tests of the harness (seconds, not minutes).
        "tiny" => SynthSpec {
            name: format!("tiny_{io}_c{ctx}"),
            arch: "llama".into(),
            vocab: 1024,
            hidden: 64,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            ffn: 128,
            rope_theta: 10000.0,
            ..base
        },
        // Gemma-3-270M: five sliding layers (window 512, base 1e4) to one global (1e6).
        "gemma3-270m" => SynthSpec {
            name: format!("gemma3_270m_{io}_c{ctx}"),
            arch: "gemma3".into(),
            vocab: 262_144,
            hidden: 640,
            n_layers: 18,
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: 256,
            ffn: 2048,
            rope_theta: 1_000_000.0,
            layer_types: (0..18)
                .map(|i| {
                    if i % 6 == 5 {
                        "full_attention"
                    } else {
                        "sliding_attention"
                    }
                    .to_string()
                })
                .collect(),
            sliding_window: Some(512.min(ctx)),
            ..base
        },
        "llama-1b" => SynthSpec {
            name: format!("llama1b_{io}_c{ctx}"),
            arch: "llama".into(),
            vocab: 128_256,
            hidden: 2048,
            n_layers: 16,
            n_heads: 32,
            n_kv_heads: 8,
            head_dim: 64,
            ffn: 8192,
            rope_theta: 500000.0,
            ..base
        },
        _ => return None,
    };
    Some(SynthSpec {
        eos: (s.vocab - 1) as u32,
        tokenizer_vocab: Some(s.vocab),
        embed_file: Some(format!("{shape}_embed_f16.bin")),
        ..s
    })
}
