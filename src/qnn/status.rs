//! A QNN status as a result: the step named, a hint for well-known codes, the backend's
//! last ERROR line attached.

use crate::error::{Error, Result};
use qnn_sys::QnnStatus;

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
        super::log::discard_last_error();
        return Ok(());
    }
    let mut hint = hint_for(s.code()).map(str::to_string);
    if let Some(line) = super::log::take_last_error() {
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
