//! Safe wrapper over `qnn-sys`: the only place in the qhx library with `unsafe` code.
//!
//! Ownership mirrors the QNN object tree: [`Runtime`] (libraries, log, backend, device) is
//! shared by [`Context`]s through an `Arc`, and each [`Graph`] holds its context, so handles
//! are freed child-first on every path, including errors.

mod binary;
mod buffer;
mod context;
mod log;
mod perf;
mod rpcmem;
mod runtime;
pub mod stdio;

pub use binary::{read_binary_info, read_binary_info_with, BinaryInfo, GraphDesc, TensorDesc};
pub use buffer::{dtype_supported as buffer_dtype_supported, Binding, BindingSet, HostBuf};
pub use context::{Context, Graph};
pub use log::{last_error_line, set_verbosity};
pub use perf::PerfMode;
pub use qnn_sys::SystemLibrary;
pub use runtime::{DeviceFacts, Runtime};

use crate::error::{Error, Result};
use qnn_sys::QnnStatus;
use std::path::Path;

/// Memory-map a file read-only.
pub fn map_file(file: &std::fs::File, path: &Path) -> Result<memmap2::Mmap> {
    // SAFETY: the map is read-only and private to this process. Bundle files are not
    // expected to change while a generation runs; if another process truncates one, reads
    // may fault, as with any mmap-based loader (documented in README).
    unsafe { memmap2::Mmap::map(file) }.map_err(|e| Error::io(path, e))
}

/// A hint for well-known failure codes, naming the usual cause on a device.
pub fn hint_for(code: u16) -> Option<&'static str> {
    Some(match code {
        1002 => "the HTP could not allocate memory: a context may exceed the per-context ceiling (~3.6 GB on v81) or another model holds the NPU",
        1007 | 1011 => "the DSP restarted (subsystem restart); retry, and check that no other process is using the NPU",
        1008 | 5004 | 5008 => "the bundle was built with a different QAIRT/arch: use libQnnHtp.so/libQnnSystem.so at least as new as the SDK that compiled it, for this SoC's dsp_arch",
        1009 => "a QNN library was loaded twice in this process",
        1010 => "the NPU is busy or out of protection domains (another model may be resident)",
        4000 => "the backend could not start the DSP side: check that ADSP_LIBRARY_PATH lists the directory holding libQnnHtpV<arch>Skel.so",
        5005 => "the context binary could not be deserialized: a corrupt/truncated file, or built for another arch or QAIRT version",
        6002 => "the graph name is not in this context binary: check artifacts.contexts.*.graph against qhx_inspect",
        6004 => "a tensor passed to graphExecute does not match the graph (id, dtype, dims or buffer size)",
        30010 => "not a QNN context binary (bad magic) or a truncated one: check that the path names a context .bin (not the embedding table or tokenizer) and that the copy is complete",
        _ => return None,
    })
}

/// Turn a status into a result, naming the step and attaching a hint and the last QNN log
/// line on failure.
pub(crate) fn check(status: u64, step: impl FnOnce() -> String) -> Result<()> {
    let s = QnnStatus(status);
    if s.is_ok() {
        // An ERROR line logged by a call that then succeeded (a warning-grade complaint)
        // must not be quoted by this thread's next, unrelated failure.
        log::discard_last_error();
        return Ok(());
    }
    let mut hint = hint_for(s.code()).map(str::to_string);
    if let Some(line) = log::take_last_error() {
        hint = Some(match hint {
            Some(h) => format!("{h} (backend said: {line})"),
            None => format!("backend said: {line}"),
        });
    }
    Err(Error::Qnn {
        step: step(),
        status: s,
        hint,
    })
}

/// View little-endian bytes as f16 values when aligned (always true for rows of a mapped
/// table: the map is page-aligned and rows are whole elements). None otherwise.
pub fn bytes_as_f16(b: &[u8]) -> Option<&[half::f16]> {
    let v = bytemuck::try_cast_slice(b).ok()?;
    cfg!(target_endian = "little").then_some(v)
}

/// As [`bytes_as_f16`], for f32.
pub fn bytes_as_f32(b: &[u8]) -> Option<&[f32]> {
    let v = bytemuck::try_cast_slice(b).ok()?;
    cfg!(target_endian = "little").then_some(v)
}
