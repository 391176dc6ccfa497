//! The endpoints: OpenAI's chat completions, completions and models, plus `/health` and
//! `/metrics`. A handler reads and checks the body, tokenizes it off the async threads,
//! hands it to the pool, and answers with one JSON document or an SSE stream.

use crate::api::{self, Defaults, Endpoint, Work};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::pool::{Event, Finished, Job, Pool};
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream};
use qhx::cancel::CancelToken;
use qhx::engine::FinishReason;
use qhx::tools::ToolCall;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What every handler shares.
pub struct App {
    pub pool: Arc<Pool>,
    pub metrics: Arc<Metrics>,
    pub defaults: Defaults,
    /// The name `/v1/models` lists and responses carry.
    pub model: String,
    pub created: u64,
    pub api_key: Option<String>,
    pub max_body: usize,
    pub body_timeout: Duration,
    /// Positions a request may use (`--ctx`, at most the bundle's).
    pub ctx: usize,
    pub loaded: qhx::load::Loaded,
    pub spec: Arc<qhx::bundle::Spec>,
    pub template: Option<qhx::chat::ChatTemplate>,
    vocab: OnceLock<Result<Arc<qhx::grammar::Vocab>, String>>,
    next_id: AtomicU64,
}

impl App {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        pool: Arc<Pool>,
        metrics: Arc<Metrics>,
        defaults: Defaults,
        model: String,
        api_key: Option<String>,
        max_body: usize,
        body_timeout: Duration,
        ctx: Option<usize>,
        loaded: qhx::load::Loaded,
        spec: Arc<qhx::bundle::Spec>,
    ) -> App {
        let template = spec.chat_template(Some(loaded.tokenizer())).ok();
        App {
            pool,
            metrics,
            defaults,
            model,
            created: unix_now(),
            api_key,
            max_body,
            body_timeout,
            ctx: ctx.map_or(loaded.max_ctx(), |c| c.min(loaded.max_ctx())),
            loaded,
            spec,
            template,
            vocab: OnceLock::new(),
            next_id: AtomicU64::new(1),
        }
    }

    /// The grammar vocabulary, built on the first constrained request.
    fn vocab(&self) -> Result<Arc<qhx::grammar::Vocab>, ApiError> {
        self.vocab
            .get_or_init(|| {
                self.spec
                    .grammar_vocab()
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(ApiError::internal)
    }

    fn id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06}", self.created)
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The router over `app`.
pub fn router(app: Arc<App>) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&app), auth));
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .with_state(app)
}

/// `Authorization: Bearer <key>` on `/v1/*` when a key is set; compared in constant time.
async fn auth(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if let Some(key) = &app.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        let ok: bool = subtle::ConstantTimeEq::ct_eq(given.as_bytes(), key.as_bytes()).into();
        if !ok {
            app.metrics.request(endpoint_name(req.uri().path()), 401);
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

fn endpoint_name(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => "chat",
        "/v1/completions" => "completions",
        p if p.starts_with("/v1/models") => "models",
        _ => "other",
    }
}

async fn health(State(app): State<Arc<App>>) -> Response {
    let (busy, waiting) = app.pool.load();
    if app.pool.draining() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "shutting_down"})),
        )
            .into_response();
    }
    Json(json!({"status": "ok", "sessions": app.pool.parallel(), "busy": busy, "queued": waiting}))
        .into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics.render(),
    )
        .into_response()
}

fn model_object(app: &App) -> Value {
    json!({"id": app.model, "object": "model", "created": app.created, "owned_by": "qhx",
           "context_length": app.ctx})
}

async fn models(State(app): State<Arc<App>>) -> Response {
    app.metrics.request("models", 200);
    Json(json!({"object": "list", "data": [model_object(&app)]})).into_response()
}

async fn model(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    if id != app.model {
        app.metrics.request("models", 404);
        return ApiError::not_found(format!(
            "model {id:?} does not exist (this server runs {:?})",
            app.model
        ))
        .with_code("model_not_found")
        .into_response();
    }
    app.metrics.request("models", 200);
    Json(model_object(&app)).into_response()
}

async fn chat(State(app): State<Arc<App>>, req: Request) -> Response {
    serve(app, Endpoint::Chat, req).await
}

async fn completions(State(app): State<Arc<App>>, req: Request) -> Response {
    serve(app, Endpoint::Completions, req).await
}

/// Cancels a request's generation when dropped before [`Guard::disarm`]: the client went
/// away (hyper drops the handler's future, or the stream's body).
struct Guard(Option<CancelToken>);

