//! `/metrics`: counters and gauges in Prometheus' text exposition format (version 0.0.4).
//! The format is a few `# TYPE` lines and `name{labels} value` lines, so it is written
//! here rather than through a metrics crate.

use qhx::cancel::CancelToken;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

#[derive(Default)]
struct Counts {
    /// (endpoint, status) → requests answered.
    requests: BTreeMap<(String, u16), u64>,
    prompt_tokens: u64,
    reused_prompt_tokens: u64,
    completion_tokens: u64,
    decode_seconds: f64,
    ttft_seconds_sum: f64,
    ttft_count: u64,
    /// Histogram of the time to first token (queue wait included).
    ttft_buckets: [u64; TTFT_BOUNDS.len()],
    last_decode_tok_s: f64,
    rejected: u64,
    cancelled: u64,
    failed: u64,
    busy: usize,
    queue: usize,
    /// Cancel tokens of the runs in progress (for a drain that times out).
    running: Vec<(u64, CancelToken)>,
    next_run: u64,
}

/// Upper bounds (seconds) of the TTFT histogram.
const TTFT_BOUNDS: [f64; 10] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The server's metrics.
pub struct Metrics {
    counts: Mutex<Counts>,
    parallel: usize,
    queue_limit: usize,
}

/// Removes a run from the running list when it ends.
pub struct Running<'a> {
    m: &'a Metrics,
    id: u64,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.m.with(|c| c.running.retain(|(i, _)| *i != self.id));
    }
}

impl Metrics {
    pub fn new(parallel: usize, queue_limit: usize) -> Metrics {
        Metrics {
            counts: Mutex::new(Counts::default()),
            parallel,
            queue_limit,
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Counts) -> R) -> R {
        f(&mut self.counts.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn request(&self, endpoint: &str, status: u16) {
        self.with(|c| {
            *c.requests
                .entry((endpoint.to_string(), status))
                .or_default() += 1
        });
    }

    pub fn set_busy(&self, n: usize) {
        self.with(|c| c.busy = n);
    }

    pub fn set_queue(&self, n: usize) {
        self.with(|c| c.queue = n);
    }

    pub fn rejected(&self) {
        self.with(|c| c.rejected += 1);
    }

    pub fn cancelled(&self) {
        self.with(|c| c.cancelled += 1);
    }

    pub fn failed(&self) {
        self.with(|c| c.failed += 1);
    }

    pub fn running(&self, cancel: CancelToken) -> Running<'_> {
        let id = self.with(|c| {
            c.next_run += 1;
            c.running.push((c.next_run, cancel));
            c.next_run
        });
        Running { m: self, id }
    }

    pub fn cancel_running(&self) {
        self.with(|c| c.running.iter().for_each(|(_, t)| t.cancel()));
    }

    /// A run ended: its time to first token (ms), tokens, decode time (ms), prompt ids and
    /// how many of them the cache already held.
    pub fn finished(
        &self,
        ttft_ms: f64,
        tokens: usize,
        decode_ms: f64,
        prompt: usize,
        reused: usize,
    ) {
        self.with(|c| {
            let ttft = ttft_ms / 1e3;
            c.ttft_seconds_sum += ttft;
            c.ttft_count += 1;
            for (i, b) in TTFT_BOUNDS.iter().enumerate() {
                if ttft <= *b {
                    c.ttft_buckets[i] += 1;
                }
            }
            c.completion_tokens += tokens as u64;
            c.prompt_tokens += prompt as u64;
            c.reused_prompt_tokens += reused as u64;
            c.decode_seconds += decode_ms / 1e3;
            if decode_ms > 0.0 && tokens > 1 {
                c.last_decode_tok_s = (tokens - 1) as f64 / (decode_ms / 1e3);
            }
        })
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        self.with(|c| {
            let mut s = String::new();
            let _ = writeln!(
                s,
                "# HELP qhx_requests_total HTTP requests answered, by endpoint and status.\n# TYPE qhx_requests_total counter"
            );
            for ((ep, st), n) in &c.requests {
                let _ = writeln!(s, "qhx_requests_total{{endpoint=\"{ep}\",status=\"{st}\"}} {n}");
            }
            let simple: [(&str, &str, &str, String); 12] = [
                ("prompt_tokens_total", "counter", "Prompt tokens of finished requests.", c.prompt_tokens.to_string()),
                ("prompt_tokens_reused_total", "counter", "Prompt tokens a session's cache already held (not fed again).", c.reused_prompt_tokens.to_string()),
                ("completion_tokens_total", "counter", "Tokens generated.", c.completion_tokens.to_string()),
                ("decode_seconds_total", "counter", "Time spent decoding after the first token.", format!("{:.6}", c.decode_seconds)),
                ("decode_tokens_per_second", "gauge", "Decode speed of the last finished request.", format!("{:.3}", c.last_decode_tok_s)),
                ("requests_rejected_total", "counter", "Requests refused with 503 because the queue was full.", c.rejected.to_string()),
                ("requests_cancelled_total", "counter", "Requests whose client left before they finished.", c.cancelled.to_string()),
                ("requests_failed_total", "counter", "Requests the runtime failed.", c.failed.to_string()),
                ("sessions_busy", "gauge", "Sessions generating now.", c.busy.to_string()),
                ("sessions", "gauge", "Sessions over the loaded model (--parallel).", self.parallel.to_string()),
                ("queue_depth", "gauge", "Requests waiting for a session.", c.queue.to_string()),
                ("queue_limit", "gauge", "Requests that may wait (--queue).", self.queue_limit.to_string()),
            ];
            for (name, kind, help, v) in simple {
                let _ = writeln!(s, "# HELP qhx_{name} {help}\n# TYPE qhx_{name} {kind}\nqhx_{name} {v}");
            }
            let _ = writeln!(s, "# HELP qhx_ttft_seconds Time to first token, queue wait included.\n# TYPE qhx_ttft_seconds histogram");
            for (i, b) in TTFT_BOUNDS.iter().enumerate() {
                let _ = writeln!(s, "qhx_ttft_seconds_bucket{{le=\"{b}\"}} {}", c.ttft_buckets[i]);
            }
            let _ = writeln!(s, "qhx_ttft_seconds_bucket{{le=\"+Inf\"}} {}", c.ttft_count);
            let _ = writeln!(s, "qhx_ttft_seconds_sum {:.6}\nqhx_ttft_seconds_count {}", c.ttft_seconds_sum, c.ttft_count);
            s
        })
    }
}
