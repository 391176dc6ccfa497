//! Sessions over the one loaded model, and the FIFO of requests waiting for one.
//!
//! `--parallel N` sessions each live on a worker thread of their own (generation blocks:
//! it never runs on the async runtime). A request goes to a free session — the one whose
//! cache shares the longest prefix with its prompt, so a conversation's next turn feeds
//! only what is new — or waits in the queue, first come first served; past `--queue`
//! waiting requests it is refused (503). Graph executions of the sessions are serialised
//! per graph by the runtime, so sessions interleave on the NPU step by step.

use crate::api::Work;
use crate::error::{from_runtime, ApiError};
use crate::metrics::Metrics;
use qhx::cancel::CancelToken;
use qhx::engine::{FinishReason, GenConfig};
use qhx::session::{common_prefix, Session, TextRequest};
use qhx::text::TextSink;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// What a worker tells the request's handler.
#[derive(Debug)]
pub enum Event {
    /// Text that became final (whole characters, stop strings held back).
    Text(String),
    /// The run ended.
    Done(Result<Finished, ApiError>),
}

/// A finished generation.
#[derive(Debug, Clone)]
pub struct Finished {
    pub text: String,
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt ids the session's cache already held (not fed again).
    pub reused: usize,
    pub ttft_ms: f64,
    pub decode_ms: f64,
    /// Time spent waiting for a session.
    pub queued_ms: f64,
    /// Speculation: tokens drafted and accepted.
    pub drafted: usize,
    pub accepted: usize,
}

/// A request, tokenized and checked, ready for a session.
pub struct Job {
    pub work: Work,
    pub ids: Vec<u32>,
    /// Tokens the context (`--ctx`) leaves after the prompt.
    pub room: usize,
    pub tokenize_ms: f64,
    pub grammar: Option<(Arc<qhx::grammar::Vocab>, qhx::grammar::Spec)>,
    pub events: UnboundedSender<Event>,
    /// Raised when the client goes away (or the server stops waiting).
    pub cancel: CancelToken,
    pub queued_at: Instant,
}

struct State {
    /// Free sessions: their slot and the ids their cache holds.
    free: Vec<(usize, Vec<u32>)>,
    waiting: VecDeque<Job>,
}

struct Shared {
    state: Mutex<State>,
    queue_limit: usize,
    parallel: usize,
    draining: AtomicBool,
    metrics: Arc<Metrics>,
    /// The bundle's end tokens (an end token is not a completion token).
    eos: Vec<u32>,
}

/// The sessions and their queue.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<mpsc::Sender<Job>>,
    parallel: usize,
}

impl Pool {
    /// Start one worker per session.
    pub fn new(sessions: Vec<Session>, queue_limit: usize, metrics: Arc<Metrics>) -> Pool {
        let parallel = sessions.len();
        let eos = sessions
            .first()
            .map(|s| s.loaded().eos())
            .unwrap_or_default();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                free: (0..parallel).map(|i| (i, Vec::new())).collect(),
                waiting: VecDeque::new(),
            }),
            queue_limit,
            parallel,
            draining: AtomicBool::new(false),
            metrics,
            eos,
        });
        let mut workers = Vec::new();
        for (slot, session) in sessions.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel::<Job>();
            let sh = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("qhx-session-{slot}"))
                .spawn(move || worker(slot, session, rx, sh))
                .expect("spawning a session thread");
            workers.push(tx);
        }
        Pool {
            shared,
            workers,
            parallel,
        }
    }

    pub fn parallel(&self) -> usize {
        self.parallel
    }

    /// Hand `job` to a free session, or queue it; a full queue or a draining server refuses.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        if self.shared.draining.load(Ordering::SeqCst) {
            return Err(ApiError::shutting_down());
        }
        let mut st = lock(&self.shared.state);
        let best = st
            .free
            .iter()
            .enumerate()
            .max_by_key(|(_, (_, cached))| common_prefix(cached, &job.ids))
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let (slot, _) = st.free.swap_remove(i);
                self.shared.metrics.set_busy(self.parallel - st.free.len());
                drop(st);
                // A worker only stops with the process.
                let _ = self.workers[slot].send(job);
                Ok(())
            }
            None if st.waiting.len() < self.shared.queue_limit => {
                st.waiting.push_back(job);
                self.shared.metrics.set_queue(st.waiting.len());
                Ok(())
            }
            None => {
                self.shared.metrics.rejected();
                Err(ApiError::overloaded(st.waiting.len()))
            }
        }
    }

    /// Refuse new requests from now on (those running and queued go on).
    pub fn drain(&self) {
        self.shared.draining.store(true, Ordering::SeqCst);
    }

    pub fn draining(&self) -> bool {
        self.shared.draining.load(Ordering::SeqCst)
    }

    /// Cancel every queued and running request (the drain timed out).
    pub fn cancel_all(&self) {
        let st = lock(&self.shared.state);
        for j in &st.waiting {
            j.cancel.cancel();
        }
        drop(st);
        self.shared.metrics.cancel_running();
    }

    /// Sessions busy and requests waiting now.
    pub fn load(&self) -> (usize, usize) {
        let st = lock(&self.shared.state);
        (self.parallel - st.free.len(), st.waiting.len())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn worker(slot: usize, mut session: Session, rx: mpsc::Receiver<Job>, sh: Arc<Shared>) {
    while let Ok(first) = rx.recv() {
        let mut job = first;
        loop {
            run(&mut session, job, &sh);
            let mut st = lock(&sh.state);
            match st.waiting.pop_front() {
                Some(next) => {
                    sh.metrics.set_queue(st.waiting.len());
                    job = next;
                }
                None => {
                    st.free.push((slot, session.cached().to_vec()));
                    sh.metrics.set_busy(sh.parallel - st.free.len());
                    break;
                }
            }
        }
    }
}

/// Text to the handler's channel; a closed channel (the client left) stops the run.
struct ChannelSink<'a> {
    events: &'a UnboundedSender<Event>,
    cancel: &'a CancelToken,
}

