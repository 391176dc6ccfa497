//! Shared memory and performance votes: fake `rpcmem_alloc` / `rpcmem_free` /
//! `rpcmem_to_fd` backed by memfd (Linux), `memRegister` / `memDeRegister` for ION
//! descriptors, and the HTP perf infrastructure (votes are recorded in the trace).

use crate::api::{log, E_INVALID_ARGUMENT, E_NOT_SUPPORTED};
use crate::registry::{self, Kind};
use qnn_sys::*;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

pub const E_MEM_INVALID_HANDLE: u64 = 8000;
pub const E_MEM_INVALID_ARGUMENT: u64 = 8001;
pub const E_MEM_INVALID_SHAPE: u64 = 8002;
pub const E_MEM_UNSUPPORTED: u64 = 8003;
pub const E_PERF_INVALID_INPUT: u64 = 13001;

/// An rpcmem allocation: base address -> (fd, bytes).
fn allocs() -> &'static Mutex<HashMap<usize, (i32, usize)>> {
    static A: OnceLock<Mutex<HashMap<usize, (i32, usize)>>> = OnceLock::new();
    A.get_or_init(Default::default)
}

/// A registered buffer.
struct MemReg {
    ctx: usize,
    base: *mut u8,
    bytes: usize,
}

/// `rpcmem_alloc(heapid, flags, size)`: a shared memfd mapping.
///
/// # Safety
/// Plain values; the result is a mapping of `size` bytes or NULL.
#[cfg(target_os = "linux")]
#[no_mangle]
pub unsafe extern "C" fn rpcmem_alloc(_heap: i32, _flags: u32, size: i32) -> *mut c_void {
    if size <= 0 {
        return std::ptr::null_mut();
    }
    let n = size as usize;
    // SAFETY: a NUL-terminated name; memfd_create has no other preconditions.
    let fd = unsafe { libc::memfd_create(c"qnn-emu-rpcmem".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: fd is a fresh memfd we own.
    if unsafe { libc::ftruncate(fd, n as libc::off_t) } != 0 {
        // SAFETY: closing our own fd.
        unsafe { libc::close(fd) };
        return std::ptr::null_mut();
    }
    // SAFETY: mapping `n` bytes of a memfd of that size, shared, read-write.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            n,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        // SAFETY: closing our own fd.
        unsafe { libc::close(fd) };
        return std::ptr::null_mut();
    }
    allocs()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(p as usize, (fd, n));
    registry::add(p as usize, Kind::RpcMem);
    p
}

/// `rpcmem_free(ptr)`.
///
/// # Safety
/// `p` must come from `rpcmem_alloc` (unknown pointers are ignored).
#[cfg(target_os = "linux")]
#[no_mangle]
pub unsafe extern "C" fn rpcmem_free(p: *mut c_void) {
    let Some((fd, n)) = allocs()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(p as usize))
    else {
        return;
    };
    if registry::live_of(Kind::MemHandle).iter().any(|&h| {
        // SAFETY: live MemReg boxes per the registry.
        let r = unsafe { &*(h as *const MemReg) };
        r.base == p as *mut u8
    }) {
        log(
            log_level::ERROR,
            "qnn-emu: rpcmem_free of a registered buffer",
        );
    }
    registry::remove(p as usize, Kind::RpcMem);
    // SAFETY: unmapping and closing exactly what rpcmem_alloc created.
    unsafe {
        libc::munmap(p, n);
        libc::close(fd);
    }
}

/// `rpcmem_to_fd(ptr)`: the fd of an allocation, or -1.
///
/// # Safety
/// Any pointer value is accepted.
#[cfg(target_os = "linux")]
#[no_mangle]
pub unsafe extern "C" fn rpcmem_to_fd(p: *mut c_void) -> i32 {
    allocs()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(p as usize))
        .map_or(-1, |a| a.0)
}

/// Look up registered memory by handle for a graph of context `ctx`: the base pointer if
/// the handle is live, was registered in `ctx` (a handle is per context) and holds `bytes`.
pub fn mem_lookup(h: usize, ctx: usize, bytes: usize) -> Result<*mut u8, &'static str> {
    if !registry::is_live(h, Kind::MemHandle) {
        return Err("an unregistered mem handle");
    }
    // SAFETY: live MemReg per the registry.
    let r = unsafe { &*(h as *const MemReg) };
    if r.ctx != ctx {
        return Err("a mem handle registered in another context");
    }
    if r.bytes < bytes {
        return Err("a too small mem handle");
    }
    Ok(r.base)
}

