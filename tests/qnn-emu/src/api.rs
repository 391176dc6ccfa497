//! The backend interface table: log, backend, device, context and graph entries.

use crate::exec::{EmuContext, EmuGraph};
use crate::knobs;
use crate::registry::{self, Kind};
use qnn_sys::*;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::Mutex;

pub const E_NOT_SUPPORTED: u64 = 1000;
pub const E_INVALID_ARGUMENT: u64 = 1004;
pub const E_BACKEND_INVALID_HANDLE: u64 = 4011;
pub const E_CONTEXT_INVALID_ARGUMENT: u64 = 5000;
pub const E_CONTEXT_INVALID_HANDLE: u64 = 5002;
pub const E_CONTEXT_CREATE_FROM_BINARY: u64 = 5005;
pub const E_GRAPH_INVALID_HANDLE: u64 = 6001;
pub const E_GRAPH_DOES_NOT_EXIST: u64 = 6002;
pub const E_LOG_INVALID_HANDLE: u64 = 11004;
pub const E_DEVICE_INVALID_HANDLE: u64 = 14000;

pub struct EmuLog {
    callback: QnnLogCallback,
    level: Mutex<u32>,
}

struct EmuBackend {
    log: QnnLogHandle,
}

/// The most recent live logger: the emulator logs through it like a real backend does.
static CURRENT_LOG: Mutex<usize> = Mutex::new(0);

/// Send a message to the application's log callback, if one is registered at `level`.
pub fn log(level: u32, msg: &str) {
    let ptr = *CURRENT_LOG.lock().unwrap_or_else(|e| e.into_inner());
    if ptr == 0 || !registry::is_live(ptr, Kind::Log) {
        return;
    }
    // SAFETY: the registry says `ptr` is a live EmuLog created by `log_create`.
    let l = unsafe { &*(ptr as *const EmuLog) };
    let max = *l.level.lock().unwrap_or_else(|e| e.into_inner());
    let Some(cb) = l.callback else { return };
    if level > max {
        return;
    }
    // The message carries no conversions ('%' doubled), so the va_list is never read.
    let fmt = CString::new(msg.replace('%', "%%")).unwrap_or_default();
    let mut dummy_va = [0u64; 4];
    // SAFETY: the callback has the QnnLog_Callback_t signature; `fmt` is NUL-terminated and
    // has no conversion specifiers, so the (zeroed) va_list is never dereferenced.
    unsafe { cb(fmt.as_ptr(), level, 0, dummy_va.as_mut_ptr() as *mut c_void) };
    let pause = crate::knobs::get().log_delay_ms;
    if level == log_level::ERROR && pause > 0 {
        std::thread::sleep(std::time::Duration::from_millis(pause));
    }
}

unsafe extern "C" fn property_has_capability(key: u32) -> QnnErrorHandle {
    if key == QNN_PROPERTY_GROUP_DEVICE {
        0
    } else {
        E_NOT_SUPPORTED
    }
}

unsafe extern "C" fn log_create(
    cb: QnnLogCallback,
    level: u32,
    out: *mut QnnLogHandle,
) -> QnnErrorHandle {
    if out.is_null() {
        return 11003;
    }
    let l = Box::into_raw(Box::new(EmuLog {
        callback: cb,
        level: Mutex::new(level),
    }));
    registry::add(l as usize, Kind::Log);
    *CURRENT_LOG.lock().unwrap_or_else(|e| e.into_inner()) = l as usize;
    // SAFETY: checked non-null; the caller provides a writable handle slot.
    unsafe { *out = l as QnnLogHandle };
    log(log_level::INFO, "qnn-emu: logger created");
    0
}

unsafe extern "C" fn log_set_log_level(h: QnnLogHandle, level: u32) -> QnnErrorHandle {
    if !registry::is_live(h as usize, Kind::Log) {
        return E_LOG_INVALID_HANDLE;
    }
    // SAFETY: live EmuLog per the registry.
    let l = unsafe { &*(h as *const EmuLog) };
    *l.level.lock().unwrap_or_else(|e| e.into_inner()) = level;
    0
}

unsafe extern "C" fn log_free(h: QnnLogHandle) -> QnnErrorHandle {
    if !registry::remove(h as usize, Kind::Log) {
        return E_LOG_INVALID_HANDLE;
    }
    let mut cur = CURRENT_LOG.lock().unwrap_or_else(|e| e.into_inner());
    if *cur == h as usize {
        *cur = 0;
    }
    // SAFETY: the registry confirmed this was a live EmuLog from Box::into_raw.
    drop(unsafe { Box::from_raw(h as *mut EmuLog) });
    0
}

