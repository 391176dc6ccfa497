//! Keeps stdout ours. QNN libraries may write to file descriptor 1 (the x86 HTP simulator
//! prints a `LIBNATIVE` banner through C stdio, flushed when the process exits, after our
//! JSON). [`isolate_stdout`] runs before any QNN library is loaded: it keeps a private
//! duplicate of fd 1 for our own output and points fd 1 elsewhere, so stdout carries only
//! the generated text or the one JSON document. What the libraries print there goes to
//! stderr when the user asked for diagnostics (`-v`), and is discarded otherwise, like the
//! backend's log at that level: a bad input stays one line on stderr.

use std::fs::File;
use std::io::{self, LineWriter, Write};
use std::sync::{Mutex, MutexGuard, OnceLock};

static PRIVATE: OnceLock<Mutex<LineWriter<File>>> = OnceLock::new();

/// Move fd 1 out of the libraries' reach (see the module docs): their stdout goes to stderr
/// when `show` is set, to the null device otherwise. Idempotent. When fd 1 is not open there
/// is nothing to protect and output keeps going to the process's stdout (and fails there,
/// as it would anyway). On non-Unix targets this is a no-op for now.
pub fn isolate_stdout(show: bool) -> io::Result<()> {
    if PRIVATE.get().is_some() {
        return Ok(());
    }
    io::stdout().flush()?;
    #[cfg(unix)]
    {
        use std::os::fd::FromRawFd;
        // SAFETY: fcntl on a descriptor number only; returns a new descriptor (>= 3,
        // close-on-exec so child processes do not inherit it) or -1.
        let fd = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3) };
        if fd < 0 {
            return Ok(());
        }
        // Point fd 1 at stderr (if shown and open), else at the null device.
        // SAFETY: dup2 on descriptor numbers only.
        if !show || unsafe { libc::dup2(2, 1) } < 0 {
            let null = std::fs::OpenOptions::new().write(true).open("/dev/null");
            let ok = null.is_ok_and(|f| {
                use std::os::fd::AsRawFd;
                // SAFETY: as above; `f` stays open for the call.
                unsafe { libc::dup2(f.as_raw_fd(), 1) >= 0 }
            });
            if !ok {
                let e = io::Error::last_os_error();
                // SAFETY: fd is the descriptor fcntl just returned, owned here, closed once.
                unsafe { libc::close(fd) };
                return Err(e);
            }
        }
        // SAFETY: fd is a fresh descriptor owned by nobody else; the File takes ownership.
        let file = unsafe { File::from_raw_fd(fd) };
        let _ = PRIVATE.set(Mutex::new(LineWriter::new(file)));
    }
    Ok(())
}

/// Our stdout: the private descriptor once [`isolate_stdout`] ran, the process's stdout
/// otherwise. Flushed when dropped.
pub fn stdout() -> Stdout {
    match PRIVATE.get() {
        Some(m) => Stdout::Private(m.lock().unwrap_or_else(|e| e.into_inner())),
        None => Stdout::Std(io::stdout().lock()),
    }
}

/// A locked handle on our stdout (see [`stdout`]).
pub enum Stdout {
    Private(MutexGuard<'static, LineWriter<File>>),
    Std(io::StdoutLock<'static>),
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stdout::Private(w) => w.write(buf),
            Stdout::Std(w) => w.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Stdout::Private(w) => w.write_all(buf),
            Stdout::Std(w) => w.write_all(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stdout::Private(w) => w.flush(),
            Stdout::Std(w) => w.flush(),
        }
    }
}

impl Drop for Stdout {
    fn drop(&mut self) {
        // Errors (a closed pipe) were or will be reported by the writes themselves.
        let _ = self.flush();
    }
}