impl Guard {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.cancel();
        }
    }
}

async fn serve(app: Arc<App>, ep: Endpoint, req: Request) -> Response {
    let name = match ep {
        Endpoint::Chat => "chat",
        Endpoint::Completions => "completions",
    };
    let r = start(&app, ep, req).await;
    let status = match &r {
        Ok(r) => r.status().as_u16(),
        Err(e) => e.status.as_u16(),
    };
    app.metrics.request(name, status);
    r.unwrap_or_else(IntoResponse::into_response)
}

async fn read_body(app: &App, body: Body) -> Result<axum::body::Bytes, ApiError> {
    let read = axum::body::to_bytes(body, app.max_body);
    match tokio::time::timeout(app.body_timeout, read).await {
        Err(_) => Err(ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            ..ApiError::bad_body(format!(
                "the body did not arrive within {} s",
                app.body_timeout.as_secs()
            ))
        }),
        Ok(Err(e)) => {
            // A body over the limit is the only error `to_bytes` reports that is the
            // client's size; anything else is a broken upload.
            let too_big = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_big {
                Err(ApiError::too_large(app.max_body))
            } else {
                Err(ApiError::bad_body(format!(
                    "the body could not be read: {e}"
                )))
            }
        }
        Ok(Ok(b)) => Ok(b),
    }
}

async fn start(app: &Arc<App>, ep: Endpoint, req: Request) -> Result<Response, ApiError> {
    if app.pool.draining() {
        return Err(ApiError::shutting_down());
    }
    let body = read_body(app, req.into_body()).await?;
    let work = api::parse(ep, &body, &app.defaults)?;
    if let Some(m) = &work.model {
        if m != &app.model && !m.is_empty() {
            return Err(ApiError::not_found(format!(
                "model {m:?} does not exist (this server runs {:?})",
                app.model
            ))
            .with_code("model_not_found"));
        }
    }
    // Tokenizing and compiling a grammar take CPU time: done on this worker thread, with
    // the runtime told to move its other tasks elsewhere meanwhile (no hop to a blocking
    // thread, which would cost the time to first token a wake-up).
    let (ids, room, tokenize_ms, grammar) = tokio::task::block_in_place(|| prepare(app, &work))?;
    let (tx, rx) = mpsc::unbounded_channel();
    let cancel = CancelToken::new();
    let job = Job {
        work: work.clone(),
        ids,
        room,
        tokenize_ms,
        grammar,
        events: tx,
        cancel: cancel.clone(),
        queued_at: Instant::now(),
    };
    let guard = Guard(Some(cancel));
    app.pool.submit(job)?;
    if work.stream {
        stream_reply(app, ep, work, rx, guard).await
    } else {
        whole_reply(app, ep, &work, rx, guard).await
    }
}

type Prepared = (
    Vec<u32>,
    usize,
    f64,
    Option<(Arc<qhx::grammar::Vocab>, qhx::grammar::Spec)>,
);

/// The prompt's ids, the room they leave in the context, and the compiled grammar.
fn prepare(app: &App, w: &Work) -> Result<Prepared, ApiError> {
    let t0 = Instant::now();
    let tok = app.loaded.tokenizer();
    let tmpl = || match &app.template {
        Some(t) => Ok(t.clone()),
        None => app.spec.chat_template(Some(tok)),
    };
    let ids = qhx::session::encode(&w.prompt, tmpl, tok, app.spec.bos()).map_err(|e| match e {
        qhx::Error::Manifest { .. } | qhx::Error::File { .. } => ApiError::invalid(
            "messages",
            format!("this bundle has no usable chat template ({e}); use /v1/completions"),
        ),
        e => ApiError::invalid("messages", e.to_string()),
    })?;
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    let vocab_n = app.spec.vocab();
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab_n) {
        return Err(ApiError::invalid(
            "prompt",
            format!("token id {bad} is out of the vocabulary ({vocab_n})"),
        ));
    }
    let max_ctx = app.ctx;
    let room = qhx::session::room(ids.len(), max_ctx).map_err(|_| {
        ApiError::invalid(
            "messages",
            format!(
                "the prompt is {} tokens; this model's context is {max_ctx}, leaving no room to generate",
                ids.len()
            ),
        )
        .with_code("context_length_exceeded")
    })?;
    let tokenize_ms = t0.elapsed().as_secs_f64() * 1e3;
    let grammar = match &w.grammar {
        None => None,
        Some(spec) => {
            let vocab = app.vocab()?;
            qhx::grammar::Constraint::new(&vocab, spec).map_err(|e| {
                let param = if w.tools.is_some() {
                    "tools"
                } else {
                    "response_format"
                };
                ApiError::invalid(param, e.to_string())
            })?;
            Some((vocab, spec.clone()))
        }
    };
    Ok((ids, room, tokenize_ms, grammar))
}

