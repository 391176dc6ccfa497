//! Test knobs read from the environment once per process (see the crate docs).

use qnn_sys::QnnVersion;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

pub struct Knobs {
    pub core_api: QnnVersion,
    pub system_api: QnnVersion,
    /// op -> (call index or None for every call, error code)
    fails: Vec<(String, Option<u64>, u64)>,
    nan: Option<(String, u64)>,
    pub null_compute: bool,
    /// `QNN_EMU_NULL_LOGITS=noise`: null-compute lm-heads write pseudo-random logits.
    pub null_logits_noise: bool,
    pub trace: Option<String>,
    /// Path of a JSON file accumulating per-tensor-role value ranges (x, y, k_<i>, v_<i>)
    /// across runs, for choosing fixed-point scales.
    pub calibrate: Option<String>,
    pub threads: usize,
    /// Milliseconds each graphExecute sleeps first (QNN_EMU_DELAY_MS), to land signals.
    pub delay_ms: u64,
    /// Milliseconds each contextCreateFromBinary sleeps first (QNN_EMU_LOAD_DELAY_MS), to
    /// land a signal while a bundle loads.
    pub load_delay_ms: u64,
    /// Milliseconds the emulator sleeps after handing an ERROR line to the log callback
    /// (QNN_EMU_LOG_DELAY_MS), widening the window in which another thread's line could be
    /// mistaken for this call's.
    pub log_delay_ms: u64,
    /// Print a banner on stdout through C stdio at backendCreate, as the real x86 HTP
    /// backend does (QNN_EMU_STDOUT, default on; 0 turns it off).
    pub stdout_banner: bool,
    /// `QNN_EMU_MEM=unsupported`: memRegister answers NOT_SUPPORTED, as the simulator does.
    pub mem_unsupported: bool,
}

fn parse_version(s: &str) -> Option<QnnVersion> {
    let mut it = s.split('.').map(|p| p.trim().parse::<u32>());
    let major = it.next()?.ok()?;
    let minor = it.next().unwrap_or(Ok(0)).ok()?;
    let patch = it.next().unwrap_or(Ok(0)).ok()?;
    Some(QnnVersion {
        major,
        minor,
        patch,
    })
}

fn parse_code(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

pub fn get() -> &'static Knobs {
    static K: OnceLock<Knobs> = OnceLock::new();
    K.get_or_init(|| {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let fails = env("QNN_EMU_FAIL")
            .map(|v| {
                v.split(',')
                    .filter_map(|item| {
                        let (lhs, code) = item.split_once('=')?;
                        let (op, n) = match lhs.split_once('@') {
                            Some((op, n)) => (op, Some(n.trim().parse().ok()?)),
                            None => (lhs, None),
                        };
                        Some((op.trim().to_string(), n, parse_code(code)?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let nan = env("QNN_EMU_NAN").and_then(|v| {
            let (kind, n) = v.split_once('@')?;
            Some((kind.trim().to_string(), n.trim().parse().ok()?))
        });
        Knobs {
            core_api: env("QNN_EMU_CORE_API")
                .and_then(|v| parse_version(&v))
                .unwrap_or(QnnVersion {
                    major: 2,
                    minor: 32,
                    patch: 0,
                }),
            system_api: env("QNN_EMU_SYSTEM_API")
                .and_then(|v| parse_version(&v))
                .unwrap_or(QnnVersion {
                    major: 1,
                    minor: 7,
                    patch: 0,
                }),
            fails,
            nan,
            null_compute: env("QNN_EMU_NULL_COMPUTE").is_some_and(|v| v != "0"),
            null_logits_noise: env("QNN_EMU_NULL_LOGITS").is_some_and(|v| v == "noise"),
            trace: env("QNN_EMU_TRACE"),
            calibrate: env("QNN_EMU_CALIBRATE"),
            threads: env("QNN_EMU_THREADS")
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
                .max(1),
            delay_ms: env("QNN_EMU_DELAY_MS")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            load_delay_ms: env("QNN_EMU_LOAD_DELAY_MS")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            log_delay_ms: env("QNN_EMU_LOG_DELAY_MS")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            stdout_banner: env("QNN_EMU_STDOUT").is_none_or(|v| v != "0"),
            mem_unsupported: env("QNN_EMU_MEM").is_some_and(|v| v == "unsupported"),
        }
    })
}

fn counters() -> &'static Mutex<HashMap<String, u64>> {
    static C: OnceLock<Mutex<HashMap<String, u64>>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Count a call of `op`; return the injected error code if this call must fail.
pub fn injected_failure(op: &str) -> Option<u64> {
    let k = get();
    if !k.fails.iter().any(|(o, _, _)| o == op) {
        return None;
    }
    let n = {
        let mut c = counters().lock().unwrap_or_else(|e| e.into_inner());
        let e = c.entry(op.to_string()).or_insert(0);
        *e += 1;
        *e - 1
    };
    k.fails
        .iter()
        .find(|(o, at, _)| o == op && at.is_none_or(|a| a == n))
        .map(|(_, _, code)| *code)
}

static EXEC_COUNT: [AtomicU64; 4] = [
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
];

/// Count an execution of a graph of `kind` (index 0..4); true if it must write NaN.
pub fn nan_now(kind: &str, idx: usize) -> bool {
    let n = EXEC_COUNT[idx].fetch_add(1, Ordering::Relaxed);
    matches!(&get().nan, Some((k, at)) if k == kind && *at == n)
}

pub fn threads() -> usize {
    get().threads
}

static NOISE_SEED: AtomicU64 = AtomicU64::new(1);

/// A fresh seed per null-compute lm-head execute.
pub fn next_noise_seed() -> u64 {
    NOISE_SEED.fetch_add(1, Ordering::Relaxed)
}
