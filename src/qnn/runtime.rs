//! The QNN runtime: loaded libraries plus the log, backend and device handles.

use super::status::check;
use crate::error::{Error, Result};
use qnn_sys::*;
use std::ffi::CStr;
use std::path::Path;

/// What the backend reports about the device it drives.
#[derive(Debug, Clone, Default)]
pub struct DeviceFacts {
    pub soc_model: Option<u32>,
    pub dsp_arch: Option<u32>,
    pub build_id: String,
}

pub struct Runtime {
    backend_lib: BackendLibrary,
    system_lib: SystemLibrary,
    log: QnnLogHandle,
    backend: QnnBackendHandle,
    device: QnnDeviceHandle,
    pub device_facts: DeviceFacts,
    /// The perf infrastructure and power-config id of an active vote.
    vote: Option<(QnnHtpPerfInfrastructure, u32)>,
    pub perf_mode: super::perf::PerfMode,
    pub(crate) rpcmem: Option<super::rpcmem::RpcMem>,
    /// Why zero-copy I/O was given up after rpcmem loaded (set once, by the first refusal).
    zero_copy_refused: std::sync::OnceLock<String>,
    /// Failures of context / memory-handle release calls made while the runtime lived
    /// (a `Drop` cannot return them); printed when the runtime itself is dropped.
    release_errors: std::sync::Mutex<Vec<String>>,
}

