//! The exported functions: pointer checks, panic containment and status mapping around
//! `session.rs`. Every function body runs inside `guard`, so no panic unwinds into C.

use crate::abi::{self, GenCfg, GenerateOptions, Inputs, Output, Status, TokenCb};
use crate::session::{
    grammar_spec, sampler, Failure, ModelHandle, Request, Result, RuntimeHandle, SessionHandle,
};
use qhx_core::text::TextSink;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Opaque handles: what C holds is a `Box` of one of these.
pub struct QhxRuntime(RuntimeHandle);
pub struct QhxModel(Arc<ModelHandle>);
pub struct QhxSession(SessionHandle);

thread_local! {
    /// The message of this thread's last failed call that has no session to hold it.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = c);
}

fn panic_failure(p: Box<dyn std::any::Any + Send>) -> Failure {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    Failure::new(abi::INTERNAL, format!("internal error: {what}"))
}

/// Run `f`, turning a panic into an INTERNAL failure.
fn guard<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(panic_failure(p)))
}

/// A new handle for C, or NULL with the failure's message as this thread's last error.
fn into_handle<T>(r: Result<T>) -> *mut T {
    match r {
        Ok(h) => Box::into_raw(Box::new(h)),
        Err(f) => {
            set_last_error(&f.msg);
            std::ptr::null_mut()
        }
    }
}

/// Free a handle made by `into_handle` (NULL is a no-op); a panic in a destructor stays here.
///
/// # Safety
/// `p` is NULL or a pointer from `into_handle::<T>`, freed once.
unsafe fn free_handle<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: a Box made by into_handle, freed once per the caller's contract.
        let b = unsafe { Box::from_raw(p) };
        let _ = catch_unwind(AssertUnwindSafe(move || drop(b)));
    }
}

/// A status for C; a failure's message goes to this thread's last error.
fn status(r: Result<()>) -> Status {
    match r {
        Ok(()) => abi::OK,
        Err(f) => {
            set_last_error(&f.msg);
            f.status
        }
    }
}

/// Borrow a C string (None for NULL).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that outlives `'a`.
unsafe fn opt_str<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(Some)
        .map_err(|_| Failure::new(abi::INVALID_ARGUMENT, format!("{what} is not valid UTF-8")))
}

/// `n` C strings from an array (each non-NULL).
///
/// # Safety
/// `p` points at `n` readable pointers, each a NUL-terminated string, or `n` is 0.
unsafe fn str_array(p: *const *const c_char, n: i32, what: &str) -> Result<Vec<String>> {
    if n <= 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return Err(Failure::new(
            abi::INVALID_ARGUMENT,
            format!("{what} is NULL but its count is {n}"),
        ));
    }
    (0..n as usize)
        .map(|i| {
            // SAFETY: i < n elements, per the caller's contract.
            let e = unsafe { *p.add(i) };
            // SAFETY: each element is NULL or a C string, per the caller's contract.
            unsafe { opt_str(e, what) }?
                .map(str::to_string)
                .ok_or_else(|| Failure::new(abi::INVALID_ARGUMENT, format!("{what}[{i}] is NULL")))
        })
        .collect()
}

#[no_mangle]
pub extern "C" fn qhx_version() -> *const c_char {
    static V: &CStr = c"qhx/0.1.0 ABI-1.0";
    V.as_ptr()
}

#[no_mangle]
pub extern "C" fn qhx_status_str(s: Status) -> *const c_char {
    abi::status_name(s).as_ptr()
}

#[no_mangle]
pub extern "C" fn qhx_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|e| e.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// # Safety
/// Each argument is NULL or a NUL-terminated path.
#[no_mangle]
pub unsafe extern "C" fn qhx_runtime_create(
    htp_lib: *const c_char,
    system_lib: *const c_char,
) -> *mut QhxRuntime {
    let r = guard(|| {
        // SAFETY: per this function's contract.
        let htp = unsafe { opt_str(htp_lib, "htp_lib") }?;
        // SAFETY: as above.
        let sys = unsafe { opt_str(system_lib, "system_lib") }?;
        RuntimeHandle::create(htp, sys).map(QhxRuntime)
    });
    into_handle(r)
}

/// # Safety
/// `rt` is NULL or a runtime from `qhx_runtime_create`, freed once.
#[no_mangle]
pub unsafe extern "C" fn qhx_runtime_free(rt: *mut QhxRuntime) {
    // SAFETY: per this function's contract.
    unsafe { free_handle(rt) }
}

