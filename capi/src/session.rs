//! The Rust side of the C handles: a runtime, models loaded on it, and sessions that
//! generate. Nothing here touches a raw pointer (`unsafe` is forbidden); `ffi.rs` turns C
//! arguments into these types and results back into C.

#![forbid(unsafe_code)]

use crate::abi::{self, Status};
use qhx_core::bundle::Spec;
use qhx_core::cancel::{CancelToken, Poll};
use qhx_core::chat::Message;
use qhx_core::engine::{FinishReason, GenConfig};
use qhx_core::grammar::{self, Vocab};
use qhx_core::load::LoadOptions;
use qhx_core::load::Loaded;
use qhx_core::qnn::Runtime;
use qhx_core::reasoning;
use qhx_core::sampler::{SamplerConfig, WHOLE_CONTEXT};
use qhx_core::session::{self, Chat, Prompt, Session, TextRequest};
use qhx_core::text::TextSink;
use qhx_core::tools::Tools;
use qhx_core::Error;
use std::ffi::CString;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

/// A failed call: the status C sees and the message behind it.
#[derive(Debug)]
pub struct Failure {
    pub status: Status,
    pub msg: String,
    /// The call held the session when it failed, so its message becomes the session's last
    /// error. False for a call refused because another thread holds the session: that
    /// message goes to the calling thread's last error alone, and the owner's message (and
    /// the string `qhx_session_last_error` handed out for it) stays as it was.
    pub held_session: bool,
}

