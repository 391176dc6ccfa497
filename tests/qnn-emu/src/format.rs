//! Parser for the emulator's context binary (see FORMAT.md).

use serde::Deserialize;

pub const MAGIC: &[u8; 8] = b"QHXEMUCB";
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Deserialize)]
pub struct ModelHeader {
    pub arch: String,
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub rms_eps: f32,
    /// One per layer: `full_attention` (default), `sliding_attention` or `conv`.
    #[serde(default)]
    pub layer_types: Vec<String>,
    /// Sliding layers' window; the host's `cmask_local` carries it, so only checked here.
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Multiplier of q·k scores (default 1/sqrt(head_dim); Gemma 3: query_pre_attn_scalar^-0.5).
    #[serde(default)]
    pub attn_scale: Option<f32>,
    /// FFN activation: `silu` (default) or `gelu_tanh`.
    #[serde(default)]
    pub act: Option<String>,
    /// Short-convolution taps of `conv` layers (LFM2's L_cache).
    #[serde(default)]
    pub conv_width: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TensorHeader {
    pub name: String,
    pub dtype: String,
    pub dims: Vec<u32>,
    #[serde(default = "one")]
    pub scale: f32,
    #[serde(default)]
    pub offset: i32,
}

fn one() -> f32 {
    1.0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GraphKind {
    Prefill,
    Decode,
    Lmhead,
    /// A Genie-named graph (see FORMAT.md): token ids in, logits and the step's K/V out.
    Genie,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum KvLayout {
    #[default]
    PosMajor,
    HeadMajor,
}

#[derive(Debug, Clone, Deserialize)]
pub struct GraphHeader {
    pub name: String,
    pub kind: GraphKind,
    #[serde(default = "one_usize")]
    pub seq: usize,
    #[serde(default)]
    pub ctx: usize,
    #[serde(default)]
    pub kv_layout: KvLayout,
    /// prefill/decode: apply the final RMSNorm (`output_norm.weight`) to `y` in-graph.
    #[serde(default)]
    pub final_norm: bool,
    /// lmhead: apply the final RMSNorm before the projection (off when the layer graphs do).
    #[serde(default = "yes")]
    pub norm: bool,
    pub inputs: Vec<TensorHeader>,
    pub outputs: Vec<TensorHeader>,
}

fn yes() -> bool {
    true
}

fn one_usize() -> usize {
    1
}

#[derive(Debug, Clone, Deserialize)]
pub struct WeightHeader {
    pub name: String,
    pub enc: String,
    pub shape: Vec<usize>,
    pub offset: usize,
    pub nbytes: usize,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Header {
    pub model: ModelHeader,
    #[serde(default)]
    pub soc_model: u32,
    #[serde(default)]
    pub dsp_arch: String,
    #[serde(default)]
    pub null_compute: bool,
    pub graphs: Vec<GraphHeader>,
    #[serde(default)]
    pub weights: Vec<WeightHeader>,
}

/// A parsed binary: header plus the data section (borrowed from the caller's buffer).
pub struct Parsed<'a> {
    pub header: Header,
    pub data: &'a [u8],
}

/// Parse and validate a context binary. Errors are human-readable reasons.
pub fn parse(buf: &[u8]) -> Result<Parsed<'_>, String> {
    if buf.len() < 16 {
        return Err(format!(
            "binary is {} bytes, shorter than the 16-byte preamble",
            buf.len()
        ));
    }
    if &buf[0..8] != MAGIC {
        return Err("bad magic (not a qnn-emu context binary)".into());
    }
    let version = u32::from_le_bytes(buf[8..12].try_into().unwrap());
    if version != FORMAT_VERSION {
        return Err(format!("unsupported format version {version}"));
    }
    let n = u32::from_le_bytes(buf[12..16].try_into().unwrap()) as usize;
    let end = 16usize
        .checked_add(n)
        .filter(|&e| e <= buf.len())
        .ok_or_else(|| format!("header length {n} runs past the end ({} bytes)", buf.len()))?;
    let header: Header =
        serde_json::from_slice(&buf[16..end]).map_err(|e| format!("header: {e}"))?;
    let data_start = end.div_ceil(64) * 64;
    let data = buf.get(data_start..).unwrap_or(&[]);
    validate(&header, data.len())?;
    Ok(Parsed { header, data })
}

fn validate(h: &Header, data_len: usize) -> Result<(), String> {
    let m = &h.model;
    if m.hidden == 0 || m.n_heads == 0 || m.n_kv_heads == 0 || m.head_dim == 0 || m.vocab == 0 {
        return Err("model dims must be positive".into());
    }
    if m.n_heads % m.n_kv_heads != 0 {
        return Err(format!(
            "n_heads {} not a multiple of n_kv_heads {}",
            m.n_heads, m.n_kv_heads
        ));
    }
    if m.head_dim % 2 != 0 {
        return Err("head_dim must be even".into());
    }
    if h.graphs.is_empty() {
        return Err("no graphs".into());
    }
    for g in &h.graphs {
        for t in g.inputs.iter().chain(&g.outputs) {
            if dtype_from_name(&t.dtype).is_none() {
                return Err(format!(
                    "graph {} tensor {}: unknown dtype {}",
                    g.name, t.name, t.dtype
                ));
            }
            if t.dims.contains(&0) {
                return Err(format!(
                    "graph {} tensor {}: zero dimension",
                    g.name, t.name
                ));
            }
        }
    }
    for w in &h.weights {
        let end = w
            .offset
            .checked_add(w.nbytes)
            .ok_or("weight offset overflow")?;
        if end > data_len {
            return Err(format!(
                "weight {} ends at {end} but the data section has {data_len} bytes (truncated binary?)",
                w.name
            ));
        }
        let elems: usize = w.shape.iter().product();
        let last = *w.shape.last().unwrap_or(&0);
        let want = match w.enc.as_str() {
            "f32" => elems * 4,
            "f16" => elems * 2,
            "q4_1" if last % 32 == 0 => elems / 32 * 20,
            "q8_0" if last % 32 == 0 => elems / 32 * 34,
            other => {
                return Err(format!(
                    "weight {}: bad encoding {other} for shape {:?}",
                    w.name, w.shape
                ))
            }
        };
        if want != w.nbytes {
            return Err(format!(
                "weight {}: {} bytes, expected {want}",
                w.name, w.nbytes
            ));
        }
    }
    Ok(())
}

/// Map our dtype names to QNN data types.
pub fn dtype_from_name(s: &str) -> Option<u32> {
    use qnn_sys::dtype::*;
    Some(match s {
        "f32" => FLOAT_32,
        "f16" => FLOAT_16,
        "ufixed16" => UFIXED_POINT_16,
        "ufixed8" => UFIXED_POINT_8,
        "sfixed16" => SFIXED_POINT_16,
        "sfixed8" => SFIXED_POINT_8,
        "int32" => INT_32,
        // Valid QNN types the host has no conversion for (bad-input tests).
        "bf16" => BFLOAT_16,
        "f64" => FLOAT_64,
        _ => return None,
    })
}

/// Dequantize one weight to f32 exactly as gguf-py (and so HF transformers) does.
pub fn dequantize(w: &WeightHeader, data: &[u8]) -> Vec<f32> {
    let bytes = &data[w.offset..w.offset + w.nbytes];
    let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32();
    match w.enc.as_str() {
        "f32" => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        "f16" => bytes.chunks_exact(2).map(f16).collect(),
        "q4_1" => {
            let mut out = Vec::with_capacity(bytes.len() / 20 * 32);
            for blk in bytes.chunks_exact(20) {
                let d = f16(&blk[0..2]);
                let m = f16(&blk[2..4]);
                let qs = &blk[4..20];
                let mut vals = [0f32; 32];
                for j in 0..16 {
                    vals[j] = d * (qs[j] & 0x0F) as f32 + m;
                    vals[j + 16] = d * (qs[j] >> 4) as f32 + m;
                }
                out.extend_from_slice(&vals);
            }
            out
        }
        "q8_0" => {
            let mut out = Vec::with_capacity(bytes.len() / 34 * 32);
            for blk in bytes.chunks_exact(34) {
                let d = f16(&blk[0..2]);
                out.extend(blk[2..34].iter().map(|&q| q as i8 as f32 * d));
            }
            out
        }
        _ => unreachable!("validated in parse"),
    }
}