fn finish_reason(f: &Finished, calls: bool) -> &'static str {
    if calls {
        return "tool_calls";
    }
    match f.finish {
        FinishReason::Length | FinishReason::CtxFull => "length",
        FinishReason::Eos | FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

fn usage(f: &Finished) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": f.reused},
    })
}

/// llama-server's `timings` block: where the time went (not in OpenAI's schema; clients
/// ignore it).
fn timings(f: &Finished) -> Value {
    let per_s = if f.decode_ms > 0.0 && f.completion_tokens > 1 {
        (f.completion_tokens - 1) as f64 / (f.decode_ms / 1e3)
    } else {
        0.0
    };
    json!({
        "cache_n": f.reused,
        "prompt_n": f.prompt_tokens - f.reused,
        "queued_ms": f.queued_ms,
        "ttft_ms": f.ttft_ms,
        "predicted_n": f.completion_tokens,
        "predicted_ms": f.decode_ms,
        "predicted_per_second": per_s,
        "draft_n": f.drafted,
        "draft_n_accepted": f.accepted,
    })
}

/// The calls in a reply that offered tools (none when it is plain text).
fn calls_of(w: &Work, text: &str) -> Vec<ToolCall> {
    match &w.tools {
        Some((t, _)) => t.parse_calls(text),
        None => Vec::new(),
    }
}

fn call_json(app: &App, calls: &[ToolCall]) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"index": i, "id": app.id("call"), "type": "function",
                   "function": {"name": c.function.name, "arguments": c.function.arguments}})
        })
        .collect()
}

fn fingerprint() -> String {
    format!("qhx-{}", qhx::cli::BUILD_COMMIT)
}

async fn whole_reply(
    app: &Arc<App>,
    ep: Endpoint,
    w: &Work,
    mut rx: mpsc::UnboundedReceiver<Event>,
    mut guard: Guard,
) -> Result<Response, ApiError> {
    let done = loop {
        match rx.recv().await {
            Some(Event::Text(_)) => {}
            Some(Event::Done(d)) => break d?,
            None => return Err(ApiError::internal("the session ended without an answer")),
        }
    };
    guard.disarm();
    let model = w.model.clone().unwrap_or_else(|| app.model.clone());
    let body = match ep {
        Endpoint::Chat => {
            let calls = calls_of(w, &done.text);
            let mut message = json!({"role": "assistant", "content": done.text, "refusal": null});
            if !calls.is_empty() {
                message["content"] = Value::Null;
                message["tool_calls"] = Value::Array(call_json(app, &calls));
            }
            json!({
                "id": app.id("chatcmpl"), "object": "chat.completion", "created": unix_now(),
                "model": model, "system_fingerprint": fingerprint(),
                "choices": [{"index": 0, "message": message, "logprobs": null,
                             "finish_reason": finish_reason(&done, !calls.is_empty())}],
                "usage": usage(&done),
                "timings": timings(&done),
            })
        }
        Endpoint::Completions => json!({
            "id": app.id("cmpl"), "object": "text_completion", "created": unix_now(),
            "model": model, "system_fingerprint": fingerprint(),
            "choices": [{"index": 0, "text": done.text, "logprobs": null,
                         "finish_reason": finish_reason(&done, false)}],
            "usage": usage(&done),
            "timings": timings(&done),
        }),
    };
    Ok(Json(body).into_response())
}

/// What a stream has sent and holds.
struct StreamState {
    app: Arc<App>,
    ep: Endpoint,
    work: Work,
    rx: mpsc::UnboundedReceiver<Event>,
    id: String,
    created: u64,
    model: String,
    /// Chat: text held while it may still turn out to be a tool call.
    held: String,
    /// Tools are offered and the reply has not yet shown whether it is a call.
    undecided: bool,
    /// The reply is a tool call: everything is held to the end.
    calling: bool,
    pending: Vec<SseEvent>,
    first: Option<Event>,
    ended: bool,
    _guard: Guard,
}