// SAFETY: the log, backend and device handles are process-wide and not tied to the thread
// that created them; after creation they are only passed to QNN calls that take them by
// value (context creation, memRegister, frees), which backends accept from any thread.
// Graph executions are serialised per graph (`Graph::running`).
unsafe impl Send for Runtime {}
// SAFETY: as above; the only state mutated through `&Runtime` sits behind a `OnceLock` or
// a `Mutex`.
unsafe impl Sync for Runtime {}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("device_facts", &self.device_facts)
            .field("perf_mode", &self.perf_mode)
            .field("rpcmem", &self.rpcmem.is_some())
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Load both libraries, create log, backend and device.
    pub fn new(backend_path: &Path, system_path: &Path, log_level: u32) -> Result<Runtime> {
        Runtime::with_system(SystemLibrary::load(system_path)?, backend_path, log_level)
    }

    /// [`Runtime::new`] with a system library already loaded (e.g. to read the binaries'
    /// metadata before the backend starts): it is kept, not loaded a second time.
    pub fn with_system(
        system_lib: SystemLibrary,
        backend_path: &Path,
        log_level: u32,
    ) -> Result<Runtime> {
        let backend_lib = BackendLibrary::load(backend_path)?;
        super::log::set_verbosity(log_level);
        let mut rt = Runtime {
            backend_lib,
            system_lib,
            log: std::ptr::null_mut(),
            backend: std::ptr::null_mut(),
            device: std::ptr::null_mut(),
            device_facts: DeviceFacts::default(),
            vote: None,
            perf_mode: super::perf::PerfMode::Default,
            rpcmem: None,
            zero_copy_refused: std::sync::OnceLock::new(),
            release_errors: Default::default(),
        };
        let t = rt.backend_lib.table;
        let lib = rt.backend_lib.path.display().to_string();
        if let Some(log_create) = t.log_create {
            // Errors are always captured (to quote them); the level only affects printing.
            let level = log_level.max(log_level::ERROR);
            let mut h: QnnLogHandle = std::ptr::null_mut();
            // SAFETY: the callback is a valid QnnLog_Callback_t for the process lifetime.
            let s = unsafe { log_create(Some(super::log::callback), level, &mut h) };
            // A logger is optional: continue without one if the backend refuses.
            if QnnStatus(s).is_ok() {
                rt.log = h;
            }
        }
        let backend_create = t.backend_create.ok_or_else(|| Error::MissingEntry {
            step: format!("creating the backend from {lib}"),
            entry: "backendCreate",
        })?;
        // SAFETY: log is null or a live logger; no configs; out-param is a field of rt.
        let status = unsafe { backend_create(rt.log, std::ptr::null(), &mut rt.backend) };
        check(status, || format!("creating the QNN backend from {lib}"))?;
        // Device creation is optional per the API (a NULL device means the default).
        let wants_device = match t.property_has_capability {
            // SAFETY: plain value argument.
            Some(f) => QnnStatus(unsafe { f(QNN_PROPERTY_GROUP_DEVICE) }).is_ok(),
            None => true,
        };
        if wants_device {
            if let Some(device_create) = t.device_create {
                // SAFETY: as for backendCreate.
                let status = unsafe { device_create(rt.log, std::ptr::null(), &mut rt.device) };
                check(status, || format!("creating the QNN device from {lib}"))?;
            }
        }
        rt.device_facts = rt.read_device_facts();
        Ok(rt)
    }

    fn read_device_facts(&self) -> DeviceFacts {
        let t = &self.backend_lib.table;
        let mut f = DeviceFacts::default();
        if let Some(get) = t.backend_get_build_id {
            let mut p: *const std::ffi::c_char = std::ptr::null();
            // SAFETY: out-param to a live local; the string is library-owned and static.
            if QnnStatus(unsafe { get(&mut p) }).is_ok() && !p.is_null() {
                // SAFETY: non-null NUL-terminated string.
                f.build_id = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
            }
        }
        if let (Some(get), Some(free)) = (t.device_get_platform_info, t.device_free_platform_info) {
            let mut info: *const QnnDevicePlatformInfo = std::ptr::null();
            // SAFETY: out-param to a live local.
            if QnnStatus(unsafe { get(self.log, &mut info) }).is_ok() && !info.is_null() {
                // SAFETY: a platform info v1 owned by the library until freed below.
                let i = unsafe { &*info };
                if i.version == 1 && i.num_hw_devices > 0 && !i.hw_devices.is_null() {
                    // SAFETY: at least one hardware device entry.
                    let hw = unsafe { &*i.hw_devices };
                    if hw.version == 1 && !hw.device_info_extension.is_null() {
                        // SAFETY: for HTP the extension is QnnHtpDevice_DeviceInfoExtension_t.
                        let ext = unsafe {
                            &*(hw.device_info_extension as *const QnnHtpDeviceInfoExtension)
                        };
                        if ext.dev_type == 0 {
                            f.soc_model = Some(ext.soc_model);
                            f.dsp_arch = Some(ext.arch);
                        }
                    }
                }
                // SAFETY: freeing what get returned, once.
                let _ = unsafe { free(self.log, info) };
            }
        }
        f
    }

    /// Vote for `mode` through the HTP perf infrastructure. On failure nothing stays
    /// registered (a created power-config id is destroyed).
    pub fn set_perf(&mut self, mode: super::perf::PerfMode) -> Result<()> {
        if mode == super::perf::PerfMode::Default {
            return Ok(());
        }
        let lib = self.backend_lib.path.display().to_string();
        let get = self
            .backend_lib
            .table
            .device_get_infrastructure
            .ok_or_else(|| Error::MissingEntry {
                step: format!("voting {} performance with {lib}", mode.as_str()),
                entry: "deviceGetInfrastructure",
            })?;
        let mut infra: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: out-param to a live local.
        check(unsafe { get(&mut infra) }, || {
            format!("getting the device infrastructure from {lib}")
        })?;
        if infra.is_null() {
            return Err(Error::Backend {
                lib,
                msg: "deviceGetInfrastructure returned NULL".into(),
            });
        }
        // SAFETY: for HTP the infrastructure is a QnnHtpDevice_Infrastructure_t owned by the
        // library for its lifetime; we copy the function table out.
        let i = unsafe { *(infra as *const QnnHtpDeviceInfrastructure) };
        if i.infra_type != perf::INFRASTRUCTURE_TYPE_PERF {
            return Err(Error::Backend {
                lib,
                msg: format!("device infrastructure type {} is not PERF", i.infra_type),
            });
        }
        let p = i.perf;
        let (Some(create), Some(destroy), Some(set)) = (
            p.create_power_config_id,
            p.destroy_power_config_id,
            p.set_power_config,
        ) else {
            return Err(Error::Backend {
                lib,
                msg: "the perf infrastructure lacks createPowerConfigId / setPowerConfig".into(),
            });
        };
        let mut id = 0u32;
        // SAFETY: plain values and an out-param to a live local.
        check(unsafe { create(0, 0, &mut id) }, || {
            "creating an HTP power-config id".to_string()
        })?;
        let cfgs = super::perf::configs(mode, id);
        let mut ptrs: Vec<*const QnnHtpPowerConfig> = cfgs.iter().map(|c| c as *const _).collect();
        ptrs.push(std::ptr::null());
        // SAFETY: a NULL-terminated array of pointers to configs alive for the call.
        let s = unsafe { set(id, ptrs.as_ptr()) };
        if let Err(e) = check(s, || format!("setting the {} power config", mode.as_str())) {
            // SAFETY: the id was created above and is destroyed once.
            let _ = unsafe { destroy(id) };
            return Err(e);
        }
        self.vote = Some((p, id));
        self.perf_mode = mode;
        Ok(())
    }

    /// Load libcdsprpc (or a stand-in) for zero-copy I/O; the reason on failure.
    pub fn load_rpcmem(&mut self, path: &Path) -> std::result::Result<(), String> {
        self.rpcmem = Some(super::rpcmem::RpcMem::load(path)?);
        Ok(())
    }

    /// Why graph I/O fell back to client buffers although rpcmem loaded (an allocation or a
    /// `memRegister` the backend refused), if it did.
    pub fn zero_copy_refused(&self) -> Option<&str> {
        self.zero_copy_refused.get().map(String::as_str)
    }

    /// Give up zero-copy I/O for this runtime; the first reason is kept.
    pub(crate) fn refuse_zero_copy(&self, why: String) {
        let _ = self.zero_copy_refused.set(why);
    }

    pub fn rpcmem_path(&self) -> Option<&Path> {
        self.rpcmem.as_ref().map(|r| r.path.as_path())
    }

    pub fn backend(&self) -> &BackendLibrary {
        &self.backend_lib
    }

    pub fn system(&self) -> &SystemLibrary {
        &self.system_lib
    }

    /// Record a failed release (context or memory-handle free) made by a `Drop`.
    pub(crate) fn record_release_error(&self, e: Error) {
        self.release_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e.to_string());
    }

    /// Release failures recorded so far (oldest first). They are also printed to stderr,
    /// one warning line each, when the runtime is dropped.
    pub fn release_errors(&self) -> Vec<String> {
        self.release_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn backend_handle(&self) -> QnnBackendHandle {
        self.backend
    }

    pub(crate) fn device_handle(&self) -> QnnDeviceHandle {
        self.device
    }
}