unsafe extern "C" fn backend_create(
    log_h: QnnLogHandle,
    _cfg: *const *const QnnBackendConfig,
    out: *mut QnnBackendHandle,
) -> QnnErrorHandle {
    if out.is_null() {
        return 4004;
    }
    if let Some(code) = knobs::injected_failure("backendCreate") {
        return code;
    }
    if knobs::get().stdout_banner {
        stdout_banner();
    }
    let b = Box::into_raw(Box::new(EmuBackend { log: log_h }));
    registry::add(b as usize, Kind::Backend);
    // SAFETY: checked non-null.
    unsafe { *out = b as QnnBackendHandle };
    0
}

unsafe extern "C" fn backend_free(h: QnnBackendHandle) -> QnnErrorHandle {
    if registry::live_count(Kind::Context) > 0 {
        log(log_level::ERROR, "qnn-emu: backendFree with live contexts");
    }
    if !registry::remove(h as usize, Kind::Backend) {
        return E_BACKEND_INVALID_HANDLE;
    }
    // SAFETY: registry-confirmed Box from backend_create.
    let b = unsafe { Box::from_raw(h as *mut EmuBackend) };
    let _ = b.log;
    0
}

/// What `backendGetBuildId` reports. qhx tells the emulator from a real backend by its
/// `qnn-emu` prefix (e.g. the bench's backend column), so keep it.
pub const BUILD_ID: &std::ffi::CStr = c"qnn-emu v0.1.0 (CPU emulator)";

