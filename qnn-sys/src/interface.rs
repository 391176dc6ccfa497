//! `QnnInterface_t` and its 71-entry function table (QAIRT 2.43 / core API 2.32).
//!
//! The table is stored inline in the provider struct. Entries were inserted mid-table
//! before API 2.10 and only appended since, so a binding must never read an entry the
//! provider's API version does not have: see [`ENTRY_MIN_MINOR`] and [`QnnApi`].

use crate::types::*;
use std::ffi::{c_char, c_void};

/// An entry this crate never calls: a nullable function pointer of the right size.
pub type OpaqueFn = Option<unsafe extern "C" fn()>;

pub type PropertyHasCapabilityFn = unsafe extern "C" fn(key: u32) -> QnnErrorHandle;
pub type BackendCreateFn = unsafe extern "C" fn(
    logger: QnnLogHandle,
    config: *const *const QnnBackendConfig,
    backend: *mut QnnBackendHandle,
) -> QnnErrorHandle;
pub type BackendGetApiVersionFn = unsafe extern "C" fn(out: *mut QnnApiVersion) -> QnnErrorHandle;
pub type BackendGetBuildIdFn = unsafe extern "C" fn(id: *mut *const c_char) -> QnnErrorHandle;
pub type BackendFreeFn = unsafe extern "C" fn(backend: QnnBackendHandle) -> QnnErrorHandle;
pub type ContextCreateFromBinaryFn = unsafe extern "C" fn(
    backend: QnnBackendHandle,
    device: QnnDeviceHandle,
    config: *const *const QnnContextConfig,
    binary: *const c_void,
    binary_size: QnnContextBinarySize,
    context: *mut QnnContextHandle,
    profile: QnnProfileHandle,
) -> QnnErrorHandle;
pub type ContextFreeFn =
    unsafe extern "C" fn(context: QnnContextHandle, profile: QnnProfileHandle) -> QnnErrorHandle;
pub type GraphSetConfigFn = unsafe extern "C" fn(
    graph: QnnGraphHandle,
    config: *const *const QnnGraphConfig,
) -> QnnErrorHandle;
pub type GraphRetrieveFn = unsafe extern "C" fn(
    context: QnnContextHandle,
    name: *const c_char,
    graph: *mut QnnGraphHandle,
) -> QnnErrorHandle;
pub type GraphExecuteFn = unsafe extern "C" fn(
    graph: QnnGraphHandle,
    inputs: *const QnnTensor,
    num_inputs: u32,
    outputs: *mut QnnTensor,
    num_outputs: u32,
    profile: QnnProfileHandle,
    signal: QnnSignalHandle,
) -> QnnErrorHandle;
pub type LogCreateFn = unsafe extern "C" fn(
    callback: QnnLogCallback,
    max_level: u32,
    logger: *mut QnnLogHandle,
) -> QnnErrorHandle;
pub type LogSetLogLevelFn =
    unsafe extern "C" fn(logger: QnnLogHandle, level: u32) -> QnnErrorHandle;
pub type LogFreeFn = unsafe extern "C" fn(logger: QnnLogHandle) -> QnnErrorHandle;
pub type MemRegisterFn = unsafe extern "C" fn(
    context: QnnContextHandle,
    descriptors: *const QnnMemDescriptor,
    num: u32,
    handles: *mut QnnMemHandle,
) -> QnnErrorHandle;
pub type MemDeRegisterFn =
    unsafe extern "C" fn(handles: *const QnnMemHandle, num: u32) -> QnnErrorHandle;
pub type DeviceGetPlatformInfoFn = unsafe extern "C" fn(
    logger: QnnLogHandle,
    info: *mut *const QnnDevicePlatformInfo,
) -> QnnErrorHandle;
pub type DeviceFreePlatformInfoFn = unsafe extern "C" fn(
    logger: QnnLogHandle,
    info: *const QnnDevicePlatformInfo,
) -> QnnErrorHandle;
/// `QnnDevice_Infrastructure_t` is itself a pointer typedef, so the out-param is `void**`.
pub type DeviceGetInfrastructureFn =
    unsafe extern "C" fn(infra: *mut *mut c_void) -> QnnErrorHandle;
pub type DeviceCreateFn = unsafe extern "C" fn(
    logger: QnnLogHandle,
    config: *const *const QnnDeviceConfig,
    device: *mut QnnDeviceHandle,
) -> QnnErrorHandle;
pub type DeviceFreeFn = unsafe extern "C" fn(device: QnnDeviceHandle) -> QnnErrorHandle;
pub type ErrorGetMessageFn =
    unsafe extern "C" fn(error: QnnErrorHandle, message: *mut *const c_char) -> QnnErrorHandle;