impl Failure {
    pub fn new(status: Status, msg: impl Into<String>) -> Failure {
        Failure {
            status,
            msg: msg.into(),
            held_session: true,
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let status = match &e {
            Error::Load(_) | Error::Backend { .. } => abi::QNN_LOAD,
            Error::Qnn { .. } | Error::MissingEntry { .. } => abi::QNN_API,
            Error::Manifest { .. }
            | Error::File { .. }
            | Error::Tokenizer { .. }
            | Error::Graph { .. }
            | Error::TokenOutOfRange { .. } => abi::MODEL,
            Error::Io { .. } => abi::IO,
            Error::EmptyPrompt => abi::INVALID_ARGUMENT,
            Error::PromptTooLong { .. } | Error::NoRoom { .. } => abi::CONTEXT_FULL,
            Error::Grammar(_) => abi::GRAMMAR,
            Error::Cancelled => abi::CANCELLED,
            Error::NonFinite { .. } => abi::HOST_OP_FAILED,
            Error::ThreadPanicked(_) => abi::INTERNAL,
        };
        Failure::new(status, e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Failure>;

// C may use a session, a model and the runtime from any thread (a session by one thread at a
// time, its cancel from any): each handle must be Send + Sync, checked at compile time.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<RuntimeHandle>();
    shared::<ModelHandle>();
    shared::<SessionHandle>();
};

/// The one runtime of the process, while it (or a model on it) lives.
static LIVE_RUNTIME: Mutex<Weak<Runtime>> = Mutex::new(Weak::new());

pub struct RuntimeHandle {
    pub rt: Arc<Runtime>,
}

impl RuntimeHandle {
    /// Open the QNN libraries (default names when None), start the backend, vote for burst
    /// clocks and load rpcmem, as the CLI does.
    pub fn create(htp: Option<&str>, system: Option<&str>) -> Result<RuntimeHandle> {
        let mut live = LIVE_RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
        if live.upgrade().is_some() {
            return Err(Failure::new(
                abi::BUSY,
                "a runtime already exists in this process (free it and every model loaded on it first)",
            ));
        }
        let (htp_default, sys_default) = if cfg!(windows) {
            ("QnnHtp.dll", "QnnSystem.dll")
        } else {
            ("libQnnHtp.so", "libQnnSystem.so")
        };
        let opts = LoadOptions::default();
        let (rt, _note, _warnings) = qhx_core::load::open_runtime(
            Path::new(htp.unwrap_or(htp_default)),
            None,
            Path::new(system.unwrap_or(sys_default)),
            &opts,
        )?;
        *live = Arc::downgrade(&rt);
        Ok(RuntimeHandle { rt })
    }

    /// (arch as "v79", soc model) as the backend reports them.
    pub fn device(&self) -> (Option<String>, Option<u32>) {
        let f = &self.rt.device_facts;
        (f.dsp_arch.map(|a| format!("v{a}")), f.soc_model)
    }
}

pub struct ModelHandle {
    spec: Arc<Spec>,
    loaded: Loaded,
    /// The grammar vocabulary, read on the first constrained request.
    vocab: OnceLock<std::result::Result<Arc<Vocab>, String>>,
}

impl ModelHandle {
    /// A manifest bundle or a Genie config, its paths resolved against `artifacts` (the
    /// file's own directory when None), loaded onto the runtime.
    pub fn load(rt: &RuntimeHandle, path: &str, artifacts: Option<&str>) -> Result<ModelHandle> {
        let path = Path::new(path);
        if !path.is_file() {
            return Err(Failure::new(
                abi::INVALID_ARGUMENT,
                format!(
                    "{}: not a manifest or genie_config.json file",
                    path.display()
                ),
            ));
        }
        let root = match artifacts {
            Some(a) => Path::new(a).to_path_buf(),
            None => path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf(),
        };
        let spec = Spec::load(path, &root)?;
        spec.check_files()?;
        let loaded = Loaded::load_on(&spec, &rt.rt, &LoadOptions::default())?;
        Ok(ModelHandle {
            spec: Arc::new(spec),
            loaded,
            vocab: OnceLock::new(),
        })
    }

    fn vocab(&self) -> Result<Arc<Vocab>> {
        self.vocab
            .get_or_init(|| {
                self.spec
                    .grammar_vocab()
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|m| Failure::new(abi::MODEL, m))
    }
}

/// One request, as read from the C structs.
pub struct Request {
    pub text: String,
    pub system: Option<String>,
    pub history: Vec<String>,
    pub no_template: bool,
    pub disable_thinking: bool,
    pub max_new_tokens: i32,
    pub sampler: SamplerConfig,
    pub stops: Vec<String>,
    pub grammar: Option<grammar::Spec>,
    /// Tools offered through the chat template (grammar kinds 2 and 3).
    pub tools: Option<Tools>,
    pub should_cancel: Option<Poll>,
    /// Speculative decoding (`options.speculation`).
    pub spec: Option<qhx_core::speculative::SpecConfig>,
}

/// Sampling settings from the C config (QHexRT semantics: the penalty covers every token
/// of prompt and output; seed <= 0 is random).
pub fn sampler(cfg: &abi::GenCfg) -> SamplerConfig {
    SamplerConfig {
        temp: cfg.temperature,
        top_k: cfg.top_k.max(0) as usize,
        top_p: if cfg.top_p > 0.0 && cfg.top_p < 1.0 {
            cfg.top_p
        } else {
            1.0
        },
        min_p: cfg.min_p.max(0.0),
        repeat_penalty: if cfg.repetition_penalty > 0.0 {
            cfg.repetition_penalty
        } else {
            1.0
        },
        repeat_last_n: WHOLE_CONTEXT,
        seed: Some(if cfg.seed > 0 {
            cfg.seed as u64
        } else {
            rand::random()
        }),
    }
}

/// The grammar of a request, and the tools it offers: kind and text (QHexRT's `json:` /
/// `toolcall:` / `toolcall_opt:` prefixes accepted).
pub fn grammar_spec(
    kind: i32,
    text: Option<&str>,
) -> Result<(Option<grammar::Spec>, Option<Tools>)> {
    let text = text.unwrap_or("");
    let body = |prefix: &str| text.strip_prefix(prefix).unwrap_or(text).trim();
    let tools = |prefix: &str, required: bool| -> Result<(Option<grammar::Spec>, Option<Tools>)> {
        let t =
            Tools::parse(body(prefix)).map_err(|e| Failure::new(abi::GRAMMAR, e.to_string()))?;
        Ok((Some(t.grammar(required)), Some(t)))
    };
    let only = |g: grammar::Spec| Ok((Some(g), None));
    match kind {
        abi::GRAMMAR_NONE => Ok((None, None)),
        abi::GRAMMAR_JSON => {
            let schema = body("json:");
            let v = if schema.is_empty() {
                serde_json::json!({"type": "object"})
            } else {
                serde_json::from_str(schema).map_err(|e| {
                    Failure::new(abi::GRAMMAR, format!("grammar: not a JSON schema: {e}"))
                })?
            };
            only(grammar::Spec::JsonSchema(v))
        }
        abi::GRAMMAR_TOOL_CALL => tools("toolcall:", true),
        abi::GRAMMAR_TOOL_CALL_OPTIONAL => tools("toolcall_opt:", false),
        abi::GRAMMAR_LARK => only(grammar::Spec::from_grammar_text(text)),
        k => Err(Failure::new(
            abi::INVALID_ARGUMENT,
            format!("grammar_kind {k} is not one of 0 (none), 1 (JSON), 2, 3 (tool call), 4 (Lark/GBNF)"),
        )),
    }
}

/// What a finished request reports besides its text.
pub struct Done {
    pub n_prompt: usize,
    pub n_generated: usize,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub cancelled: bool,
}

struct Inner {
    session: Session,
    /// The draft bundle the session's engine drafts with (`"draft <bundle>"`).
    draft: Option<std::path::PathBuf>,
    /// The last request's text (what `qhx_output.text` points at).
    text: CString,
}

pub struct SessionHandle {
    model: Arc<ModelHandle>,
    /// Raised by `qhx_session_cancel` from any thread; reset when a request starts.
    cancel: CancelToken,
    inner: Mutex<Inner>,
    error: Mutex<CString>,
}

impl SessionHandle {
    pub fn create(model: &Arc<ModelHandle>) -> Result<SessionHandle> {
        let session = Session::new(Arc::clone(&model.spec), model.loaded.clone())?;
        Ok(SessionHandle {
            model: Arc::clone(model),
            cancel: CancelToken::new(),
            inner: Mutex::new(Inner {
                session,
                draft: None,
                text: CString::default(),
            }),
            error: Mutex::new(CString::default()),
        })
    }

    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    pub fn reset(&self) -> Result<()> {
        let mut inner = self.lock()?;
        inner.session.reset();
        Ok(())
    }

    /// The message of this session's last failed call ("" when none failed).
    pub fn last_error(&self) -> *const std::ffi::c_char {
        self.error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ptr()
    }

    pub fn set_error(&self, msg: &str) {
        let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
        *self.error.lock().unwrap_or_else(|p| p.into_inner()) = c;
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>> {
        match self.inner.try_lock() {
            Ok(g) => Ok(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => Err(Failure {
                held_session: false,
                ..Failure::new(
                    abi::BUSY,
                    "the session is in use by another thread (one call at a time per session)",
                )
            }),
        }
    }

    /// The request as the session composes every front end's: raw text with the bundle's
    /// BOS, or the chat template over system, history and the user turn.
    fn prompt(req: &Request) -> Prompt {
        if req.no_template {
            return Prompt::Text(req.text.clone());
        }
        let mut messages = Vec::new();
        if let Some(s) = &req.system {
            messages.push(Message::new("system", s));
        }
        for (i, h) in req.history.iter().enumerate() {
            messages.push(Message::new(
                if i % 2 == 0 { "user" } else { "assistant" },
                h,
            ));
        }
        messages.push(Message::new("user", &req.text));
        Prompt::Chat(Chat {
            messages,
            tools: req.tools.clone(),
            no_thinking: req.disable_thinking,
        })
    }

    /// Run one request from a fresh cache, passing text to `sink`.
    pub fn generate(&self, req: Request, sink: &mut dyn TextSink) -> Result<Done> {
        let mut inner = self.lock()?;
        let t0 = Instant::now();
        let ids = inner
            .session
            .prompt_ids(&Self::prompt(&req))
            .map_err(|e| match e {
                // a template that cannot render these messages is the caller's input
                Error::Tokenizer { .. } | Error::Io { .. } => Failure::from(e),
                Error::Manifest { .. } => {
                    Failure::new(abi::MODEL, format!("{e} (set no_template for raw text)"))
                }
                e => Failure::new(abi::INVALID_ARGUMENT, e.to_string()),
            })?;
        let tokenize_ms = t0.elapsed().as_secs_f64() * 1e3;
        let room = session::room(ids.len(), self.model.loaded.max_ctx())?;
        let wanted = match req.max_new_tokens {
            n if n > 0 => n as usize,
            _ => room,
        };
        self.cancel.reset();
        let cancel = match &req.should_cancel {
            Some(p) => self.cancel.and_poll(Arc::clone(p)),
            None => self.cancel.clone(),
        };
        let cfg = GenConfig {
            n_tokens: wanted,
            sampler: req.sampler,
            allow_nonfinite: false,
            ignore_eos: false,
            teacher: None,
            cancel,
            spec: req.spec.clone(),
        };
        let want = req.spec.as_ref().and_then(|s| s.draft_bundle.clone());
        if want.is_some() && want != inner.draft {
            inner
                .session
                .attach_draft(req.spec.as_ref(), &LoadOptions::default())
                .map_err(|e| {
                    let mut f = Failure::from(e);
                    let p = want.as_deref().unwrap_or(std::path::Path::new(""));
                    f.msg = format!("draft bundle {}: {}", p.display(), f.msg);
                    f
                })?;
            inner.draft = want;
        }
        let grammar = match req.grammar {
            Some(spec) => Some((self.model.vocab()?, spec)),
            None => None,
        };
        let text = TextRequest {
            stops: req.stops,
            reasoning: reasoning::Mode::Show,
            reasoning_budget: None,
            grammar,
        };
        inner.text = CString::default();
        let turn = inner
            .session
            .generate(&ids, &cfg, wanted, &text, tokenize_ms, Some(sink))?;
        inner.text = CString::new(turn.text.replace('\0', " ")).unwrap_or_default();
        let s = &turn.output.stats;
        let eos = self.model.loaded.eos();
        Ok(Done {
            n_prompt: ids.len(),
            // The tokens behind the text (the callback saw each): an end token is not one.
            n_generated: turn.output.text_ids(turn.finish, &eos).len(),
            prefill_ms: s.prefill_ms,
            decode_ms: s.decode_ms,
            cancelled: turn.finish == FinishReason::Cancelled,
        })
    }

    /// The last request's text (valid until the next request or the session's free).
    pub fn text_ptr(&self) -> *const std::ffi::c_char {
        match self.inner.try_lock() {
            Ok(g) => g.text.as_ptr(),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().text.as_ptr(),
            Err(std::sync::TryLockError::WouldBlock) => c"".as_ptr(),
        }
    }
}
