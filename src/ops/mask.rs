//! Additive attention masks: 0 where a key is visible, a very negative value where hidden.

/// Causal prefill mask [rows, cols] for a chunk of `n_valid` real rows starting at `pos0`,
/// with `past` cached columns in front (0 for a prefill without past inputs). Row i sees
/// past columns < pos0 and chunk columns <= i. Padded rows (i >= n_valid) still see the
/// diagonal so that no softmax row is empty.
pub fn prefill_causal(rows: usize, past: usize, pos0: usize, neg: f32) -> Vec<f32> {
    let cols = past + rows;
    let mut m = vec![neg; rows * cols];
    for i in 0..rows {
        let r = &mut m[i * cols..(i + 1) * cols];
        for v in r.iter_mut().take(pos0.min(past)) {
            *v = 0.0;
        }
        for v in &mut r[past..past + i + 1] {
            *v = 0.0;
        }
    }
    m
}

/// Decode mask [ctx]: the first `visible` cache slots are open.
pub fn decode_initial(ctx: usize, visible: usize, neg: f32) -> Vec<f32> {
    let mut m = vec![neg; ctx];
    for v in m.iter_mut().take(visible) {
        *v = 0.0;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    const N: f32 = f32::NEG_INFINITY;

    #[test]
    fn prefill_without_past_is_lower_triangular() {
        let m = prefill_causal(3, 0, 0, N);
        assert_eq!(m, vec![0.0, N, N, 0.0, 0.0, N, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn prefill_with_past_opens_cached_columns() {
        // 2 cached slots of which 1 is filled (pos0 = 1), chunk of 2 rows.
        let m = prefill_causal(2, 2, 1, N);
        assert_eq!(m, vec![0.0, N, 0.0, N, 0.0, N, 0.0, 0.0]);
    }

    #[test]
    fn decode_opens_prefix() {
        assert_eq!(decode_initial(4, 2, -1.0), vec![0.0, 0.0, -1.0, -1.0]);
    }
}
