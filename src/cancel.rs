//! Process-wide cancellation: a signal handler (or any thread) requests it, and the engine
//! checks it between graph calls, so a run stops at a clean point with its handles intact.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Ask every running generation to stop after its current graph call. Async-signal-safe
/// (one atomic store).
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Whether a stop was requested and not cleared since.
pub fn is_requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Forget a request, e.g. before the next turn of an interactive session.
pub fn clear() {
    REQUESTED.store(false, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    #[test]
    fn request_and_clear() {
        super::clear();
        assert!(!super::is_requested());
        super::request();
        assert!(super::is_requested());
        super::clear();
        assert!(!super::is_requested());
    }
}
