//! KV cache row addressing for the layouts graphs use, and row copies between tensors of
//! possibly different dtypes and layouts: the one K/V copy routine of the runner (new rows
//! into the cache, and a whole cache from one step's past inputs to another's). Work per
//! copied row is O(K), never O(C).

use crate::ops::convert::{Typed, TypedMut};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayout {
    /// [rows, n_kv * head_dim]
    PosMajor,
    /// [n_kv, rows, head_dim]
    HeadMajor,
    /// [n_kv, head_dim, rows]: keys transposed, as Genie's graphs take them.
    DimMajor,
}

/// Shape facts of one K or V tensor.
#[derive(Debug, Clone, Copy)]
pub struct KvShape {
    pub layout: KvLayout,
    /// Number of positions the tensor holds (C for a cache, P for a prefill output, 1 for a
    /// decode output).
    pub rows: usize,
    pub n_kv: usize,
    pub head_dim: usize,
}

impl KvShape {
    /// Infer the layout from a tensor's dims: [rows, K] (or [1, rows, K]) is position-major,
    /// [n_kv, rows, head_dim] (or with a leading 1) head-major; a bare [K] is one row.
    pub fn from_dims(dims: &[u32], n_kv: usize, head_dim: usize) -> Option<KvShape> {
        let d: Vec<usize> = dims
            .iter()
            .map(|&x| x as usize)
            .skip_while(|&x| x == 1)
            .collect();
        let k = n_kv * head_dim;
        let (layout, rows) = match d.as_slice() {
            [] if k == 1 => (KvLayout::PosMajor, 1),
            [kk] if *kk == k => (KvLayout::PosMajor, 1),
            [r, kk] if *kk == k => (KvLayout::PosMajor, *r),
            [g, r, h] if *g == n_kv && *h == head_dim => (KvLayout::HeadMajor, *r),
            [g, h] if *g == n_kv && *h == head_dim => (KvLayout::HeadMajor, 1),
            _ => return None,
        };
        Some(KvShape {
            layout,
            rows,
            n_kv,
            head_dim,
        })
    }

    /// Element offset of element `d` of KV head `g` at position `row`.
    fn offset(&self, row: usize, g: usize, d: usize) -> usize {
        match self.layout {
            KvLayout::PosMajor => (row * self.n_kv + g) * self.head_dim + d,
            KvLayout::HeadMajor => (g * self.rows + row) * self.head_dim + d,
            KvLayout::DimMajor => (g * self.head_dim + d) * self.rows + row,
        }
    }
}

/// Call `f(src_offset, dst_offset, len)` for contiguous runs covering rows
/// `src_row0..src_row0+n` of `ss` into `dst_row0..` of `ds`: a whole position when both are
/// position-major, a head's row when neither is transposed, `n` rows of one (head, dim)
/// when both are, one element otherwise.
fn for_each_run(
    (ss, src_row0): (&KvShape, usize),
    (ds, dst_row0): (&KvShape, usize),
    n: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    let (hd, heads) = (ss.head_dim, ss.n_kv);
    use KvLayout::*;
    match (ss.layout, ds.layout) {
        (PosMajor, PosMajor) => {
            let k = heads * hd;
            for r in 0..n {
                f(
                    ss.offset(src_row0 + r, 0, 0),
                    ds.offset(dst_row0 + r, 0, 0),
                    k,
                );
            }
        }
        (DimMajor, DimMajor) => {
            for g in 0..heads {
                for d in 0..hd {
                    f(ss.offset(src_row0, g, d), ds.offset(dst_row0, g, d), n);
                }
            }
        }
        (a, b) if a != DimMajor && b != DimMajor => {
            for r in 0..n {
                for g in 0..heads {
                    f(
                        ss.offset(src_row0 + r, g, 0),
                        ds.offset(dst_row0 + r, g, 0),
                        hd,
                    );
                }
            }
        }
        _ => {
            for r in 0..n {
                for g in 0..heads {
                    for d in 0..hd {
                        f(
                            ss.offset(src_row0 + r, g, d),
                            ds.offset(dst_row0 + r, g, d),
                            1,
                        );
                    }
                }
            }
        }
    }
}