impl StreamState {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> SseEvent {
        let body = match self.ep {
            Endpoint::Chat => json!({
                "id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "system_fingerprint": fingerprint(),
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            }),
            Endpoint::Completions => json!({
                "id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "system_fingerprint": fingerprint(),
                "choices": [{"index": 0, "text": delta.get("content").cloned().unwrap_or(json!("")),
                             "logprobs": null, "finish_reason": finish}],
            }),
        };
        SseEvent::default().data(body.to_string())
    }

    fn text(&mut self, t: String) {
        if self.undecided {
            self.held.push_str(&t);
            let shown = self.held.trim_start();
            if shown.is_empty() {
                return;
            }
            self.undecided = false;
            self.calling = shown.starts_with('<');
            if self.calling {
                return;
            }
            let held = std::mem::take(&mut self.held);
            let c = self.chunk(json!({"content": held}), None);
            self.pending.push(c);
            return;
        }
        if self.calling {
            self.held.push_str(&t);
            return;
        }
        let c = self.chunk(json!({"content": t}), None);
        self.pending.push(c);
    }

    fn done(&mut self, d: Result<Finished, ApiError>) {
        self.ended = true;
        let f = match d {
            Ok(f) => f,
            Err(e) => {
                // Headers are gone: the error goes in the stream, as OpenAI's does.
                self.pending
                    .push(SseEvent::default().data(e.body().to_string()));
                self.pending.push(SseEvent::default().data("[DONE]"));
                return;
            }
        };
        let calls = if self.ep == Endpoint::Chat {
            calls_of(&self.work, &f.text)
        } else {
            Vec::new()
        };
        if !calls.is_empty() {
            let tc = call_json(&self.app, &calls);
            let c = self.chunk(json!({"tool_calls": tc}), None);
            self.pending.push(c);
        } else if !self.held.is_empty() {
            let held = std::mem::take(&mut self.held);
            let c = self.chunk(json!({"content": held}), None);
            self.pending.push(c);
        }
        let c = self.chunk(json!({}), Some(finish_reason(&f, !calls.is_empty())));
        self.pending.push(c);
        if self.work.include_usage {
            let mut u = json!({
                "id": self.id, "created": self.created, "model": self.model,
                "system_fingerprint": fingerprint(), "choices": [], "usage": usage(&f),
                "timings": timings(&f),
            });
            u["object"] = json!(match self.ep {
                Endpoint::Chat => "chat.completion.chunk",
                Endpoint::Completions => "text_completion",
            });
            self.pending.push(SseEvent::default().data(u.to_string()));
        }
        self.pending.push(SseEvent::default().data("[DONE]"));
        self._guard.disarm();
    }
}

async fn stream_reply(
    app: &Arc<App>,
    ep: Endpoint,
    work: Work,
    mut rx: mpsc::UnboundedReceiver<Event>,
    guard: Guard,
) -> Result<Response, ApiError> {
    // An error before the first token (a runtime failure) is still an HTTP status.
    let first = match rx.recv().await {
        Some(Event::Done(Err(e))) => return Err(e),
        Some(ev) => ev,
        None => return Err(ApiError::internal("the session ended without an answer")),
    };
    let mut st = StreamState {
        app: Arc::clone(app),
        ep,
        id: app.id(if ep == Endpoint::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        }),
        created: unix_now(),
        model: work.model.clone().unwrap_or_else(|| app.model.clone()),
        // A reply to a request with tools may be a call: held until its first characters tell.
        undecided: ep == Endpoint::Chat && work.tools.is_some(),
        work,
        rx,
        held: String::new(),
        calling: false,
        pending: Vec::new(),
        first: Some(first),
        ended: false,
        _guard: guard,
    };
    if ep == Endpoint::Chat {
        let c = st.chunk(json!({"role": "assistant", "content": ""}), None);
        st.pending.push(c);
    }
    let s = stream::unfold(st, |mut st| async move {
        loop {
            if !st.pending.is_empty() {
                let ev = st.pending.remove(0);
                return Some((Ok::<_, std::convert::Infallible>(ev), st));
            }
            if st.ended {
                return None;
            }
            let ev = match st.first.take() {
                Some(e) => Some(e),
                None => st.rx.recv().await,
            };
            match ev {
                Some(Event::Text(t)) => st.text(t),
                Some(Event::Done(d)) => st.done(d),
                None => st.done(Err(ApiError::internal(
                    "the session ended without an answer",
                ))),
            }
        }
    });
    Ok(sse(s))
}

fn sse<S>(s: S) -> Response
where
    S: Stream<Item = Result<SseEvent, std::convert::Infallible>> + Send + 'static,
{
    Sse::new(s)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}
