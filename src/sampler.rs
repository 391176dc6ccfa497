//! Token selection from logits.

/// Greedy argmax; ties go to the lower id (as QHexRT and HF do). NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut bv = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > bv {
            bv = v;
            best = i;
        }
    }
    best as u32
}

/// Index of the first non-finite value, if any.
pub fn first_non_finite(v: &[f32]) -> Option<usize> {
    v.iter().position(|x| !x.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_prefers_lower_id_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5]), 1);
        assert_eq!(argmax(&[-2.0]), 0);
    }

    #[test]
    fn finds_non_finite() {
        assert_eq!(first_non_finite(&[0.0, 1.0]), None);
        assert_eq!(first_non_finite(&[0.0, f32::INFINITY]), Some(1));
    }
}
