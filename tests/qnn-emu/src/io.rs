//! Conversion between graph I/O buffers and f32, per the tensor's dtype and quant params.

use qnn_sys::dtype;

#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub id: u32,
    pub name: String,
    pub dtype: u32,
    pub dims: Vec<u32>,
    pub scale: f32,
    pub offset: i32,
}

impl TensorSpec {
    pub fn elems(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }
    pub fn bytes(&self) -> usize {
        self.elems() * dtype::size_of(self.dtype).unwrap_or(0)
    }
    pub fn is_quantized(&self) -> bool {
        matches!(
            self.dtype,
            dtype::UFIXED_POINT_16
                | dtype::UFIXED_POINT_8
                | dtype::SFIXED_POINT_16
                | dtype::SFIXED_POINT_8
        )
    }
}

/// Read a buffer of `spec`'s dtype into f32.
pub fn to_f32(spec: &TensorSpec, buf: &[u8]) -> Vec<f32> {
    let (s, o) = (spec.scale, spec.offset as f32);
    match spec.dtype {
        dtype::FLOAT_32 => buf
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        dtype::FLOAT_16 => buf
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        dtype::UFIXED_POINT_16 => buf
            .chunks_exact(2)
            .map(|b| (u16::from_le_bytes([b[0], b[1]]) as f32 + o) * s)
            .collect(),
        dtype::SFIXED_POINT_16 => buf
            .chunks_exact(2)
            .map(|b| (i16::from_le_bytes([b[0], b[1]]) as f32 + o) * s)
            .collect(),
        dtype::UFIXED_POINT_8 => buf.iter().map(|&b| (b as f32 + o) * s).collect(),
        dtype::SFIXED_POINT_8 => buf.iter().map(|&b| (b as i8 as f32 + o) * s).collect(),
        dtype::INT_32 => buf
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as f32)
            .collect(),
        _ => vec![0.0; spec.elems()],
    }
}

/// Write f32 values into a buffer of `spec`'s dtype (round-to-nearest, saturating).
pub fn from_f32(spec: &TensorSpec, vals: &[f32], buf: &mut [u8]) {
    let (s, o) = (spec.scale, spec.offset as f32);
    let q = |v: f32, lo: f32, hi: f32| ((v / s).round() - o).clamp(lo, hi);
    match spec.dtype {
        dtype::FLOAT_32 => {
            for (b, v) in buf.chunks_exact_mut(4).zip(vals) {
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
        dtype::FLOAT_16 => {
            for (b, v) in buf.chunks_exact_mut(2).zip(vals) {
                b.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
            }
        }
        dtype::UFIXED_POINT_16 => {
            for (b, v) in buf.chunks_exact_mut(2).zip(vals) {
                b.copy_from_slice(&(q(*v, 0.0, 65535.0) as u16).to_le_bytes());
            }
        }
        dtype::SFIXED_POINT_16 => {
            for (b, v) in buf.chunks_exact_mut(2).zip(vals) {
                b.copy_from_slice(&(q(*v, -32768.0, 32767.0) as i16).to_le_bytes());
            }
        }
        dtype::UFIXED_POINT_8 => {
            for (b, v) in buf.iter_mut().zip(vals) {
                *b = q(*v, 0.0, 255.0) as u8;
            }
        }
        dtype::SFIXED_POINT_8 => {
            for (b, v) in buf.iter_mut().zip(vals) {
                *b = q(*v, -128.0, 127.0) as i8 as u8;
            }
        }
        dtype::INT_32 => {
            for (b, v) in buf.chunks_exact_mut(4).zip(vals) {
                b.copy_from_slice(&(*v as i32).to_le_bytes());
            }
        }
        _ => {}
    }
}
