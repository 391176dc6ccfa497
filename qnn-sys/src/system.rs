//! `QnnSystemInterface_t` and the system-context (binary info) structures.

use crate::types::*;
use std::ffi::{c_char, c_void};

pub type SystemContextCreateFn =
    unsafe extern "C" fn(handle: *mut QnnSystemContextHandle) -> QnnErrorHandle;
pub type SystemContextGetBinaryInfoFn = unsafe extern "C" fn(
    handle: QnnSystemContextHandle,
    binary: *mut c_void,
    binary_size: u64,
    info: *mut *const QnnSystemContextBinaryInfo,
    info_size: *mut QnnContextBinarySize,
) -> QnnErrorHandle;
pub type SystemContextGetMetaDataFn = unsafe extern "C" fn(
    handle: QnnSystemContextHandle,
    binary: *const c_void,
    binary_size: u64,
    info: *mut *const QnnSystemContextBinaryInfo,
) -> QnnErrorHandle;
pub type SystemContextFreeFn =
    unsafe extern "C" fn(handle: QnnSystemContextHandle) -> QnnErrorHandle;

/// `QNN_SYSTEM_INTERFACE_VER_TYPE` (system API 1.7): 16 entries. Entries 0–3 have kept
/// their place since system API 1.1; the rest are never called here.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnSystemInterfaceTable {
    pub system_context_create: Option<SystemContextCreateFn>,
    pub system_context_get_binary_info: Option<SystemContextGetBinaryInfoFn>,
    pub system_context_get_meta_data: Option<SystemContextGetMetaDataFn>,
    pub system_context_free: Option<SystemContextFreeFn>,
    pub rest: [crate::interface::OpaqueFn; 12],
}

impl QnnSystemInterfaceTable {
    /// An all-`None` table.
    pub const fn empty() -> Self {
        // SAFETY: every field is a nullable function pointer; zero is `None`.
        unsafe { std::mem::zeroed() }
    }
}

/// `QnnSystemInterface_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnSystemInterface {
    pub backend_id: u32,
    pub provider_name: *const c_char,
    pub system_api_version: QnnVersion,
    pub table: QnnSystemInterfaceTable,
}

pub const SYSTEM_TABLE_OFFSET: usize = 32;
/// Oldest system API whose entries 0–3 this crate reads.
pub const MIN_SYSTEM_API: QnnVersion = QnnVersion {
    major: 1,
    minor: 1,
    patch: 0,
};

/// `QnnSystemInterface_getProviders`.
pub type QnnSystemInterfaceGetProvidersFn = unsafe extern "C" fn(
    provider_list: *mut *const *const QnnSystemInterface,
    num_providers: *mut u32,
) -> QnnErrorHandle;

/// `QnnSystemContext_GraphInfoV1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnSystemContextGraphInfoV1 {
    pub graph_name: *const c_char,
    pub num_graph_inputs: u32,
    pub graph_inputs: *mut QnnTensor,
    pub num_graph_outputs: u32,
    pub graph_outputs: *mut QnnTensor,
}

/// `QnnSystemContext_GraphInfoV2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnSystemContextGraphInfoV2 {
    pub v1: QnnSystemContextGraphInfoV1,
    pub num_updateable_tensors: u32,
    pub updateable_tensors: *mut QnnTensor,
}

/// `QnnSystemContext_GraphInfoV3_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnSystemContextGraphInfoV3 {
    pub v2: QnnSystemContextGraphInfoV2,
    pub graph_blob_info_size: u32,
    pub graph_blob_info: *mut c_void,
    pub start_op_index: u32,
    pub end_op_index: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union QnnSystemContextGraphInfoUnion {
    pub v1: QnnSystemContextGraphInfoV1,
    pub v2: QnnSystemContextGraphInfoV2,
    pub v3: QnnSystemContextGraphInfoV3,
}

/// `QnnSystemContext_GraphInfo_t` (88 bytes with V3 in the union).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnSystemContextGraphInfo {
    pub version: u32,
    pub u: QnnSystemContextGraphInfoUnion,
}

pub const GRAPH_INFO_VERSION_1: u32 = 1;
pub const GRAPH_INFO_VERSION_2: u32 = 2;
pub const GRAPH_INFO_VERSION_3: u32 = 3;

/// `QnnSystemContext_BinaryInfoV1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnSystemContextBinaryInfoV1 {
    pub backend_id: u32,
    pub build_id: *const c_char,
    pub core_api_version: QnnVersion,
    pub backend_api_version: QnnVersion,
    pub soc_version: *const c_char,
    pub hw_info_blob_version: QnnVersion,
    pub context_blob_version: QnnVersion,
    pub hw_info_blob_size: u32,
    pub hw_info_blob: *mut c_void,
    pub context_blob_size: u64,
    pub num_context_tensors: u32,
    pub context_tensors: *mut QnnTensor,
    pub num_graphs: u32,
    pub graphs: *mut QnnSystemContextGraphInfo,
}

/// `QnnSystemContext_BinaryInfoV2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnSystemContextBinaryInfoV2 {
    pub v1: QnnSystemContextBinaryInfoV1,
    pub platform_info: *mut QnnDevicePlatformInfo,
}

/// `QnnSystemContext_BinaryInfoV3_t` (drops the hw-info blob, adds metadata and socModel).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnSystemContextBinaryInfoV3 {
    pub backend_id: u32,
    pub build_id: *const c_char,
    pub core_api_version: QnnVersion,
    pub backend_api_version: QnnVersion,
    pub soc_version: *const c_char,
    pub context_blob_version: QnnVersion,
    pub context_blob_size: u64,
    pub num_context_tensors: u32,
    pub context_tensors: *mut QnnTensor,
    pub num_graphs: u32,
    pub graphs: *mut QnnSystemContextGraphInfo,
    pub platform_info: *mut QnnDevicePlatformInfo,
    pub context_metadata_size: u32,
    pub context_metadata: *mut c_void,
    pub soc_model: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union QnnSystemContextBinaryInfoUnion {
    pub v1: QnnSystemContextBinaryInfoV1,
    pub v2: QnnSystemContextBinaryInfoV2,
    pub v3: QnnSystemContextBinaryInfoV3,
}

/// `QnnSystemContext_BinaryInfo_t` (144 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnSystemContextBinaryInfo {
    pub version: u32,
    pub u: QnnSystemContextBinaryInfoUnion,
}

pub const BINARY_INFO_VERSION_1: u32 = 1;
pub const BINARY_INFO_VERSION_2: u32 = 2;
pub const BINARY_INFO_VERSION_3: u32 = 3;