impl TextSink for ChannelSink<'_> {
    fn token(&mut self, text: &str, _token: u32) -> qhx::Result<bool> {
        if !text.is_empty() && self.events.send(Event::Text(text.to_string())).is_err() {
            return Ok(false);
        }
        Ok(!self.cancel.is_cancelled())
    }

    fn end(&mut self, rest: &str) -> qhx::Result<()> {
        if !rest.is_empty() {
            let _ = self.events.send(Event::Text(rest.to_string()));
        }
        Ok(())
    }
}

fn run(session: &mut Session, job: Job, sh: &Shared) {
    let queued_ms = job.queued_at.elapsed().as_secs_f64() * 1e3;
    if job.cancel.is_cancelled() || job.events.is_closed() {
        sh.metrics.cancelled();
        return;
    }
    let _running = sh.metrics.running(job.cancel.clone());
    let requested = job.work.max_tokens.unwrap_or(job.room).min(job.room);
    let cfg = GenConfig {
        n_tokens: requested,
        sampler: job.work.sampler.clone(),
        allow_nonfinite: false,
        ignore_eos: job.work.ignore_eos,
        teacher: None,
        cancel: job.cancel.clone(),
        spec: job.work.spec.clone(),
    };
    let text = TextRequest {
        stops: job.work.stops.clone(),
        reasoning: qhx::reasoning::Mode::Show,
        reasoning_budget: None,
        grammar: job.grammar.clone(),
    };
    let mut sink = ChannelSink {
        events: &job.events,
        cancel: &job.cancel,
    };
    let r = session.generate_reusing(
        job.work.cache_prompt,
        &job.ids,
        &cfg,
        requested,
        &text,
        job.tokenize_ms,
        Some(&mut sink),
    );
    let done = match r {
        Ok((turn, reused)) => {
            let s = &turn.output.stats;
            let completion_tokens = turn.output.text_ids(turn.finish, &sh.eos).len();
            sh.metrics.finished(
                s.ttft_ms + queued_ms,
                completion_tokens,
                s.decode_ms,
                job.ids.len(),
                reused,
            );
            if turn.finish == FinishReason::Cancelled {
                sh.metrics.cancelled();
            }
            Ok(Finished {
                text: turn.text,
                finish: turn.finish,
                prompt_tokens: job.ids.len(),
                completion_tokens,
                reused,
                ttft_ms: s.ttft_ms,
                decode_ms: s.decode_ms,
                queued_ms,
                drafted: turn.output.spec.as_ref().map_or(0, |x| x.drafted),
                accepted: turn.output.spec.as_ref().map_or(0, |x| x.accepted),
            })
        }
        Err(e) => {
            sh.metrics.failed();
            // The cache may hold half a turn: the next request starts fresh.
            session.reset();
            Err(from_runtime(&e))
        }
    };
    let _ = job.events.send(Event::Done(done));
}
