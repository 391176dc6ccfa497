//! Live-handle bookkeeping: rejects stale or foreign handles and records the order of
//! creates and frees, so tests can check that the runtime frees everything in order.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Log,
    Backend,
    Device,
    Context,
    SystemContext,
    MemHandle,
    PowerConfig,
    RpcMem,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Log => "log",
            Kind::Backend => "backend",
            Kind::Device => "device",
            Kind::Context => "context",
            Kind::SystemContext => "system_context",
            Kind::MemHandle => "mem_handle",
            Kind::PowerConfig => "power_config",
            Kind::RpcMem => "rpcmem",
        }
    }
}

#[derive(Default)]
struct Registry {
    live: HashMap<usize, Kind>,
    events: Vec<String>,
    /// Power-config votes as set (one JSON object per setPowerConfig call).
    votes: Vec<serde_json::Value>,
    /// Per graph name: execute statistics (only kept when tracing).
    exec: std::collections::BTreeMap<String, ExecStat>,
}

/// What graphExecute saw for one graph: how arguments were passed and how many input bytes
/// changed since the previous execute of the same graph.
#[derive(Default, Clone, serde::Serialize)]
pub struct ExecStat {
    pub executes: u64,
    /// Arguments passed as client buffers (memType RAW).
    pub raw_args: u64,
    /// Arguments passed as registered memory handles (memType MEMHANDLE).
    pub memhandle_args: u64,
    /// Input bytes that differ from the previous execute: per execute, then the maximum
    /// over every execute after the first.
    pub changed_bytes: Vec<u64>,
    pub max_changed_bytes: u64,
}

fn reg() -> &'static Mutex<Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Default::default)
}

fn lock() -> std::sync::MutexGuard<'static, Registry> {
    reg().lock().unwrap_or_else(|e| e.into_inner())
}

pub fn add(ptr: usize, kind: Kind) {
    let mut r = lock();
    r.live.insert(ptr, kind);
    r.events.push(format!("create {}", kind.name()));
    write_trace(&r);
}

/// Remove a handle; false if it was not live with that kind.
pub fn remove(ptr: usize, kind: Kind) -> bool {
    let mut r = lock();
    if r.live.get(&ptr) != Some(&kind) {
        r.events.push(format!("bad free {}", kind.name()));
        write_trace(&r);
        return false;
    }
    r.live.remove(&ptr);
    r.events.push(format!("free {}", kind.name()));
    write_trace(&r);
    true
}

/// Record a power-config vote and an event naming it.
pub fn vote(v: serde_json::Value) {
    let mut r = lock();
    r.votes.push(v);
    r.events.push("set power_config".into());
    write_trace(&r);
}

/// Update the execute statistics of `graph` (tracing only).
pub fn exec_stat(graph: &str, f: impl FnOnce(&mut ExecStat)) {
    let mut r = lock();
    f(r.exec.entry(graph.to_string()).or_default());
    write_trace(&r);
}

pub fn is_live(ptr: usize, kind: Kind) -> bool {
    lock().live.get(&ptr) == Some(&kind)
}

pub fn live_count(kind: Kind) -> usize {
    lock().live.values().filter(|k| **k == kind).count()
}

fn write_trace(r: &Registry) {
    let Some(path) = &crate::knobs::get().trace else {
        return;
    };
    let mut counts: Vec<(String, usize)> = Vec::new();
    for k in [
        Kind::Log,
        Kind::Backend,
        Kind::Device,
        Kind::Context,
        Kind::SystemContext,
        Kind::MemHandle,
        Kind::PowerConfig,
        Kind::RpcMem,
    ] {
        counts.push((
            k.name().to_string(),
            r.live.values().filter(|v| **v == k).count(),
        ));
    }
    let live: serde_json::Map<String, serde_json::Value> =
        counts.into_iter().map(|(k, v)| (k, v.into())).collect();
    let doc = serde_json::json!({ "live": live, "events": r.events, "votes": r.votes,
                                  "exec": r.exec });
    let tmp = format!("{path}.tmp");
    if std::fs::write(&tmp, doc.to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// Addresses of all live handles of `kind`.
pub fn live_of(kind: Kind) -> Vec<usize> {
    lock()
        .live
        .iter()
        .filter(|(_, k)| **k == kind)
        .map(|(p, _)| *p)
        .collect()
}