pub type ErrorFreeVerboseMessageFn = unsafe extern "C" fn(message: *const c_char) -> QnnErrorHandle;

/// `QNN_INTERFACE_VER_TYPE` as of API 2.32: 71 entries, entry *i* at byte `8*i`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnInterfaceTable {
    pub property_has_capability: Option<PropertyHasCapabilityFn>, // 0
    pub backend_create: Option<BackendCreateFn>,                  // 1
    pub backend_set_config: OpaqueFn,                             // 2
    pub backend_get_api_version: Option<BackendGetApiVersionFn>,  // 3
    pub backend_get_build_id: Option<BackendGetBuildIdFn>,        // 4
    pub backend_register_op_package: OpaqueFn,                    // 5
    pub backend_get_supported_operations: OpaqueFn,               // 6
    pub backend_validate_op_config: OpaqueFn,                     // 7
    pub backend_free: Option<BackendFreeFn>,                      // 8
    pub context_create: OpaqueFn,                                 // 9
    pub context_set_config: OpaqueFn,                             // 10
    pub context_get_binary_size: OpaqueFn,                        // 11
    pub context_get_binary: OpaqueFn,                             // 12
    pub context_create_from_binary: Option<ContextCreateFromBinaryFn>, // 13
    pub context_free: Option<ContextFreeFn>,                      // 14
    pub graph_create: OpaqueFn,                                   // 15
    pub graph_create_subgraph: OpaqueFn,                          // 16
    pub graph_set_config: Option<GraphSetConfigFn>,               // 17
    pub graph_add_node: OpaqueFn,                                 // 18
    pub graph_finalize: OpaqueFn,                                 // 19
    pub graph_retrieve: Option<GraphRetrieveFn>,                  // 20
    pub graph_execute: Option<GraphExecuteFn>,                    // 21
    pub graph_execute_async: OpaqueFn,                            // 22
    pub tensor_create_context_tensor: OpaqueFn,                   // 23
    pub tensor_create_graph_tensor: OpaqueFn,                     // 24
    pub log_create: Option<LogCreateFn>,                          // 25
    pub log_set_log_level: Option<LogSetLogLevelFn>,              // 26
    pub log_free: Option<LogFreeFn>,                              // 27
    pub profile_create: OpaqueFn,                                 // 28
    pub profile_set_config: OpaqueFn,                             // 29
    pub profile_get_events: OpaqueFn,                             // 30
    pub profile_get_sub_events: OpaqueFn,                         // 31
    pub profile_get_event_data: OpaqueFn,                         // 32
    pub profile_get_extended_event_data: OpaqueFn,                // 33
    pub profile_free: OpaqueFn,                                   // 34
    pub mem_register: Option<MemRegisterFn>,                      // 35
    pub mem_de_register: Option<MemDeRegisterFn>,                 // 36
    pub device_get_platform_info: Option<DeviceGetPlatformInfoFn>, // 37
    pub device_free_platform_info: Option<DeviceFreePlatformInfoFn>, // 38
    pub device_get_infrastructure: Option<DeviceGetInfrastructureFn>, // 39
    pub device_create: Option<DeviceCreateFn>,                    // 40
    pub device_set_config: OpaqueFn,                              // 41
    pub device_get_info: OpaqueFn,                                // 42
    pub device_free: Option<DeviceFreeFn>,                        // 43
    pub signal_create: OpaqueFn,                                  // 44
    pub signal_set_config: OpaqueFn,                              // 45
    pub signal_trigger: OpaqueFn,                                 // 46
    pub signal_free: OpaqueFn,                                    // 47
    pub error_get_message: Option<ErrorGetMessageFn>,             // 48
    pub error_get_verbose_message: Option<ErrorGetMessageFn>,     // 49
    pub error_free_verbose_message: Option<ErrorFreeVerboseMessageFn>, // 50
    pub graph_prepare_execution_environment: OpaqueFn,            // 51
    pub graph_release_execution_environment: OpaqueFn,            // 52
    pub graph_get_property: OpaqueFn,                             // 53
    pub context_validate_binary: OpaqueFn,                        // 54
    pub context_create_from_binary_with_signal: OpaqueFn,         // 55
    pub context_create_from_binary_list_async: OpaqueFn,          // 56
    pub tensor_update_graph_tensors: OpaqueFn,                    // 57
    pub tensor_update_context_tensors: OpaqueFn,                  // 58
    pub context_get_binary_section_size: OpaqueFn,                // 59
    pub context_get_binary_section: OpaqueFn,                     // 60
    pub context_apply_binary_section: OpaqueFn,                   // 61
    pub backend_get_property: OpaqueFn,                           // 62
    pub context_get_property: OpaqueFn,                           // 63
    pub context_get_incremental_binary: OpaqueFn,                 // 64
    pub context_release_incremental_binary: OpaqueFn,             // 65
    pub context_finalize: OpaqueFn,                               // 66
    pub global_config_set: OpaqueFn,                              // 67
    pub context_create_from_binary_with_callback: OpaqueFn,       // 68
    pub context_get_binary_section_update: OpaqueFn,              // 69
    pub context_free_binary_section_update: OpaqueFn,             // 70
}

