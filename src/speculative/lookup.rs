//! Prompt lookup: draft what followed the latest earlier occurrence of the text's last words.

use super::SpecConfig;

/// Draft up to `max` tokens to follow `history` (prompt and output so far, the last token
/// included): prompt lookup, longest matching suffix first, latest earlier occurrence.
pub fn lookup(history: &[u32], cfg: &SpecConfig, max: usize) -> Vec<u32> {
    let n = history.len();
    if max == 0 {
        return Vec::new();
    }
    for g in (cfg.ngram_min.max(1)..=cfg.ngram_max).rev() {
        if g >= n {
            continue;
        }
        let suffix = &history[n - g..];
        // Latest earlier occurrence whose continuation is non-empty: start at n - g - 1.
        for start in (0..n - g).rev() {
            if &history[start..start + g] == suffix {
                let from = start + g;
                let to = (from + max).min(n);
                return history[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_the_longest_suffix_and_its_latest_occurrence() {
        let cfg = SpecConfig {
            ngram_min: 1,
            ..SpecConfig::lookup()
        };
        // "1 2 3 4 | 9 2 3 5 | ... 2 3": the 2-gram [2 3] last occurred before 5.
        let h = [1, 2, 3, 4, 9, 2, 3, 5, 7, 2, 3];
        assert_eq!(lookup(&h, &cfg, 3), vec![5, 7, 2]);
        // A longer suffix wins over a later short one: [9 2 3] occurred once, before 5.
        let h = [9, 2, 3, 6, 6, 1, 2, 3, 8, 9, 2, 3];
        assert_eq!(lookup(&h, &cfg, 2), vec![6, 6]);
        // The continuation stops at the end of the history.
        assert_eq!(lookup(&[4, 5, 4], &cfg, 8), vec![5, 4]);
        // Nothing repeats: no draft; a zero budget drafts nothing.
        assert!(lookup(&[1, 2, 3], &cfg, 8).is_empty());
        assert!(lookup(&[4, 5, 4], &cfg, 0).is_empty());
        // ngram_min bounds the shortest match.
        let strict = SpecConfig::lookup();
        assert_eq!(strict.ngram_min, 2, "the default");
        assert!(lookup(&[4, 5, 4], &strict, 8).is_empty());
    }
}