impl Drop for Runtime {
    /// Device, backend, then log: the reverse of creation. Contexts hold an `Arc<Runtime>`,
    /// so they are already gone. A failed release cannot be returned from here; it is
    /// printed as a warning with the ones the contexts and bindings recorded, not dropped.
    fn drop(&mut self) {
        let mut failed = std::mem::take(
            self.release_errors
                .get_mut()
                .unwrap_or_else(|p| p.into_inner()),
        );
        let mut note = |s: u64, what: &str| {
            if let Err(e) = check(s, || what.to_string()) {
                failed.push(e.to_string());
            }
        };
        if let Some((p, id)) = self.vote.take() {
            if let Some(destroy) = p.destroy_power_config_id {
                // SAFETY: an id created by set_perf, destroyed once, before the device.
                note(unsafe { destroy(id) }, "removing the performance vote");
            }
        }
        let t = &self.backend_lib.table;
        if !self.device.is_null() {
            if let Some(f) = t.device_free {
                // SAFETY: a live device handle, freed once.
                note(unsafe { f(self.device) }, "freeing the QNN device");
            }
        }
        if !self.backend.is_null() {
            if let Some(f) = t.backend_free {
                // SAFETY: a live backend handle, freed once.
                note(unsafe { f(self.backend) }, "freeing the QNN backend");
            }
        }
        if !self.log.is_null() {
            if let Some(f) = t.log_free {
                // SAFETY: a live log handle, freed once.
                note(unsafe { f(self.log) }, "freeing the QNN log");
            }
        }
        for e in failed {
            eprintln!("qhx: warning: {e}");
        }
    }
}