pub unsafe extern "C" fn mem_register(
    ctx: QnnContextHandle,
    descs: *const QnnMemDescriptor,
    n: u32,
    out: *mut QnnMemHandle,
) -> QnnErrorHandle {
    if !registry::is_live(ctx as usize, Kind::Context) {
        return crate::api::E_CONTEXT_INVALID_HANDLE;
    }
    if descs.is_null() || out.is_null() || n == 0 {
        return E_MEM_INVALID_ARGUMENT;
    }
    if crate::knobs::get().mem_unsupported {
        log(log_level::ERROR, "qnn-emu: QnnMem API is not supported");
        return crate::api::E_NOT_SUPPORTED;
    }
    for i in 0..n as usize {
        // SAFETY: the caller passes `n` descriptors and `n` handle slots.
        let d = unsafe { &*descs.add(i) };
        if d.mem_type != mem_kind::ION {
            log(
                log_level::ERROR,
                &format!("qnn-emu: memRegister: memType {} unsupported", d.mem_type),
            );
            return E_MEM_UNSUPPORTED;
        }
        if d.mem_shape.num_dim == 0 || d.mem_shape.dim_size.is_null() {
            return E_MEM_INVALID_SHAPE;
        }
        // SAFETY: non-null with num_dim entries per the API.
        let dims = unsafe {
            std::slice::from_raw_parts(d.mem_shape.dim_size, d.mem_shape.num_dim as usize)
        };
        let elems: usize = dims.iter().map(|&x| x as usize).product();
        let Some(es) = dtype::size_of(d.data_type) else {
            return E_MEM_INVALID_ARGUMENT;
        };
        // SAFETY: ION descriptors carry an fd.
        let fd = unsafe { d.info.ion_fd };
        let found = allocs()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(_, a)| a.0 == fd)
            .map(|(p, a)| (*p, a.1));
        let Some((base, size)) = found else {
            log(
                log_level::ERROR,
                &format!("qnn-emu: memRegister: fd {fd} is not an rpcmem buffer"),
            );
            return E_MEM_INVALID_ARGUMENT;
        };
        if size < elems * es {
            return E_MEM_INVALID_SHAPE;
        }
        let r = Box::into_raw(Box::new(MemReg {
            ctx: ctx as usize,
            base: base as *mut u8,
            bytes: elems * es,
        }));
        registry::add(r as usize, Kind::MemHandle);
        // SAFETY: in bounds of the caller's `n` slots.
        unsafe { *out.add(i) = r as QnnMemHandle };
    }
    0
}

pub unsafe extern "C" fn mem_de_register(handles: *const QnnMemHandle, n: u32) -> QnnErrorHandle {
    if handles.is_null() {
        return E_MEM_INVALID_ARGUMENT;
    }
    for i in 0..n as usize {
        // SAFETY: the caller passes `n` handles.
        let h = unsafe { *handles.add(i) } as usize;
        if !registry::remove(h, Kind::MemHandle) {
            return E_MEM_INVALID_HANDLE;
        }
        // SAFETY: registry-confirmed Box<MemReg> from mem_register.
        drop(unsafe { Box::from_raw(h as *mut MemReg) });
    }
    0
}

/// Called by contextFree: registrations of that context left behind are an error (real
/// backends require memDeRegister first); they are logged and dropped.
pub fn release_context_mem(ctx: usize) {
    for h in registry::live_of(Kind::MemHandle) {
        // SAFETY: live MemReg per the registry.
        let r = unsafe { &*(h as *const MemReg) };
        if r.ctx == ctx {
            log(
                log_level::ERROR,
                "qnn-emu: contextFree with registered memory (memDeRegister first)",
            );
            registry::remove(h, Kind::MemHandle);
            // SAFETY: as in mem_de_register.
            drop(unsafe { Box::from_raw(h as *mut MemReg) });
        }
    }
}

// --- perf infrastructure ---

static NEXT_POWER_ID: Mutex<u32> = Mutex::new(1);

/// Registry key of a power-config id (ids are small integers, not addresses).
fn power_key(id: u32) -> usize {
    0x7000_0000_0000 + id as usize
}