/// # Safety
/// `rt` is a live runtime; `arch` is NULL or writable for `arch_size` bytes; the int
/// pointers are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn qhx_runtime_device(
    rt: *const QhxRuntime,
    arch: *mut c_char,
    arch_size: usize,
    soc_model: *mut c_int,
    htp_device: *mut c_int,
) -> Status {
    status(guard(|| {
        // SAFETY: NULL or a live runtime, per the contract.
        let rt = unsafe { rt.as_ref() }
            .ok_or_else(|| Failure::new(abi::INVALID_ARGUMENT, "runtime is NULL"))?;
        let (a, soc) = rt.0.device();
        if !arch.is_null() && arch_size > 0 {
            let a = a.unwrap_or_default();
            let n = a.len().min(arch_size - 1);
            // SAFETY: `arch` is writable for arch_size bytes; n + 1 <= arch_size.
            unsafe {
                std::ptr::copy_nonoverlapping(a.as_ptr(), arch as *mut u8, n);
                *arch.add(n) = 0;
            }
        }
        if !soc_model.is_null() {
            // SAFETY: writable per the contract.
            unsafe { *soc_model = soc.map_or(0, |s| s as c_int) };
        }
        if !htp_device.is_null() {
            // SAFETY: writable per the contract. qhx drives the backend's first device.
            unsafe { *htp_device = 0 };
        }
        Ok(())
    }))
}

/// # Safety
/// `rt` is a live runtime; the paths are NUL-terminated (`artifacts_dir` may be NULL).
#[no_mangle]
pub unsafe extern "C" fn qhx_model_load(
    rt: *mut QhxRuntime,
    manifest_path: *const c_char,
    artifacts_dir: *const c_char,
) -> *mut QhxModel {
    let r = guard(|| {
        // SAFETY: NULL or a live runtime, per the contract.
        let rt = unsafe { rt.as_ref() }
            .ok_or_else(|| Failure::new(abi::INVALID_ARGUMENT, "runtime is NULL"))?;
        // SAFETY: per the contract.
        let path = unsafe { opt_str(manifest_path, "manifest_path") }?
            .ok_or_else(|| Failure::new(abi::INVALID_ARGUMENT, "manifest_path is NULL"))?;
        // SAFETY: per the contract.
        let root = unsafe { opt_str(artifacts_dir, "artifacts_dir") }?;
        ModelHandle::load(&rt.0, path, root).map(|m| QhxModel(Arc::new(m)))
    });
    into_handle(r)
}

/// # Safety
/// `m` is NULL or a model from `qhx_model_load`, freed once.
#[no_mangle]
pub unsafe extern "C" fn qhx_model_free(m: *mut QhxModel) {
    // SAFETY: per this function's contract.
    unsafe { free_handle(m) }
}

/// # Safety
/// `m` is a live model.
#[no_mangle]
pub unsafe extern "C" fn qhx_session_create(m: *mut QhxModel) -> *mut QhxSession {
    let r = guard(|| {
        // SAFETY: NULL or a live model, per the contract.
        let m = unsafe { m.as_ref() }
            .ok_or_else(|| Failure::new(abi::INVALID_ARGUMENT, "model is NULL"))?;
        SessionHandle::create(&m.0).map(QhxSession)
    });
    into_handle(r)
}

/// # Safety
/// `s` is NULL or a session from `qhx_session_create`, freed once, not in use.
#[no_mangle]
pub unsafe extern "C" fn qhx_session_free(s: *mut QhxSession) {
    // SAFETY: per this function's contract.
    unsafe { free_handle(s) }
}

/// Borrow a session for a call; a failure is recorded on it (or on the thread if NULL).
///
/// # Safety
/// `s` is NULL or a live session.
unsafe fn with_session(
    s: *const QhxSession,
    f: impl FnOnce(&SessionHandle) -> Result<()>,
) -> Status {
    // SAFETY: NULL or a live session, per the caller's contract.
    let Some(s) = (unsafe { s.as_ref() }) else {
        set_last_error("session is NULL");
        return abi::INVALID_ARGUMENT;
    };
    match guard(|| f(&s.0)) {
        Ok(()) => abi::OK,
        Err(e) => {
            if e.held_session {
                s.0.set_error(&e.msg);
            }
            set_last_error(&e.msg);
            e.status
        }
    }
}

