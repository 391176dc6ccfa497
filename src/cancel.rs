//! Cancellation: a token handed to a run through its [`crate::engine::GenConfig`]. A signal
//! handler (or any thread) holding a clone cancels it; the engine checks it between graph
//! calls, so a run stops at a clean point with its handles intact. The owner resets it
//! before the next run (e.g. the next turn of an interactive session).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A question asked at every check: "should this run stop?" (e.g. an app's callback).
pub type Poll = Arc<dyn Fn() -> bool + Send + Sync>;

/// A shared cancellation flag; clones observe the same flag (and the same poll).
#[derive(Clone, Default)]
pub struct CancelToken {
    flag: Arc<AtomicBool>,
    poll: Option<Poll>,
}

impl std::fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelToken")
            .field("cancelled", &self.flag.load(Ordering::Relaxed))
            .field("poll", &self.poll.is_some())
            .finish()
    }
}

impl CancelToken {
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// A token that is also cancelled once `poll` answers true; `poll` runs on the thread
    /// doing the work, at every check (between graph calls and prefill chunks).
    pub fn with_poll(poll: Poll) -> CancelToken {
        CancelToken {
            flag: Arc::default(),
            poll: Some(poll),
        }
    }

    /// A token sharing this one's flag (a `cancel` on either stops both) that is also
    /// cancelled once `poll` answers true.
    pub fn and_poll(&self, poll: Poll) -> CancelToken {
        CancelToken {
            flag: Arc::clone(&self.flag),
            poll: Some(poll),
        }
    }

    /// Ask the run to stop after its current graph call (one atomic store).
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }

    /// Whether a stop was asked for (or the poll said so) and not reset since.
    pub fn is_cancelled(&self) -> bool {
        if self.flag.load(Ordering::SeqCst) {
            return true;
        }
        match &self.poll {
            Some(p) if p() => {
                self.cancel();
                true
            }
            _ => false,
        }
    }

    /// Forget a request, so the next run starts uncancelled.
    pub fn reset(&self) {
        self.flag.store(false, Ordering::SeqCst);
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

    #[test]
    fn a_poll_that_says_stop_cancels_and_sticks_until_reset() {
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let n = asked.clone();
        let t = CancelToken::with_poll(std::sync::Arc::new(move || {
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 2
        }));
        assert!(!t.is_cancelled());
        assert!(!t.is_cancelled());
        assert!(t.is_cancelled());
        // Sticky: no further polls once cancelled.
        assert!(t.clone().is_cancelled());
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 3);
        t.reset();
        assert!(t.is_cancelled(), "the poll still says stop");
    }
}
