//! Attention masks, the one implementation for every plan: a mask is `rows` (the step's
//! tokens) by `past` cache columns, then (when `own`) the step's own columns. Real tokens
//! sit in rows `off..off + n`; a real row sees the first `pos` cache columns and its own
//! columns from `off` up to itself (causal); a padding row sees only its own column, so no
//! softmax row is empty. Values follow the mask's style: additive (0 / the most negative
//! value the element type carries) or Genie's (float 0 / -1000, fixed-point raw codes
//! max / 0).

use crate::error::{Error, Result};
use crate::ops::convert::TypedMut;

/// How a mask's values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskStyle {
    /// Added to attention scores: 0 where visible, the most negative value the element type
    /// carries where hidden (quantized like any other value).
    Additive,
    /// Genie's convention: float 0 / -1000, fixed-point raw codes max (visible) / 0.
    Genie,
}

/// Geometry of a mask input: `rows` (the step's tokens) by `past` cache columns, then,
/// when `own`, the step's own `rows` columns (causal among themselves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskSpec {
    pub past: usize,
    pub own: bool,
    pub style: MaskStyle,
    /// A one-row mask over cache slots kept across steps: slots open as rows enter the
    /// cache and close on rewind, so a step writes O(1) of it instead of O(C).
    pub persistent: bool,
    /// Sliding-window attention: a token sees only the `window` positions ending at
    /// itself (HF's `kv > q - window`). A persistent one closes one slot per token.
    pub window: Option<usize>,
}

/// Genie's "masked" value in float masks. Not -inf: graphs built for Genie may test
/// `mask < -500` or add the mask before a floor, and on the HTP an fp16 -inf there gave
/// different logits than -1000 (seen on the x86 HTP backend).
pub const FLOAT_MASKED: f32 = -1000.0;

/// One element value, encoded for the tensor: a float (quantized like any value) or a raw
/// fixed-point code.
#[derive(Debug, Clone, Copy)]
enum Value {
    Float(f32),
    Code(u16),
}

/// (visible, hidden) values of a mask tensor in `style`.
fn values(t: &TypedMut<'_>, style: MaskStyle) -> Result<(Value, Value)> {
    Ok(match style {
        MaskStyle::Additive => (Value::Float(0.0), Value::Float(t.mask_neg())),
        MaskStyle::Genie => match t {
            TypedMut::F32(_) | TypedMut::F16(_) => (Value::Float(0.0), Value::Float(FLOAT_MASKED)),
            TypedMut::U16(..) => (Value::Code(u16::MAX), Value::Code(0)),
            TypedMut::U8(..) => (Value::Code(u8::MAX as u16), Value::Code(0)),
            _ => {
                return Err(Error::Graph {
                    graph: "attention_mask".into(),
                    msg: "only float32/16 and uint16/uint8 masks are supported".into(),
                })
            }
        },
    })
}

fn fill(t: &mut TypedMut<'_>, at: usize, n: usize, v: Value) {
    if n == 0 {
        return;
    }
    match (v, t) {
        (Value::Float(x), t) => t.fill(at, n, x),
        (Value::Code(c), TypedMut::U16(d, _)) => d[at..at + n].fill(c),
        (Value::Code(c), TypedMut::U8(d, _)) => d[at..at + n].fill(c as u8),
        // `values` gives codes only to 16- and 8-bit unsigned tensors.
        (Value::Code(_), _) => {}
    }
}

/// Columns of one mask row.
pub fn cols(spec: &MaskSpec, rows: usize) -> usize {
    spec.past + if spec.own { rows } else { 0 }
}

/// The first position a token at `q` sees through a window of `w` (HF: `kv > q - w`).
pub fn window_start(q: usize, w: usize) -> usize {
    (q + 1).saturating_sub(w)
}

/// Write a whole step mask: `rows` rows, real tokens in rows `off..off + n`, `pos` cache
/// columns filled (from the window's start when the mask has one).
pub fn write(
    t: &mut TypedMut<'_>,
    spec: &MaskSpec,
    rows: usize,
    pos: usize,
    off: usize,
    n: usize,
) -> Result<()> {
    let (open, hidden) = values(t, spec.style)?;
    let cols = cols(spec, rows);
    let past = spec.past;
    for r in 0..rows {
        let at = r * cols;
        fill(t, at, cols, hidden);
        let real = r >= off && r < off + n;
        // Positions before `lo` are outside this row's window.
        let lo = match spec.window {
            Some(w) if real => window_start(pos + (r - off), w),
            _ => 0,
        };
        if real {
            let end = pos.min(past);
            fill(t, at + lo.min(end), end - lo.min(end), open);
        }
        if spec.own {
            let first = if real {
                off + lo.saturating_sub(pos)
            } else {
                r
            };
            fill(t, at + past + first, r + 1 - first, open);
        }
    }
    Ok(())
}

