//! Our RoPE tables against HF transformers' rotary embedding (tests/goldens/rope.json, made by
//! tests/golden_tools/goldens.py): plain theta (SmolLM2 1e5, Qwen2 1e4) and llama3-scaled (Llama 3.2).

use qhx::bundle::manifest::RopeScaling;
use qhx::ops::rope::RopeTable;

#[test]
fn rope_tables_match_hf_for_positions_up_to_8191() {
    let g: serde_json::Value = serde_json::from_str(include_str!("goldens/rope.json")).unwrap();
    let positions: Vec<usize> = g["positions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap() as usize)
        .collect();
    let mut worst = 0f64;
    for (name, t) in g["tables"].as_object().unwrap() {
        let scaling: Option<RopeScaling> =
            serde_json::from_value(t["rope_scaling"].clone()).unwrap();
        let hd = t["head_dim"].as_u64().unwrap() as usize;
        let table = RopeTable::new(t["theta"].as_f64().unwrap(), hd, 8192, scaling.as_ref());
        for (k, &p) in positions.iter().enumerate() {
            for (which, ours) in [("cos_rows", table.cos(p)), ("sin_rows", table.sin(p))] {
                let want = &t[which][k];
                for (d, (a, b)) in ours.iter().zip(want.as_array().unwrap()).enumerate() {
                    let b = b.as_f64().unwrap();
                    // Relative to the row's scale (|cos|, |sin| <= 1): 1e-6 of 1.
                    let err = (*a as f64 - b).abs();
                    worst = worst.max(err);
                    assert!(
                        err <= 1e-6,
                        "{name} {which} pos {p} dim {d}: ours {a} vs HF {b}"
                    );
                }
            }
        }
        // Whole-table sums catch any position the selected rows miss.
        let (mut cs, mut ss) = (0f64, 0f64);
        for p in 0..8192 {
            cs += table.cos(p).iter().map(|v| *v as f64).sum::<f64>();
            ss += table.sin(p).iter().map(|v| *v as f64).sum::<f64>();
        }
        let n = (8192 * hd) as f64;
        assert!(
            (cs - t["cos_sum"].as_f64().unwrap()).abs() <= 1e-6 * n,
            "{name} cos sum {cs}"
        );
        assert!(
            (ss - t["sin_sum"].as_f64().unwrap()).abs() <= 1e-6 * n,
            "{name} sin sum {ss}"
        );
    }
    println!("rope: worst abs difference vs HF over the golden rows: {worst:e}");
}
