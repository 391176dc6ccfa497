//! The QNN log callback: forwards backend messages to stderr at `-v` and remembers the
//! last error line so that failures can quote it.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// Highest QNN log level printed to stderr (0 = none).
static VERBOSITY: AtomicU32 = AtomicU32::new(0);
static LAST_ERROR: Mutex<Option<String>> = Mutex::new(None);

pub fn set_verbosity(level: u32) {
    VERBOSITY.store(level, Ordering::Relaxed);
}

pub fn verbosity() -> u32 {
    VERBOSITY.load(Ordering::Relaxed)
}

/// The most recent ERROR line the backend logged, if any (kept until taken).
pub fn last_error_line() -> Option<String> {
    LAST_ERROR.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

pub(crate) fn take_last_error() -> Option<String> {
    LAST_ERROR.lock().unwrap_or_else(|e| e.into_inner()).take()
}

#[cfg(unix)]
extern "C" {
    fn vsnprintf(buf: *mut c_char, n: usize, fmt: *const c_char, ap: *mut c_void) -> c_int;
}

/// Render a printf-style message. The `va_list` arrives as one pointer-sized value on
/// x86_64 SysV, AAPCS64 and Windows, and is forwarded unchanged, once.
///
/// # Safety
/// `fmt` and `ap` must be the pair QNN passed to the callback.
unsafe fn render(fmt: *const c_char, ap: *mut c_void) -> String {
    #[cfg(unix)]
    {
        let mut buf = [0 as c_char; 1024];
        // SAFETY: buf is writable for its length; fmt/ap come from the library's call.
        let n = unsafe { vsnprintf(buf.as_mut_ptr(), buf.len(), fmt, ap) };
        if n >= 0 {
            // SAFETY: vsnprintf NUL-terminates within the buffer.
            return unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned();
        }
    }
    let _ = ap;
    // SAFETY: fmt is a NUL-terminated format string.
    unsafe { CStr::from_ptr(fmt) }
        .to_string_lossy()
        .into_owned()
}

/// `QnnLog_Callback_t`. QNN may call it from any thread at any time, so it touches only
/// atomics and a mutex, ignores a closed stderr, and never lets a panic cross the FFI
/// boundary (it would abort the process).
pub(crate) unsafe extern "C" fn callback(
    fmt: *const c_char,
    level: u32,
    _ts: u64,
    ap: *mut c_void,
) {
    if fmt.is_null() {
        return;
    }
    let max = verbosity();
    if level > max && level > qnn_sys::log_level::ERROR {
        return;
    }
    // SAFETY: fmt/ap are the pair this callback was invoked with, forwarded once.
    let msg = unsafe { render(fmt, ap) };
    let _ = std::panic::catch_unwind(move || record(level, max, msg));
}

/// Remember an error line and print the message when `level` is within the verbosity.
fn record(level: u32, max: u32, msg: String) {
    let msg = msg.trim_end();
    if level <= qnn_sys::log_level::ERROR {
        *LAST_ERROR.lock().unwrap_or_else(|e| e.into_inner()) = Some(msg.to_string());
    }
    if level <= max {
        let name = match level {
            1 => "ERROR",
            2 => "WARN",
            3 => "INFO",
            4 => "VERBOSE",
            _ => "DEBUG",
        };
        crate::elog!("qnn[{name}] {msg}");
    }
}