/// Number of entries in the 2.32 table.
pub const INTERFACE_TABLE_LEN: usize = 71;

/// The first core-API minor (major 2) whose table has entry *i*. Entries 0–47 have had
/// today's order since 2.10, the oldest minor this crate accepts; the rest follow the
/// revision history (48–55 conservatively at 2.17, 69–70 at 2.32).
pub const ENTRY_MIN_MINOR: [u32; INTERFACE_TABLE_LEN] = {
    let mut t = [10u32; INTERFACE_TABLE_LEN];
    let mut i = 48;
    while i < INTERFACE_TABLE_LEN {
        t[i] = match i {
            48..=58 => 17,
            59..=61 => 18,
            62..=63 => 22,
            64..=65 => 25,
            66 => 26,
            67 => 27,
            68 => 28,
            _ => 32,
        };
        i += 1;
    }
    t
};

/// Oldest core API this crate will drive (the table layout changed before 2.10).
pub const MIN_CORE_API: QnnVersion = QnnVersion {
    major: 2,
    minor: 10,
    patch: 0,
};

/// `QnnInterface_t`: provider header followed by the inline table.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnInterface {
    pub backend_id: u32,
    pub provider_name: *const c_char,
    pub api_version: QnnApiVersion,
    pub table: QnnInterfaceTable,
}

/// Offset of the table inside `QnnInterface_t`.
pub const INTERFACE_TABLE_OFFSET: usize = 40;

/// `QnnInterface_getProviders`.
pub type QnnInterfaceGetProvidersFn = unsafe extern "C" fn(
    provider_list: *mut *const *const QnnInterface,
    num_providers: *mut u32,
) -> QnnErrorHandle;

/// Backend ids (`QNN_BACKEND_ID_*`).
pub const QNN_BACKEND_ID_HTP: u32 = 6;

impl QnnInterfaceTable {
    /// Read the table of a library-owned provider, keeping only the entries its core API
    /// version is known to have; every later entry is `None`.
    ///
    /// # Safety
    /// `provider` must point to a live `QnnInterface_t` whose table is at least as long as
    /// its reported core API version implies (the library's promise), with major version 2.
    pub unsafe fn read_versioned(provider: *const QnnInterface) -> QnnInterfaceTable {
        // SAFETY: the caller guarantees `provider` is valid for reading the header.
        let minor = unsafe { (*provider).api_version.core.minor };
        let base = provider as *const u8;
        let mut slots: [OpaqueFn; INTERFACE_TABLE_LEN] = [None; INTERFACE_TABLE_LEN];
        for (i, slot) in slots.iter_mut().enumerate() {
            if minor >= ENTRY_MIN_MINOR[i] {
                // SAFETY: entry i exists in a table of this API version, so the 8 bytes at
                // offset 40 + 8*i are inside the library's struct. An unaligned read is used
                // because nothing but the library guarantees alignment.
                *slot = unsafe {
                    std::ptr::read_unaligned(
                        base.add(INTERFACE_TABLE_OFFSET + 8 * i) as *const OpaqueFn
                    )
                };
            }
        }
        // SAFETY: QnnInterfaceTable is 71 nullable function pointers in order (asserted in
        // `layout`), the same size and representation as the slot array; each typed slot
        // receives the pointer the library stored for that entry.
        unsafe { std::mem::transmute::<[OpaqueFn; INTERFACE_TABLE_LEN], QnnInterfaceTable>(slots) }
    }

    /// An all-`None` table, for implementers (the emulator) to fill.
    pub const fn empty() -> QnnInterfaceTable {
        // SAFETY: every field is an `Option<fn>`, for which all-zero bytes are `None`.
        unsafe { std::mem::zeroed() }
    }
}