/// Open (or hide) cache slots `at..at + n` of a persistent one-row mask.
pub fn set_slots(
    t: &mut TypedMut<'_>,
    spec: &MaskSpec,
    at: usize,
    n: usize,
    visible: bool,
) -> Result<()> {
    let (open, hidden) = values(t, spec.style)?;
    fill(t, at, n, if visible { open } else { hidden });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    const N: f32 = f32::NEG_INFINITY;

    /// A window of 3 over 2 cached positions and a 3-row chunk: each row sees itself and
    /// the two positions before it, in the cache or in the chunk.
    #[test]
    fn a_window_hides_what_slid_out() {
        let s = MaskSpec {
            window: Some(3),
            ..spec(2, true, MaskStyle::Additive)
        };
        let mut m = vec![7f32; 3 * 5];
        write(&mut TypedMut::F32(&mut m), &s, 3, 2, 0, 3).unwrap();
        #[rustfmt::skip]
        let want = [
            // cache 0, 1 | own 0 (pos 2), 1 (pos 3), 2 (pos 4)
            0., 0., 0., N, N,
            N,  0., 0., 0., N,
            N,  N,  0., 0., 0.,
        ];
        assert_eq!(m, want);
        assert_eq!(window_start(0, 3), 0);
        assert_eq!(window_start(4, 3), 2);
    }

    fn spec(past: usize, own: bool, style: MaskStyle) -> MaskSpec {
        MaskSpec {
            past,
            own,
            style,
            persistent: false,
            window: None,
        }
    }

    fn additive(rows: usize, past: usize, pos: usize, off: usize, n: usize) -> Vec<f32> {
        let s = spec(past, true, MaskStyle::Additive);
        let mut m = vec![7.0f32; rows * cols(&s, rows)];
        write(&mut TypedMut::F32(&mut m), &s, rows, pos, off, n).unwrap();
        m
    }

    #[test]
    fn prefill_without_past_is_lower_triangular() {
        let m = additive(3, 0, 0, 0, 3);
        assert_eq!(m, vec![0.0, N, N, 0.0, 0.0, N, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn prefill_with_past_opens_cached_columns() {
        // 2 cached slots of which 1 is filled (pos 1), chunk of 2 rows.
        let m = additive(2, 2, 1, 0, 2);
        assert_eq!(m, vec![0.0, N, 0.0, N, 0.0, N, 0.0, 0.0]);
    }

    #[test]
    fn right_padding_rows_see_only_themselves() {
        // 3 rows, one real token: rows 1 and 2 are padding.
        let m = additive(3, 1, 1, 0, 1);
        assert_eq!(m, vec![0.0, 0.0, N, N, N, N, 0.0, N, N, N, N, 0.0]);
    }

    #[test]
    fn genie_rows_are_causal_with_left_padding() {
        // AR 3, CL 8: past 5 slots, 2 in use; one padding row then two real tokens.
        let s = spec(5, true, MaskStyle::Genie);
        let mut b = vec![9u8; 24];
        let q = crate::ops::convert::Quant {
            scale: 1.0,
            offset: 0,
        };
        write(&mut TypedMut::U8(&mut b, q), &s, 3, 2, 1, 2).unwrap();
        let rows: Vec<String> = b
            .chunks(8)
            .map(|r| {
                r.iter()
                    .map(|&x| if x == 255 { '1' } else { '0' })
                    .collect()
            })
            .collect();
        assert_eq!(rows, ["00000100", "11000010", "11000011"]);
        // Float Genie masks use -1000, not -inf.
        let mut f = vec![0f32; 24];
        write(&mut TypedMut::F32(&mut f), &s, 3, 2, 1, 2).unwrap();
        assert_eq!(
            &f[..6],
            &[
                FLOAT_MASKED,
                FLOAT_MASKED,
                FLOAT_MASKED,
                FLOAT_MASKED,
                FLOAT_MASKED,
                0.0
            ]
        );
    }

    #[test]
    fn persistent_slots_open_and_close() {
        let s = MaskSpec {
            past: 4,
            own: false,
            style: MaskStyle::Additive,
            persistent: true,
            window: None,
        };
        let mut m = vec![0f32; 4];
        let mut t = TypedMut::F32(&mut m);
        set_slots(&mut t, &s, 0, 4, false).unwrap();
        set_slots(&mut t, &s, 0, 2, true).unwrap();
        assert_eq!(m, vec![0.0, 0.0, N, N]);
    }
}
