//! qnn-emu: a CPU emulator of the QNN HTP backend and system library.
//!
//! It exports `QnnInterface_getProviders` and `QnnSystemInterface_getProviders` with the
//! ABI-exact structs of `qnn-sys`, so `qhx_generate` loads it exactly as it would load
//! `libQnnHtp.so` / `libQnnSystem.so`. Context binaries are our own format (FORMAT.md) and
//! hold a real transformer, executed in f32.
//!
//! Test knobs (environment, read once per process):
//! * `QNN_EMU_CORE_API=2.7.0`, `QNN_EMU_SYSTEM_API=1.0.0`: versions the providers report.
//! * `QNN_EMU_FAIL=op[@n]=code,...`: make call `n` (0-based; every call without `@n`) of
//!   `op` fail with `code` (ops: backendCreate, deviceCreate, contextCreateFromBinary,
//!   graphRetrieve, graphExecute, getBinaryInfo, contextFree).
//! * `QNN_EMU_LOG_DELAY_MS=n`: sleep n ms after each ERROR line reaches the log callback.
//! * `QNN_EMU_NAN=kind@n`: the n-th (0-based) execution of a graph of `kind`
//!   (prefill | decode | lmhead) writes NaN outputs.
//! * `QNN_EMU_NULL_COMPUTE=1`: validate arguments, skip the math.
//! * `QNN_EMU_NULL_LOGITS=noise`: in null-compute mode the lm-head writes deterministic
//!   pseudo-random logits (a fresh draw per execute) instead of a one-hot vector.
//! * `QNN_EMU_TRACE=path`: after every handle create/free, rewrite `path` with a JSON
//!   record of live handles and the ordered create/free events.
//!   The trace also lists power-config votes (`votes`) and, per graph, how arguments were
//!   passed and how many input bytes changed between executes (`exec`).
//! * `QNN_EMU_THREADS=n`: math threads (default: available parallelism; 1 computes on the
//!   calling thread, spawning none).
//! * `QNN_EMU_CALIBRATE=path`: accumulate min/max of hidden states and K/V per layer (f32
//!   runs) into `path`, for choosing fixed-point I/O scales.
//! * `QNN_EMU_DELAY_MS=n`: every graphExecute sleeps n ms first (to land a signal mid-run).
//! * `QNN_EMU_LOAD_DELAY_MS=n`: every contextCreateFromBinary sleeps n ms first (to land a
//!   signal while a bundle loads).
//! * `QNN_EMU_STDOUT=0`: do not print the banner that backendCreate writes on stdout through
//!   C stdio (flushed at exit), as the real x86 HTP backend does; on by default so every
//!   test that reads stdout checks that the host keeps stdout its own.
//! * `QNN_EMU_MEM=unsupported`: memRegister fails with QNN_COMMON_ERROR_NOT_SUPPORTED
//!   ("QnnMem API is not supported"), as on the x86 HTP simulator.
//!
//! Strictness learned from the real backend: a mem handle registered in one context is
//! rejected by graphs of another, and fixed-point tensors must carry exactly the
//! scale/offset of the binary.

pub mod format;
pub mod io;
pub mod matrix;
pub mod model;
pub mod writer;

mod api;
mod calib;
mod exec;
mod knobs;
mod registry;
mod shm;
mod sysctx;

pub use api::BUILD_ID;

use qnn_sys::*;
use std::sync::OnceLock;

pub use knobs::threads;

struct ProviderCell<T>(T);
// SAFETY: the provider structs are immutable after initialisation; their raw pointers point
// to 'static strings.
unsafe impl<T> Sync for ProviderCell<T> {}
// SAFETY: as above.
unsafe impl<T> Send for ProviderCell<T> {}

static BACKEND: OnceLock<ProviderCell<(Box<QnnInterface>, [*const QnnInterface; 1])>> =
    OnceLock::new();
static SYSTEM: OnceLock<ProviderCell<(Box<QnnSystemInterface>, [*const QnnSystemInterface; 1])>> =
    OnceLock::new();

fn backend_provider() -> &'static [*const QnnInterface; 1] {
    let cell = BACKEND.get_or_init(|| {
        let core = knobs::get().core_api;
        let iface = Box::new(QnnInterface {
            backend_id: QNN_BACKEND_ID_HTP,
            provider_name: c"HTP_QTI_AISW".as_ptr(),
            api_version: QnnApiVersion {
                core,
                backend: QnnVersion {
                    major: 5,
                    minor: 43,
                    patch: 0,
                },
            },
            table: api::table(),
        });
        let ptr: *const QnnInterface = &*iface;
        ProviderCell((iface, [ptr]))
    });
    &cell.0 .1
}

fn system_provider() -> &'static [*const QnnSystemInterface; 1] {
    let cell = SYSTEM.get_or_init(|| {
        let iface = Box::new(QnnSystemInterface {
            backend_id: 0,
            provider_name: c"SYSTEM_QTI_AISW".as_ptr(),
            system_api_version: knobs::get().system_api,
            table: sysctx::table(),
        });
        let ptr: *const QnnSystemInterface = &*iface;
        ProviderCell((iface, [ptr]))
    });
    &cell.0 .1
}

/// `QnnInterface_getProviders`.
///
/// # Safety
/// Both pointers must be valid for writes (checked for null).
#[no_mangle]
pub unsafe extern "C" fn QnnInterface_getProviders(
    list: *mut *const *const QnnInterface,
    num: *mut u32,
) -> QnnErrorHandle {
    if list.is_null() || num.is_null() {
        return api::E_INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the caller promises they are writable.
    unsafe {
        *list = backend_provider().as_ptr();
        *num = 1;
    }
    0
}

/// `QnnSystemInterface_getProviders`.
///
/// # Safety
/// Both pointers must be valid for writes (checked for null).
#[no_mangle]
pub unsafe extern "C" fn QnnSystemInterface_getProviders(
    list: *mut *const *const QnnSystemInterface,
    num: *mut u32,
) -> QnnErrorHandle {
    if list.is_null() || num.is_null() {
        return api::E_INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the caller promises they are writable.
    unsafe {
        *list = system_provider().as_ptr();
        *num = 1;
    }
    0
}