/// Copy positions `src_row0..src_row0+n` of `src` into `dst_row0..` of `dst`: element
/// copies when both sides share an encoding, through f32 (`scratch`) when they differ.
pub fn copy_rows(
    (src, ss, src_row0): (&Typed<'_>, &KvShape, usize),
    (dst, ds, dst_row0): (&mut TypedMut<'_>, &KvShape, usize),
    n: usize,
    scratch: &mut Vec<f32>,
) {
    for_each_run((ss, src_row0), (ds, dst_row0), n, |so, do_, len| {
        match (src, &mut *dst) {
            (Typed::F32(s), TypedMut::F32(d)) => {
                d[do_..do_ + len].copy_from_slice(&s[so..so + len])
            }
            (Typed::F16(s), TypedMut::F16(d)) => {
                d[do_..do_ + len].copy_from_slice(&s[so..so + len])
            }
            (Typed::U16(s, qs), TypedMut::U16(d, qd)) if qs == qd => {
                d[do_..do_ + len].copy_from_slice(&s[so..so + len])
            }
            (Typed::I16(s, qs), TypedMut::I16(d, qd)) if qs == qd => {
                d[do_..do_ + len].copy_from_slice(&s[so..so + len])
            }
            (Typed::U8(s, qs), TypedMut::U8(d, qd)) if qs == qd => {
                d[do_..do_ + len].copy_from_slice(&s[so..so + len])
            }
            (Typed::I8(s, qs), TypedMut::I8(d, qd)) if qs == qd => {
                d[do_..do_ + len].copy_from_slice(&s[so..so + len])
            }
            (src, dst) => {
                scratch.resize(len, 0.0);
                src.read_f32(so, scratch);
                dst.write_f32(do_, scratch);
            }
        }
    });
}

/// Set positions `row0..row0+n` of `dst` to real 0: for fixed point the code `-offset`
/// (QNN: real = (q + offset) * scale), the value of a slot nothing has written yet. The
/// graphs mask such slots, but a quantized softmax can still give them a few codes of
/// weight, so what the values hold there leaks into the output: real 0 adds nothing.
/// (libGenie.so fills uint8 K/V with 128, which is this value for the symmetric encodings
/// (offset -128) Qualcomm's tools give K/V.)
pub fn clear_rows(dst: &mut TypedMut<'_>, ds: &KvShape, row0: usize, n: usize) {
    let n = n.min(ds.rows.saturating_sub(row0));
    for_each_run((ds, row0), (ds, row0), n, |_, at, len| {
        dst.fill(at, len, 0.0)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Never-written slots hold real 0: for QNN fixed point (real = (q + offset) * scale)
    /// the code -offset, here 134 and 122 as in a w8a16 Genie bundle's uint8 K/V (not the
    /// raw 0 of a fresh buffer, which is real -134 * scale: with raw-0 V slots the x86 HTP
    /// backend gave other logits than python -m qhx_export.verify.genie_loop, whose slots hold real 0, on the
    /// same binaries, and another greedy id than libGenie.so). Other slots stay as they were.
    #[test]
    fn clears_slots_to_the_zero_point() {
        use crate::ops::convert::Quant;
        let shape = |layout| KvShape {
            layout,
            rows: 4,
            n_kv: 1,
            head_dim: 2,
        };
        // Keys [n_kv, head_dim, rows]: slots 1..3 of both dims.
        let mut k = vec![7u8; 8];
        let q = Quant {
            scale: 0.031_748_787,
            offset: -134,
        };
        clear_rows(
            &mut TypedMut::U8(&mut k, q),
            &shape(KvLayout::DimMajor),
            1,
            2,
        );
        assert_eq!(k, vec![7, 134, 134, 7, 7, 134, 134, 7]);
        // Values [n_kv, rows, head_dim], uint16; a range past the end is clamped.
        let mut v = vec![9u16; 8];
        let q = Quant {
            scale: 0.034_488_235,
            offset: -122,
        };
        clear_rows(
            &mut TypedMut::U16(&mut v, q),
            &shape(KvLayout::HeadMajor),
            3,
            5,
        );
        assert_eq!(v, vec![9, 9, 9, 9, 9, 9, 122, 122]);
        let mut f = vec![1.5f32; 8];
        clear_rows(&mut TypedMut::F32(&mut f), &shape(KvLayout::PosMajor), 0, 1);
        assert_eq!(f, vec![0.0, 0.0, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5]);
    }

    #[test]
    fn infers_layouts() {
        let s = KvShape::from_dims(&[512, 128], 2, 64).unwrap();
        assert_eq!((s.layout, s.rows), (KvLayout::PosMajor, 512));
        let s = KvShape::from_dims(&[1, 2, 512, 64], 2, 64).unwrap();
        assert_eq!((s.layout, s.rows), (KvLayout::HeadMajor, 512));
        let s = KvShape::from_dims(&[128], 2, 64).unwrap();
        assert_eq!((s.layout, s.rows), (KvLayout::PosMajor, 1));
        assert!(KvShape::from_dims(&[512, 100], 2, 64).is_none());
    }

    #[test]
    fn copies_between_layouts_and_dtypes() {
        // Source: position-major [2 rows, K=4] (n_kv 2, hd 2); dest head-major [2, 3, 2] f16.
        let src: Vec<f32> = (0..8).map(|x| x as f32).collect();
        let ss = KvShape::from_dims(&[2, 4], 2, 2).unwrap();
        let mut dst = vec![half::f16::ZERO; 12];
        let ds = KvShape::from_dims(&[2, 3, 2], 2, 2).unwrap();
        let mut scratch = Vec::new();
        copy_rows(
            (&Typed::F32(&src), &ss, 0),
            (&mut TypedMut::F16(&mut dst), &ds, 1),
            2,
            &mut scratch,
        );
        let got: Vec<f32> = dst.iter().map(|v| v.to_f32()).collect();
        // head 0: rows 1,2 = [0,1],[4,5]; head 1: rows 1,2 = [2,3],[6,7]
        assert_eq!(got, vec![0., 0., 0., 1., 4., 5., 0., 0., 2., 3., 6., 7.]);
    }

    #[test]
    fn copies_transposed_keys_in_runs_and_across_layouts() {
        // [n_kv 2, head_dim 2, rows 3] (Genie keys), rows 0..2 holding values r*10 + g*2 + d.
        let shape = |layout, rows| KvShape {
            layout,
            rows,
            n_kv: 2,
            head_dim: 2,
        };
        let src_s = shape(KvLayout::DimMajor, 2);
        let mut src = vec![0f32; 8];
        for r in 0..2 {
            for g in 0..2 {
                for d in 0..2 {
                    src[src_s.offset(r, g, d)] = (r * 10 + g * 2 + d) as f32;
                }
            }
        }
        let mut scratch = Vec::new();
        // Into a transposed cache of 4 rows at slot 1: runs of 2 rows per (head, dim).
        let dst_s = shape(KvLayout::DimMajor, 4);
        let mut dst = vec![-1f32; 16];
        copy_rows(
            (&Typed::F32(&src), &src_s, 0),
            (&mut TypedMut::F32(&mut dst), &dst_s, 1),
            2,
            &mut scratch,
        );
        assert_eq!(&dst[..4], &[-1.0, 0.0, 10.0, -1.0]);
        assert_eq!(&dst[12..], &[-1.0, 3.0, 13.0, -1.0]);
        // Into a position-major f16 cache: element by element, converted.
        let pm = shape(KvLayout::PosMajor, 2);
        let mut h = vec![half::f16::ZERO; 8];
        copy_rows(
            (&Typed::F32(&src), &src_s, 0),
            (&mut TypedMut::F16(&mut h), &pm, 0),
            2,
            &mut scratch,
        );
        let got: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
        assert_eq!(got, vec![0., 1., 2., 3., 10., 11., 12., 13.]);
    }
}
