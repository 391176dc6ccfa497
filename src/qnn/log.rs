//! The QNN log callback: forwards backend messages to stderr at `-v` and remembers the
//! last error line so that failures can quote it.
//!
//! The callback carries no user pointer, so an error line cannot name the runtime or
//! session it belongs to; it is kept per thread instead. A QNN call logs its error on the
//! calling thread before it returns, and [`super::check`] on that thread takes it: a session
//! on another thread never sees it (a process-wide slot attached one session's error to
//! another's failure). Lines the backend logs from its own threads are printed at `-v` and
//! attached to nothing.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU32, Ordering};

/// Highest QNN log level printed to stderr (0 = none).
static VERBOSITY: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// The last ERROR line logged on this thread, until taken.
    static LAST_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

pub fn set_verbosity(level: u32) {
    VERBOSITY.store(level, Ordering::Relaxed);
}

pub fn verbosity() -> u32 {
    VERBOSITY.load(Ordering::Relaxed)
}

/// The most recent ERROR line the backend logged on this thread, if any (kept until taken).
pub fn last_error_line() -> Option<String> {
    LAST_ERROR.with(|e| e.borrow().clone())
}

pub(crate) fn discard_last_error() {
    LAST_ERROR.with(|e| {
        if let Ok(mut slot) = e.try_borrow_mut() {
            *slot = None;
        }
    });
}

pub(crate) fn take_last_error() -> Option<String> {
    LAST_ERROR.with(|e| e.borrow_mut().take())
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
        // try_with: the callback may run while this thread's locals are being destroyed.
        let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = Some(msg.to_string()));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sessions on two threads: the error one logs is taken by its own thread's check
    /// and never shows up on the other's (the process-global slot handed it to whichever
    /// thread failed next).
    #[test]
    fn an_error_line_stays_with_the_thread_that_logged_it() {
        let (to_b, b_rx) = std::sync::mpsc::channel::<()>();
        let (to_a, a_rx) = std::sync::mpsc::channel::<()>();
        let a = std::thread::spawn(move || {
            record(
                qnn_sys::log_level::ERROR,
                0,
                "session A: graph failed".into(),
            );
            to_b.send(()).unwrap();
            a_rx.recv().unwrap();
            take_last_error()
        });
        let b = std::thread::spawn(move || {
            b_rx.recv().unwrap();
            let seen = take_last_error();
            to_a.send(()).unwrap();
            seen
        });
        assert_eq!(b.join().unwrap(), None);
        assert_eq!(
            a.join().unwrap().as_deref(),
            Some("session A: graph failed")
        );
    }
}