unsafe extern "C" fn backend_get_build_id(id: *mut *const c_char) -> QnnErrorHandle {
    if id.is_null() {
        return E_INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the string is static.
    unsafe { *id = BUILD_ID.as_ptr() };
    0
}

unsafe extern "C" fn backend_get_api_version(out: *mut QnnApiVersion) -> QnnErrorHandle {
    if out.is_null() {
        return E_INVALID_ARGUMENT;
    }
    let core = knobs::get().core_api;
    // SAFETY: checked non-null.
    unsafe {
        *out = QnnApiVersion {
            core,
            backend: QnnVersion {
                major: 5,
                minor: 43,
                patch: 0,
            },
        }
    };
    0
}

unsafe extern "C" fn device_create(
    _log: QnnLogHandle,
    _cfg: *const *const QnnDeviceConfig,
    out: *mut QnnDeviceHandle,
) -> QnnErrorHandle {
    if out.is_null() {
        return 14001;
    }
    if let Some(code) = knobs::injected_failure("deviceCreate") {
        return code;
    }
    let d = Box::into_raw(Box::new(0u64));
    registry::add(d as usize, Kind::Device);
    // SAFETY: checked non-null.
    unsafe { *out = d as QnnDeviceHandle };
    0
}

unsafe extern "C" fn device_free(h: QnnDeviceHandle) -> QnnErrorHandle {
    if !registry::remove(h as usize, Kind::Device) {
        return E_DEVICE_INVALID_HANDLE;
    }
    // SAFETY: registry-confirmed Box<u64> from device_create.
    drop(unsafe { Box::from_raw(h as *mut u64) });
    0
}

struct PlatformInfo {
    info: QnnDevicePlatformInfo,
    hw: QnnDeviceHardwareInfo,
    ext: QnnHtpDeviceInfoExtension,
}

unsafe extern "C" fn device_get_platform_info(
    _log: QnnLogHandle,
    out: *mut *const QnnDevicePlatformInfo,
) -> QnnErrorHandle {
    if out.is_null() {
        return E_INVALID_ARGUMENT;
    }
    let mut p = Box::new(PlatformInfo {
        info: QnnDevicePlatformInfo {
            version: 1,
            _pad: 0,
            num_hw_devices: 1,
            hw_devices: std::ptr::null(),
        },
        hw: QnnDeviceHardwareInfo {
            version: 1,
            _pad: 0,
            device_id: 0,
            device_type: 0,
            num_cores: 1,
            cores: std::ptr::null(),
            device_info_extension: std::ptr::null(),
        },
        ext: QnnHtpDeviceInfoExtension {
            dev_type: 0,
            vtcm_size_mb: 8,
            soc_model: std::env::var("QNN_EMU_SOC_MODEL")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(87),
            signed_pd_support: 1,
            dlbc_support: 0,
            arch: std::env::var("QNN_EMU_ARCH")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(81),
        },
    });
    // The box's heap address is stable, so the self-references stay valid after leaking.
    p.hw.device_info_extension = &p.ext as *const _ as *const c_void;
    p.info.hw_devices = &p.hw;
    let raw = Box::into_raw(p);
    // SAFETY: checked non-null; we hand out the address of the `info` field of the leaked
    // box and recover the box from it in device_free_platform_info.
    unsafe { *out = &(*raw).info };
    0
}

unsafe extern "C" fn device_free_platform_info(
    _log: QnnLogHandle,
    info: *const QnnDevicePlatformInfo,
) -> QnnErrorHandle {
    if info.is_null() {
        return E_INVALID_ARGUMENT;
    }
    let off = std::mem::offset_of!(PlatformInfo, info);
    // SAFETY: `info` was produced by device_get_platform_info as the address of the `info`
    // field of a leaked Box<PlatformInfo>; subtracting the field offset recovers the box.
    drop(unsafe { Box::from_raw((info as *const u8).sub(off) as *mut PlatformInfo) });
    0
}

unsafe extern "C" fn context_create_from_binary(
    backend: QnnBackendHandle,
    _device: QnnDeviceHandle,
    _cfg: *const *const QnnContextConfig,
    buf: *const c_void,
    size: QnnContextBinarySize,
    out: *mut QnnContextHandle,
    _profile: QnnProfileHandle,
) -> QnnErrorHandle {
    if !registry::is_live(backend as usize, Kind::Backend) {
        return E_BACKEND_INVALID_HANDLE;
    }
    if buf.is_null() || out.is_null() || size == 0 {
        return E_CONTEXT_INVALID_ARGUMENT;
    }
    if knobs::get().load_delay_ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(knobs::get().load_delay_ms));
    }
    if let Some(code) = knobs::injected_failure("contextCreateFromBinary") {
        log(
            log_level::ERROR,
            &format!("qnn-emu: injected contextCreateFromBinary failure {code}"),
        );
        return code;
    }
    // SAFETY: the caller passes a buffer of `size` readable bytes for the call's duration.
    let bytes = unsafe { std::slice::from_raw_parts(buf as *const u8, size as usize) };
    match EmuContext::from_binary(bytes) {
        Ok(ctx) => {
            let n = ctx.graphs.len();
            let p = Box::into_raw(Box::new(ctx));
            registry::add(p as usize, Kind::Context);
            log(
                log_level::INFO,
                &format!("qnn-emu: context created with {n} graph(s)"),
            );
            // SAFETY: checked non-null.
            unsafe { *out = p as QnnContextHandle };
            0
        }
        Err(e) => {
            log(
                log_level::ERROR,
                &format!("qnn-emu: contextCreateFromBinary: {e}"),
            );
            E_CONTEXT_CREATE_FROM_BINARY
        }
    }
}

unsafe extern "C" fn context_free(
    h: QnnContextHandle,
    _profile: QnnProfileHandle,
) -> QnnErrorHandle {
    if !registry::remove(h as usize, Kind::Context) {
        return E_CONTEXT_INVALID_HANDLE;
    }
    crate::exec::release_context_mem(h as usize);
    // SAFETY: registry-confirmed Box<EmuContext> from context_create_from_binary.
    drop(unsafe { Box::from_raw(h as *mut EmuContext) });
    // An injected failure is reported after the context is gone, so the leak checks that
    // count live handles still hold; the caller only sees the status.
    if let Some(code) = knobs::injected_failure("contextFree") {
        log(log_level::ERROR, "qnn-emu: injected contextFree failure");
        return code;
    }
    0
}

unsafe extern "C" fn graph_retrieve(
    ctx: QnnContextHandle,
    name: *const c_char,
    out: *mut QnnGraphHandle,
) -> QnnErrorHandle {
    if !registry::is_live(ctx as usize, Kind::Context) {
        return E_CONTEXT_INVALID_HANDLE;
    }
    if name.is_null() || out.is_null() {
        return 6000;
    }
    if let Some(code) = knobs::injected_failure("graphRetrieve") {
        return code;
    }
    // SAFETY: live context per the registry; name is a NUL-terminated string per the API.
    let (c, name) = unsafe { (&*(ctx as *const EmuContext), CStr::from_ptr(name)) };
    let name = name.to_string_lossy();
    match c.graphs.iter().find(|g| g.name == name) {
        Some(g) => {
            // SAFETY: checked non-null. The graph lives in a Box owned by the context.
            unsafe { *out = &**g as *const EmuGraph as QnnGraphHandle };
            log(
                log_level::VERBOSE,
                &format!("qnn-emu: graph {name} retrieved"),
            );
            0
        }
        None => {
            log(log_level::ERROR, &format!("qnn-emu: no graph named {name}"));
            E_GRAPH_DOES_NOT_EXIST
        }
    }
}