/// # Safety
/// `s` is a live session.
#[no_mangle]
pub unsafe extern "C" fn qhx_session_reset(s: *mut QhxSession) -> Status {
    // SAFETY: per this function's contract.
    unsafe { with_session(s, |s| s.reset()) }
}

/// # Safety
/// `s` is a live session; callable from any thread while another generates on it.
#[no_mangle]
pub unsafe extern "C" fn qhx_session_cancel(s: *mut QhxSession) -> Status {
    // SAFETY: NULL or a live session, per the contract; only the atomic flag is touched.
    match unsafe { s.as_ref() } {
        Some(s) => {
            s.0.cancel();
            abi::OK
        }
        None => abi::INVALID_ARGUMENT,
    }
}

/// # Safety
/// `s` is NULL or a live session. The string is valid until the session's next failing
/// call or its free.
#[no_mangle]
pub unsafe extern "C" fn qhx_session_last_error(s: *const QhxSession) -> *const c_char {
    // SAFETY: NULL or a live session, per the contract.
    match unsafe { s.as_ref() } {
        Some(s) => s.0.last_error(),
        None => c"session is NULL".as_ptr(),
    }
}

/// # Safety
/// `cfg` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn qhx_gen_cfg_default(cfg: *mut GenCfg) {
    if !cfg.is_null() {
        // SAFETY: writable per the contract.
        unsafe { cfg.write(GenCfg::default()) };
    }
}

/// # Safety
/// `o` is NULL or writable for the caller's `qhx_generate_options`.
#[no_mangle]
pub unsafe extern "C" fn qhx_generate_options_default(o: *mut GenerateOptions) {
    if !o.is_null() {
        // SAFETY: writable per the contract.
        unsafe { o.write(GenerateOptions::default()) };
    }
}

/// The options as this library knows them, reading only the fields the caller's
/// `struct_size` covers whole (an older, shorter struct leaves the rest at defaults; a size
/// that ends inside a field leaves that field at its default too).
///
/// # Safety
/// `o` is NULL or readable for its `struct_size` bytes.
unsafe fn read_options(o: *const GenerateOptions) -> Result<GenerateOptions> {
    use std::mem::{offset_of, size_of};
    let mut out = GenerateOptions::default();
    if o.is_null() {
        return Ok(out);
    }
    // SAFETY: struct_size is the first field, readable per the contract.
    let size = unsafe { std::ptr::read_unaligned(o as *const u32) } as usize;
    if size < size_of::<u32>() {
        return Err(Failure::new(
            abi::INVALID_ARGUMENT,
            format!("options.struct_size is {size}: set it to sizeof(qhx_generate_options)"),
        ));
    }
    let covers = |off: usize, len: usize| off + len <= size;
    // SAFETY (each read below): the field lies within the caller's `size` readable bytes;
    // reads are unaligned-safe; any bit pattern is a valid int, nullable fn pointer or
    // raw pointer.
    if covers(
        offset_of!(GenerateOptions, disable_thinking),
        size_of::<i32>(),
    ) {
        // SAFETY: see above.
        out.disable_thinking =
            unsafe { std::ptr::addr_of!((*o).disable_thinking).read_unaligned() };
    }
    if covers(
        offset_of!(GenerateOptions, should_cancel),
        size_of::<abi::ShouldCancel>(),
    ) {
        // SAFETY: see above.
        out.should_cancel = unsafe { std::ptr::addr_of!((*o).should_cancel).read_unaligned() };
    }
    if covers(
        offset_of!(GenerateOptions, should_cancel_user),
        size_of::<*mut c_void>(),
    ) {
        // SAFETY: see above.
        out.should_cancel_user =
            unsafe { std::ptr::addr_of!((*o).should_cancel_user).read_unaligned() };
    }
    if covers(
        offset_of!(GenerateOptions, speculation),
        size_of::<*const c_char>(),
    ) {
        // SAFETY: see above.
        out.speculation = unsafe { std::ptr::addr_of!((*o).speculation).read_unaligned() };
    }
    if covers(offset_of!(GenerateOptions, draft_max), size_of::<i32>()) {
        // SAFETY: see above.
        out.draft_max = unsafe { std::ptr::addr_of!((*o).draft_max).read_unaligned() };
    }
    out.struct_size = size.min(size_of::<GenerateOptions>()) as u32;
    Ok(out)
}

/// Calls the app's token callback: per token, then once at the end.
struct CallbackSink {
    cb: TokenCb,
    user: *mut c_void,
    stopped: bool,
    buf: Vec<u8>,
}

