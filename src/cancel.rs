//! Cancellation: a token handed to a run through its [`crate::engine::GenConfig`]. A signal
//! handler (or any thread) holding a clone cancels it; the engine checks it between graph
//! calls, so a run stops at a clean point with its handles intact. The owner resets it
//! before the next run (e.g. the next turn of an interactive session).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A shared cancellation flag; clones observe the same flag.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// Ask the run to stop after its current graph call (one atomic store).
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether a stop was asked for and not reset since.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Forget a request, so the next run starts uncancelled.
    pub fn reset(&self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::CancelToken;

    #[test]
    fn clones_share_the_flag_and_reset_clears_it() {
        let a = CancelToken::new();
        let b = a.clone();
        assert!(!b.is_cancelled());
        a.cancel();
        assert!(b.is_cancelled());
        b.reset();
        assert!(!a.is_cancelled());
        // Independent tokens do not interfere.
        let c = CancelToken::new();
        a.cancel();
        assert!(!c.is_cancelled());
    }
}