unsafe extern "C" fn graph_set_config(
    g: QnnGraphHandle,
    _cfg: *const *const QnnGraphConfig,
) -> QnnErrorHandle {
    if crate::exec::find_graph(g as usize).is_none() {
        return E_GRAPH_INVALID_HANDLE;
    }
    0
}

unsafe extern "C" fn error_get_message(
    err: QnnErrorHandle,
    msg: *mut *const c_char,
) -> QnnErrorHandle {
    if msg.is_null() {
        return E_INVALID_ARGUMENT;
    }
    let text: &'static CStr = match err & 0xFFFF {
        1002 => c"memory allocation failed (emulated)",
        5005 => c"context binary could not be deserialized",
        6002 => c"graph does not exist in this context",
        6004 => c"invalid tensor passed to graphExecute",
        _ => {
            // SAFETY: checked non-null.
            unsafe { *msg = std::ptr::null() };
            return 0;
        }
    };
    // SAFETY: checked non-null; static string.
    unsafe { *msg = text.as_ptr() };
    0
}

/// Every entry we do not implement: ignores its arguments and reports NOT_SUPPORTED.
unsafe extern "C" fn unsupported() -> QnnErrorHandle {
    E_NOT_SUPPORTED
}

/// Build the backend table: implemented entries, the rest pointing at `unsupported`.
pub fn table() -> QnnInterfaceTable {
    let mut t = QnnInterfaceTable::empty();
    t.property_has_capability = Some(property_has_capability);
    t.backend_create = Some(backend_create);
    t.backend_get_api_version = Some(backend_get_api_version);
    t.backend_get_build_id = Some(backend_get_build_id);
    t.backend_free = Some(backend_free);
    t.context_create_from_binary = Some(context_create_from_binary);
    t.context_free = Some(context_free);
    t.graph_set_config = Some(graph_set_config);
    t.graph_retrieve = Some(graph_retrieve);
    t.graph_execute = Some(crate::exec::graph_execute);
    t.log_create = Some(log_create);
    t.log_set_log_level = Some(log_set_log_level);
    t.log_free = Some(log_free);
    t.mem_register = Some(crate::exec::mem_register);
    t.mem_de_register = Some(crate::exec::mem_de_register);
    t.device_get_platform_info = Some(device_get_platform_info);
    t.device_free_platform_info = Some(device_free_platform_info);
    t.device_get_infrastructure = Some(crate::exec::device_get_infrastructure);
    t.device_create = Some(device_create);
    t.device_free = Some(device_free);
    t.error_get_message = Some(error_get_message);
    // SAFETY: the table is 71 nullable function pointers (asserted in qnn-sys::layout).
    let mut slots: [OpaqueFn; INTERFACE_TABLE_LEN] = unsafe { std::mem::transmute(t) };
    // SAFETY: with the C calling convention a callee that ignores its arguments can be called
    // with any argument list; the u64 return lands where every entry's caller expects it.
    let stub: OpaqueFn = Some(unsafe {
        std::mem::transmute::<unsafe extern "C" fn() -> QnnErrorHandle, unsafe extern "C" fn()>(
            unsupported,
        )
    });
    for s in slots.iter_mut().filter(|s| s.is_none()) {
        *s = stub;
    }
    // SAFETY: same size and representation, as above.
    unsafe { std::mem::transmute(slots) }
}

/// What the real x86 HTP backend prints on stdout (C stdio, so it reaches fd 1 when the
/// process exits and flushes).
fn stdout_banner() {
    const LINE: &std::ffi::CStr =
        c" # qnn-emu: backend banner on stdout (like the real backend's LIBNATIVE line)\n";
    #[cfg(target_os = "linux")]
    // SAFETY: a NUL-terminated format without conversions.
    unsafe {
        libc::printf(LINE.as_ptr());
    }
    #[cfg(not(target_os = "linux"))]
    {
        use std::io::Write;
        let _ = std::io::stdout().write_all(LINE.to_bytes());
    }
}