impl CallbackSink {
    fn call(&mut self, text: &str, token: i64, is_final: bool) -> bool {
        let Some(cb) = self.cb else { return true };
        let ptr = if text.is_empty() && is_final {
            std::ptr::null()
        } else {
            self.buf.clear();
            self.buf.extend_from_slice(text.as_bytes());
            self.buf.push(0);
            self.buf.as_ptr() as *const c_char
        };
        let len = text.len().min(c_int::MAX as usize) as c_int;
        let id = token.clamp(-1, c_int::MAX as i64) as c_int;
        // SAFETY: the app's callback with its own user pointer; `ptr` is NULL or points at
        // `len` bytes plus a NUL, alive for the call.
        unsafe { cb(self.user, ptr, len, id, is_final as c_int) != 0 }
    }
}

impl TextSink for CallbackSink {
    fn token(&mut self, text: &str, token: u32) -> qhx_core::Result<bool> {
        if self.stopped {
            return Ok(false);
        }
        if !self.call(text, token as i64, false) {
            self.stopped = true;
        }
        Ok(!self.stopped)
    }

    fn end(&mut self, rest: &str) -> qhx_core::Result<()> {
        self.call(rest, -1, true);
        Ok(())
    }

    fn failed(&mut self, _released: bool) {
        self.call("", -1, true);
    }
}

/// The app's `should_cancel` and its user pointer, polled on the generating thread.
struct CancelPoll {
    f: unsafe extern "C" fn(*mut c_void) -> c_int,
    user: usize,
}

// SAFETY: the pair is only called from the thread running qhx_generate_ex (the token's poll
// runs where the engine checks it), as the app expects; it is stored as an address.
unsafe impl Send for CancelPoll {}
// SAFETY: as above; nothing is shared mutably on the Rust side.
unsafe impl Sync for CancelPoll {}

/// # Safety
/// `inputs` and `cfg` are NULL or readable and, with every string they point at, valid for
/// the call.
unsafe fn read_request(
    inputs: *const Inputs,
    cfg: *const GenCfg,
    options: &GenerateOptions,
) -> Result<Request> {
    // SAFETY: NULL or readable, per the contract.
    let inp = unsafe { inputs.as_ref() }
        .ok_or_else(|| Failure::new(abi::INVALID_ARGUMENT, "inputs is NULL"))?;
    // SAFETY: NULL or readable, per the contract.
    let cfg = match unsafe { cfg.as_ref() } {
        Some(c) => *c,
        None => GenCfg::default(),
    };
    if !inp.image_path.is_null() || !inp.mask_path.is_null() {
        return Err(Failure::new(
            abi::UNSUPPORTED,
            "image inputs are not supported: text bundles only",
        ));
    }
    if !inp.audio.is_null() || inp.n_audio > 0 {
        return Err(Failure::new(
            abi::UNSUPPORTED,
            "audio inputs are not supported: text bundles only",
        ));
    }
    // SAFETY: per the contract.
    let text = unsafe { opt_str(inp.text, "inputs.text") }?
        .ok_or_else(|| Failure::new(abi::INVALID_ARGUMENT, "inputs.text is NULL"))?;
    // SAFETY: per the contract.
    let system = unsafe { opt_str(inp.system_prompt, "inputs.system_prompt") }?;
    // SAFETY: per the contract.
    let history = unsafe { str_array(inp.history, inp.n_history, "inputs.history") }?;
    // SAFETY: per the contract.
    let stops = unsafe { str_array(cfg.stop_strings, cfg.n_stop_strings, "cfg.stop_strings") }?;
    // SAFETY: per the contract.
    let gtext = unsafe { opt_str(cfg.grammar, "cfg.grammar") }?;
    let (grammar, tools) = grammar_spec(cfg.grammar_kind, gtext)?;
    if tools.is_some() && inp.no_template != 0 {
        return Err(Failure::new(
            abi::INVALID_ARGUMENT,
            "tool calls need the chat template (no_template is set)",
        ));
    }
    let should_cancel = options.should_cancel.map(|f| {
        let p = CancelPoll {
            f,
            user: options.should_cancel_user as usize,
        };
        let poll: qhx_core::cancel::Poll = Arc::new(move || {
            // SAFETY: the app's callback with its user pointer (see CancelPoll).
            unsafe { (p.f)(p.user as *mut c_void) != 0 }
        });
        poll
    });
    // SAFETY: per the contract (NULL or a NUL-terminated string).
    let words = unsafe { opt_str(options.speculation, "options.speculation") }?;
    let spec = speculation(words, options.draft_max)?;
    Ok(Request {
        spec,
        text: text.to_string(),
        system: system.map(str::to_string),
        history,
        no_template: inp.no_template != 0,
        disable_thinking: options.disable_thinking != 0,
        max_new_tokens: cfg.max_new_tokens,
        sampler: sampler(&cfg),
        stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
        grammar,
        tools,
        should_cancel,
    })
}

