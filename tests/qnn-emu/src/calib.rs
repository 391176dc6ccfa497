//! Activation-range calibration: min/max per tensor role, merged into a JSON file.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

fn ranges() -> &'static Mutex<BTreeMap<String, (f32, f32)>> {
    static R: OnceLock<Mutex<BTreeMap<String, (f32, f32)>>> = OnceLock::new();
    R.get_or_init(|| {
        // Start from what earlier runs recorded, so several prompts accumulate.
        let mut m = BTreeMap::new();
        if let Some(p) = &crate::knobs::get().calibrate {
            if let Ok(v) =
                std::fs::read(p).map(|b| serde_json::from_slice::<BTreeMap<String, (f32, f32)>>(&b))
            {
                m = v.unwrap_or_default();
            }
        }
        Mutex::new(m)
    })
}

pub fn record(role: &str, vals: &[f32]) {
    let Some(path) = &crate::knobs::get().calibrate else {
        return;
    };
    if vals.is_empty() {
        return;
    }
    let (lo, hi) = vals
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), v| {
            (a.min(*v), b.max(*v))
        });
    let mut m = ranges().lock().unwrap_or_else(|e| e.into_inner());
    let e = m.entry(role.to_string()).or_insert((lo, hi));
    e.0 = e.0.min(lo);
    e.1 = e.1.max(hi);
    if let Ok(text) = serde_json::to_string_pretty(&*m) {
        let tmp = format!("{path}.tmp");
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }
}
