//! Element conversions between host f32 and graph I/O dtypes (f32, f16, QNN fixed point).
//!
//! QNN fixed point: real = (q + offset) * scale, so q = round(real / scale) - offset,
//! saturated to the type's range.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Quantization parameters of a fixed-point tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quant {
    pub scale: f32,
    pub offset: i32,
}

/// A typed view of a tensor buffer.
pub enum TypedMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    U16(&'a mut [u16], Quant),
    I16(&'a mut [i16], Quant),
    U8(&'a mut [u8], Quant),
    I8(&'a mut [i8], Quant),
    I32(&'a mut [i32]),
}

pub enum Typed<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    U16(&'a [u16], Quant),
    I16(&'a [i16], Quant),
    U8(&'a [u8], Quant),
    I8(&'a [i8], Quant),
    I32(&'a [i32]),
}

#[inline]
fn quantize(v: f32, q: Quant, lo: f32, hi: f32) -> f32 {
    ((v / q.scale).round() - q.offset as f32).clamp(lo, hi)
}

#[inline]
fn dequantize(x: f32, q: Quant) -> f32 {
    (x + q.offset as f32) * q.scale
}

impl TypedMut<'_> {
    pub fn len(&self) -> usize {
        match self {
            TypedMut::F32(s) => s.len(),
            TypedMut::F16(s) => s.len(),
            TypedMut::U16(s, _) => s.len(),
            TypedMut::I16(s, _) => s.len(),
            TypedMut::U8(s, _) => s.len(),
            TypedMut::I8(s, _) => s.len(),
            TypedMut::I32(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Encode `src` into elements `at..at + src.len()`.
    pub fn write_f32(&mut self, at: usize, src: &[f32]) {
        let r = at..at + src.len();
        match self {
            TypedMut::F32(d) => d[r].copy_from_slice(src),
            TypedMut::F16(d) => d[r].convert_from_f32_slice(src),
            TypedMut::U16(d, q) => {
                for (o, v) in d[r].iter_mut().zip(src) {
                    *o = quantize(*v, *q, 0.0, 65535.0) as u16;
                }
            }
            TypedMut::I16(d, q) => {
                for (o, v) in d[r].iter_mut().zip(src) {
                    *o = quantize(*v, *q, -32768.0, 32767.0) as i16;
                }
            }
            TypedMut::U8(d, q) => {
                for (o, v) in d[r].iter_mut().zip(src) {
                    *o = quantize(*v, *q, 0.0, 255.0) as u8;
                }
            }
            TypedMut::I8(d, q) => {
                for (o, v) in d[r].iter_mut().zip(src) {
                    *o = quantize(*v, *q, -128.0, 127.0) as i8;
                }
            }
            TypedMut::I32(d) => {
                for (o, v) in d[r].iter_mut().zip(src) {
                    *o = v.round() as i32;
                }
            }
        }
    }

    /// Fill elements `at..at + n` with one value.
    pub fn fill(&mut self, at: usize, n: usize, v: f32) {
        // Encode once, then splat the encoded element.
        match self {
            TypedMut::F32(d) => d[at..at + n].fill(v),
            TypedMut::F16(d) => d[at..at + n].fill(f16::from_f32(v)),
            TypedMut::U16(d, q) => d[at..at + n].fill(quantize(v, *q, 0.0, 65535.0) as u16),
            TypedMut::I16(d, q) => d[at..at + n].fill(quantize(v, *q, -32768.0, 32767.0) as i16),
            TypedMut::U8(d, q) => d[at..at + n].fill(quantize(v, *q, 0.0, 255.0) as u8),
            TypedMut::I8(d, q) => d[at..at + n].fill(quantize(v, *q, -128.0, 127.0) as i8),
            TypedMut::I32(d) => d[at..at + n].fill(v.round() as i32),
        }
    }

    /// The most negative value this element type can carry: the additive "hidden" mask.
    pub fn mask_neg(&self) -> f32 {
        match self {
            TypedMut::F32(_) | TypedMut::F16(_) => f32::NEG_INFINITY,
            TypedMut::U16(_, q) => dequantize(0.0, *q),
            TypedMut::I16(_, q) => dequantize(-32768.0, *q),
            TypedMut::U8(_, q) => dequantize(0.0, *q),
            TypedMut::I8(_, q) => dequantize(-128.0, *q),
            TypedMut::I32(_) => i32::MIN as f32,
        }
    }
}

impl<'a> Typed<'a> {
    /// Elements `at..at + n` (one row of a multi-row output).
    pub fn slice(&self, at: usize, n: usize) -> Typed<'a> {
        let r = at..at + n;
        match *self {
            Typed::F32(s) => Typed::F32(&s[r]),
            Typed::F16(s) => Typed::F16(&s[r]),
            Typed::U16(s, q) => Typed::U16(&s[r], q),
            Typed::I16(s, q) => Typed::I16(&s[r], q),
            Typed::U8(s, q) => Typed::U8(&s[r], q),
            Typed::I8(s, q) => Typed::I8(&s[r], q),
            Typed::I32(s) => Typed::I32(&s[r]),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Typed::F32(s) => s.len(),
            Typed::F16(s) => s.len(),
            Typed::U16(s, _) => s.len(),
            Typed::I16(s, _) => s.len(),
            Typed::U8(s, _) => s.len(),
            Typed::I8(s, _) => s.len(),
            Typed::I32(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decode elements `at..at + out.len()` into `out`.
    pub fn read_f32(&self, at: usize, out: &mut [f32]) {
        let r = at..at + out.len();
        match self {
            Typed::F32(s) => out.copy_from_slice(&s[r]),
            Typed::F16(s) => s[r].convert_to_f32_slice(out),
            Typed::U16(s, q) => out
                .iter_mut()
                .zip(&s[r])
                .for_each(|(o, x)| *o = dequantize(*x as f32, *q)),
            Typed::I16(s, q) => out
                .iter_mut()
                .zip(&s[r])
                .for_each(|(o, x)| *o = dequantize(*x as f32, *q)),
            Typed::U8(s, q) => out
                .iter_mut()
                .zip(&s[r])
                .for_each(|(o, x)| *o = dequantize(*x as f32, *q)),
            Typed::I8(s, q) => out
                .iter_mut()
                .zip(&s[r])
                .for_each(|(o, x)| *o = dequantize(*x as f32, *q)),
            Typed::I32(s) => out.iter_mut().zip(&s[r]).for_each(|(o, x)| *o = *x as f32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ufixed16_round_trip_within_half_step() {
        let q = Quant {
            scale: 0.001,
            offset: -30000,
        };
        let src = [-30.0f32, -1.2345, 0.0, 3.5, 35.0];
        let mut buf = [0u16; 5];
        TypedMut::U16(&mut buf, q).write_f32(0, &src);
        let mut back = [0f32; 5];
        Typed::U16(&buf, q).read_f32(0, &mut back);
        for (a, b) in src.iter().zip(&back) {
            let a = a.clamp(-30.0, 35.535);
            assert!((a - b).abs() <= 0.0005 + 1e-6, "{a} vs {b}");
        }
        // Saturation at both ends of the range.
        let mut one = [0u16; 2];
        TypedMut::U16(&mut one, q).write_f32(0, &[-1e9, 1e9]);
        assert_eq!(one, [0, 65535]);
    }

    #[test]
    fn qnn_offset_convention() {
        // real = (q + offset) * scale: q = 10 with offset -10 is real 0.
        let q = Quant {
            scale: 0.5,
            offset: -10,
        };
        let mut b = [0u8; 1];
        TypedMut::U8(&mut b, q).write_f32(0, &[0.0]);
        assert_eq!(b[0], 10);
        let mut out = [1f32];
        Typed::U8(&[12], q).read_f32(0, &mut out);
        assert_eq!(out[0], 1.0);
        assert_eq!(TypedMut::U8(&mut b, q).mask_neg(), -5.0);
    }

    #[test]
    fn f16_write_and_fill() {
        let mut b = [f16::ZERO; 4];
        let mut t = TypedMut::F16(&mut b);
        t.write_f32(1, &[1.5, -2.0]);
        t.fill(3, 1, f32::NEG_INFINITY);
        assert_eq!(b[1].to_f32(), 1.5);
        assert_eq!(b[2].to_f32(), -2.0);
        assert!(b[3].to_f32().is_infinite());
    }
}