unsafe extern "C" fn create_power_config_id(
    device_id: u32,
    core_id: u32,
    out: *mut u32,
) -> QnnErrorHandle {
    if out.is_null() {
        return E_PERF_INVALID_INPUT;
    }
    if let Some(code) = crate::knobs::injected_failure("createPowerConfigId") {
        return code;
    }
    let mut next = NEXT_POWER_ID.lock().unwrap_or_else(|e| e.into_inner());
    let id = *next;
    *next += 1;
    registry::add(power_key(id), Kind::PowerConfig);
    let _ = (device_id, core_id);
    // SAFETY: checked non-null.
    unsafe { *out = id };
    0
}

unsafe extern "C" fn destroy_power_config_id(id: u32) -> QnnErrorHandle {
    if !registry::remove(power_key(id), Kind::PowerConfig) {
        return E_PERF_INVALID_INPUT;
    }
    0
}

unsafe extern "C" fn set_power_config(
    id: u32,
    cfgs: *const *const QnnHtpPowerConfig,
) -> QnnErrorHandle {
    if cfgs.is_null() || !registry::is_live(power_key(id), Kind::PowerConfig) {
        return E_PERF_INVALID_INPUT;
    }
    if let Some(code) = crate::knobs::injected_failure("setPowerConfig") {
        return code;
    }
    let mut list = Vec::new();
    for i in 0..64 {
        // SAFETY: a NULL-terminated array of config pointers per the API.
        let p = unsafe { *cfgs.add(i) };
        if p.is_null() {
            break;
        }
        // SAFETY: non-null config from the caller.
        let c = unsafe { &*p };
        let v = match c.option {
            perf::OPTION_DCVS_V3 => {
                // SAFETY: the DCVS_V3 option selects the dcvsV3Config member.
                let d = unsafe { c.value.dcvs_v3 };
                serde_json::json!({"option": "dcvs_v3", "context_id": d.context_id,
                    "set_dcvs_enable": d.set_dcvs_enable, "dcvs_enable": d.dcvs_enable,
                    "power_mode": d.power_mode, "set_sleep_latency": d.set_sleep_latency,
                    "sleep_latency": d.sleep_latency, "set_sleep_disable": d.set_sleep_disable,
                    "sleep_disable": d.sleep_disable, "set_bus_params": d.set_bus_params,
                    "bus": [d.bus_voltage_corner_min, d.bus_voltage_corner_target, d.bus_voltage_corner_max],
                    "set_core_params": d.set_core_params,
                    "core": [d.core_voltage_corner_min, d.core_voltage_corner_target, d.core_voltage_corner_max]})
            }
            perf::OPTION_RPC_CONTROL_LATENCY => {
                // SAFETY: this option selects the u32 member.
                serde_json::json!({"option": "rpc_control_latency", "value": unsafe { c.value.u32_value }})
            }
            perf::OPTION_RPC_POLLING_TIME => {
                // SAFETY: as above.
                let v = unsafe { c.value.u32_value };
                if v > perf::MAX_RPC_POLLING_TIME_US {
                    return E_PERF_INVALID_INPUT;
                }
                serde_json::json!({"option": "rpc_polling_time", "value": v})
            }
            other => serde_json::json!({"option": other}),
        };
        list.push(v);
    }
    registry::vote(serde_json::json!({"id": id, "configs": list}));
    0
}

unsafe extern "C" fn set_memory_config(
    _device_id: u32,
    _core_id: u32,
    _cfgs: *const *const c_void,
) -> QnnErrorHandle {
    E_NOT_SUPPORTED
}

struct InfraCell(QnnHtpDeviceInfrastructure);
// SAFETY: immutable function-pointer table.
unsafe impl Sync for InfraCell {}

static INFRA: InfraCell = InfraCell(QnnHtpDeviceInfrastructure {
    infra_type: perf::INFRASTRUCTURE_TYPE_PERF,
    perf: QnnHtpPerfInfrastructure {
        create_power_config_id: Some(create_power_config_id),
        destroy_power_config_id: Some(destroy_power_config_id),
        set_power_config: Some(set_power_config),
        set_memory_config: Some(set_memory_config),
    },
});

pub unsafe extern "C" fn device_get_infrastructure(out: *mut *mut c_void) -> QnnErrorHandle {
    if out.is_null() {
        return E_INVALID_ARGUMENT;
    }
    if let Some(code) = crate::knobs::injected_failure("deviceGetInfrastructure") {
        return code;
    }
    // SAFETY: checked non-null; the table is static and never written through.
    unsafe { *out = &INFRA.0 as *const QnnHtpDeviceInfrastructure as *mut c_void };
    0
}
