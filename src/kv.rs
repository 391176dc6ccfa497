//! KV cache row addressing for the two layouts graphs use, and row copies between
//! tensors of possibly different dtypes. Work per copied row is O(K), never O(C).

use crate::ops::convert::{Typed, TypedMut};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayout {
    /// [rows, n_kv * head_dim]
    PosMajor,
    /// [n_kv, rows, head_dim]
    HeadMajor,
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

    /// Element offset of KV head `g` at position `row` (head_dim elements follow).
    fn offset(&self, row: usize, g: usize) -> usize {
        match self.layout {
            KvLayout::PosMajor => (row * self.n_kv + g) * self.head_dim,
            KvLayout::HeadMajor => (g * self.rows + row) * self.head_dim,
        }
    }
}

/// Copy positions `src_row0..src_row0+n` of `src` into `dst_row0..` of `dst`, converting
/// through f32 (`scratch`, head_dim or K floats) when the element types differ.
pub fn copy_rows(
    (src, ss, src_row0): (&Typed<'_>, &KvShape, usize),
    (dst, ds, dst_row0): (&mut TypedMut<'_>, &KvShape, usize),
    n: usize,
    scratch: &mut Vec<f32>,
) {
    // Position-major on both sides: a position is one contiguous run of K elements.
    let whole = ss.layout == KvLayout::PosMajor && ds.layout == KvLayout::PosMajor;
    let (heads, len) = if whole {
        (1, ss.n_kv * ss.head_dim)
    } else {
        (ss.n_kv, ss.head_dim)
    };
    for r in 0..n {
        for g in 0..heads {
            let (so, do_) = (ss.offset(src_row0 + r, g), ds.offset(dst_row0 + r, g));
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
                (Typed::U8(s, qs), TypedMut::U8(d, qd)) if qs == qd => {
                    d[do_..do_ + len].copy_from_slice(&s[so..so + len])
                }
                (src, dst) => {
                    scratch.resize(len, 0.0);
                    src.read_f32(so, scratch);
                    dst.write_f32(do_, scratch);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