/// `options.speculation` and `draft_max` as `--spec` and `--draft-max` take them.
fn speculation(
    words: Option<&str>,
    draft_max: i32,
) -> Result<Option<qhx_core::speculative::SpecConfig>> {
    use qhx_core::speculative::{DraftKind, SpecConfig};
    let bad = |m: String| Failure::new(abi::INVALID_ARGUMENT, format!("options.speculation: {m}"));
    let Some(w) = words.map(str::trim).filter(|w| !w.is_empty()) else {
        return Ok(None);
    };
    let (mode, rest) = w.split_once(char::is_whitespace).unwrap_or((w, ""));
    let rest = rest.trim();
    let kind = match mode {
        "lookup" => DraftKind::Lookup,
        "lookahead" => DraftKind::Lookahead,
        "draft" => DraftKind::Draft,
        _ => {
            return Err(bad(format!(
                "{mode:?}: expected lookup, lookahead or \"draft <bundle>\""
            )))
        }
    };
    let mut sc = SpecConfig::of(kind);
    match (kind, rest) {
        (DraftKind::Draft, "") => {
            return Err(bad(
                "\"draft\" needs the draft bundle: \"draft <bundle>\"".into()
            ))
        }
        (DraftKind::Draft, b) => sc.draft_bundle = Some(b.into()),
        (_, "") => {}
        (_, r) => return Err(bad(format!("{mode} takes nothing after it, not {r:?}"))),
    }
    if draft_max > 0 {
        sc.draft_max = draft_max as usize;
    }
    Ok(Some(sc))
}

/// # Safety
/// As `qhx_generate_ex`, without options.
#[no_mangle]
pub unsafe extern "C" fn qhx_generate(
    s: *mut QhxSession,
    inputs: *const Inputs,
    cfg: *const GenCfg,
    cb: TokenCb,
    user: *mut c_void,
    out: *mut Output,
) -> Status {
    // SAFETY: per this function's contract.
    unsafe { qhx_generate_ex(s, inputs, cfg, std::ptr::null(), cb, user, out) }
}

/// # Safety
/// `s` is a live session used by no other thread; `inputs` (and its strings), `cfg` and
/// `options` are NULL or readable for the call; `out` is NULL or writable; `cb` is NULL or
/// a function that may be called with `user` on this thread.
#[no_mangle]
pub unsafe extern "C" fn qhx_generate_ex(
    s: *mut QhxSession,
    inputs: *const Inputs,
    cfg: *const GenCfg,
    options: *const GenerateOptions,
    cb: TokenCb,
    user: *mut c_void,
    out: *mut Output,
) -> Status {
    if !out.is_null() {
        // SAFETY: writable per the contract.
        unsafe { out.write(Output::empty()) };
    }
    let mut result = None;
    // SAFETY: per this function's contract.
    let st = unsafe {
        with_session(s, |sess| {
            let options = read_options(options)?;
            let req = read_request(inputs, cfg, &options)?;
            let mut sink = CallbackSink {
                cb,
                user,
                stopped: false,
                buf: Vec::new(),
            };
            let done = sess.generate(req, &mut sink)?;
            let cancelled = done.cancelled;
            result = Some(done);
            if cancelled {
                return Err(Failure::new(abi::CANCELLED, "the generation was cancelled"));
            }
            Ok(())
        })
    };
    if let (Some(d), false) = (&result, out.is_null()) {
        // SAFETY: `s` was checked live by with_session (result is Some only then); `out` is
        // writable per the contract.
        unsafe {
            let sess = &(*s).0;
            (*out).text = sess.text_ptr();
            (*out).n_prompt = d.n_prompt.min(i32::MAX as usize) as i32;
            (*out).n_generated = d.n_generated.min(i32::MAX as usize) as i32;
            (*out).prefill_ms = d.prefill_ms;
            (*out).decode_ms = d.decode_ms;
        }
    }
    st
}
