//! Decoding `Qnn_ErrorHandle_t` values.

use crate::types::QnnErrorHandle;

/// A QNN status: the raw 64-bit value with its low-16-bit code decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct QnnStatus(pub QnnErrorHandle);

impl QnnStatus {
    /// `QNN_GET_ERROR_CODE`: the higher bits are reserved for internal tracking.
    pub fn code(self) -> u16 {
        (self.0 & 0xFFFF) as u16
    }
    pub fn is_ok(self) -> bool {
        self.code() == 0
    }
    /// The header name of the code, if known.
    pub fn name(self) -> &'static str {
        error_name(self.code())
    }
}

impl std::fmt::Display for QnnStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}, 0x{:x})", self.name(), self.code(), self.code())
    }
}

/// A status is an error in its own right (its Display names the code), so callers may
/// return it as a `source`.
impl std::error::Error for QnnStatus {}

/// The QNN header name of an error code (low 16 bits), or a range name when unknown.
pub fn error_name(code: u16) -> &'static str {
    match code {
        0 => "QNN_SUCCESS",
        1000 => "QNN_COMMON_ERROR_NOT_SUPPORTED",
        1002 => "QNN_COMMON_ERROR_MEM_ALLOC",
        1003 => "QNN_COMMON_ERROR_SYSTEM",
        1004 => "QNN_COMMON_ERROR_INVALID_ARGUMENT",
        1005 => "QNN_COMMON_ERROR_OPERATION_NOT_PERMITTED",
        1006 => "QNN_COMMON_ERROR_PLATFORM_NOT_SUPPORTED",
        1007 => "QNN_COMMON_ERROR_SYSTEM_COMMUNICATION",
        1008 => "QNN_COMMON_ERROR_INCOMPATIBLE_BINARIES",
        1009 => "QNN_COMMON_ERROR_LOADING_BINARIES",
        1010 => "QNN_COMMON_ERROR_RESOURCE_UNAVAILABLE",
        1011 => "QNN_COMMON_ERROR_SYSTEM_COMMUNICATION_FATAL",
        1100 => "QNN_COMMON_ERROR_GENERAL",
        2000 => "QNN_PROPERTY_ERROR_UNKNOWN_KEY",
        4000 => "QNN_BACKEND_ERROR_CANNOT_INITIALIZE",
        4002 => "QNN_BACKEND_ERROR_TERMINATE_FAILED",
        4003 => "QNN_BACKEND_ERROR_NOT_SUPPORTED",
        4004 => "QNN_BACKEND_ERROR_INVALID_ARGUMENT",
        4010 => "QNN_BACKEND_ERROR_INCONSISTENT_CONFIG",
        4011 => "QNN_BACKEND_ERROR_INVALID_HANDLE",
        4012 => "QNN_BACKEND_ERROR_INVALID_CONFIG",
        5000 => "QNN_CONTEXT_ERROR_INVALID_ARGUMENT",
        5001 => "QNN_CONTEXT_ERROR_CTX_DOES_NOT_EXIST",
        5002 => "QNN_CONTEXT_ERROR_INVALID_HANDLE",
        5003 => "QNN_CONTEXT_ERROR_NOT_FINALIZED",
        5004 => "QNN_CONTEXT_ERROR_BINARY_VERSION",
        5005 => "QNN_CONTEXT_ERROR_CREATE_FROM_BINARY",
        5006 => "QNN_CONTEXT_ERROR_GET_BINARY_SIZE_FAILED",
        5007 => "QNN_CONTEXT_ERROR_GET_BINARY_FAILED",
        5008 => "QNN_CONTEXT_ERROR_BINARY_CONFIGURATION",
        5009 => "QNN_CONTEXT_ERROR_SET_PROFILE",
        5010 => "QNN_CONTEXT_ERROR_INVALID_CONFIG",
        5011 => "QNN_CONTEXT_ERROR_BINARY_SUBOPTIMAL",
        5012 => "QNN_CONTEXT_ERROR_ABORTED",
        5013 => "QNN_CONTEXT_ERROR_TIMED_OUT",
        5014 => "QNN_CONTEXT_ERROR_INCREMENT_INVALID_BUFFER",
        6000 => "QNN_GRAPH_ERROR_INVALID_ARGUMENT",
        6001 => "QNN_GRAPH_ERROR_INVALID_HANDLE",
        6002 => "QNN_GRAPH_ERROR_GRAPH_DOES_NOT_EXIST",
        6003 => "QNN_GRAPH_ERROR_INVALID_NAME",
        6004 => "QNN_GRAPH_ERROR_INVALID_TENSOR",
        6005 => "QNN_GRAPH_ERROR_INVALID_OP_CONFIG",
        6006 => "QNN_GRAPH_ERROR_SET_PROFILE",
        6007 => "QNN_GRAPH_ERROR_UNCONNECTED_NODE",
        6020 => "QNN_GRAPH_ERROR_CREATE_FAILED",
        6021 => "QNN_GRAPH_ERROR_OPTIMIZATION_FAILED",
        6022 => "QNN_GRAPH_ERROR_FINALIZE_FAILED",
        6023 => "QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED",
        6024 => "QNN_GRAPH_ERROR_GRAPH_FINALIZED",
        6025 => "QNN_GRAPH_ERROR_EXECUTION_ASYNC_FIFO_FULL",
        6030 => "QNN_GRAPH_ERROR_SIGNAL_IN_USE",
        6031 => "QNN_GRAPH_ERROR_ABORTED",
        6032 => "QNN_GRAPH_ERROR_PROFILE_IN_USE",
        6033 => "QNN_GRAPH_ERROR_TIMED_OUT",
        6034 => "QNN_GRAPH_ERROR_SUBGRAPH",
        6035 => "QNN_GRAPH_ERROR_DISABLED",
        6036 => "QNN_GRAPH_ERROR_DYNAMIC_TENSOR_SHAPE",
        6037 => "QNN_GRAPH_ERROR_TENSOR_SPARSITY",
        6038 => "QNN_GRAPH_ERROR_EARLY_TERMINATION",
        6039 => "QNN_GRAPH_ERROR_INVALID_CONTEXT",
        7001 => "QNN_TENSOR_ERROR_INVALID_HANDLE",
        7002 => "QNN_TENSOR_ERROR_DOES_NOT_EXIST",
        7003 => "QNN_TENSOR_ERROR_ALREADY_EXISTS",
        7004 => "QNN_TENSOR_ERROR_INVALID_TENSOR_PARAM",
        7005 => "QNN_TENSOR_ERROR_UNSUPPORTED_TENSOR_PARAM",
        7006 => "QNN_TENSOR_ERROR_NAME_HASH_COLLISION",
        7007 => "QNN_TENSOR_ERROR_INCOMPATIBLE_TENSOR_UPDATE",
        8000 => "QNN_MEM_ERROR_INVALID_ARGUMENT",
        8001 => "QNN_MEM_ERROR_INVALID_HANDLE",
        8002 => "QNN_MEM_ERROR_ALREADY_REGISTERED",
        8003 => "QNN_MEM_ERROR_MAPPING",
        8004 => "QNN_MEM_ERROR_INVALID_SHAPE",
        8005 => "QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE",
        11002 => "QNN_LOG_ERROR_INITIALIZATION",
        11003 => "QNN_LOG_ERROR_INVALID_ARGUMENT",
        11004 => "QNN_LOG_ERROR_INVALID_HANDLE",
        12000 => "QNN_PROFILE_ERROR_INVALID_HANDLE",
        12001 => "QNN_PROFILE_ERROR_HANDLE_IN_USE",
        12002 => "QNN_PROFILE_ERROR_INCOMPATIBLE_EVENT",
        13000 => "QNN_PERF_INFRASTRUCTURE_ERROR_INVALID_HANDLE_PTR",
        13001 => "QNN_PERF_INFRASTRUCTURE_ERROR_INVALID_INPUT",
        13002 => "QNN_PERF_INFRASTRUCTURE_ERROR_UNSUPPORTED_CONFIG",
        13003 => "QNN_PERF_INFRASTRUCTURE_ERROR_TRANSPORT",
        13004 => "QNN_PERF_INFRASTRUCTURE_ERROR_UNSUPPORTED",
        13005 => "QNN_PERF_INFRASTRUCTURE_ERROR_MEM_ALLOC",
        13006 => "QNN_PERF_INFRASTRUCTURE_ERROR_FAILED",
        14000 => "QNN_DEVICE_ERROR_INVALID_HANDLE",
        14001 => "QNN_DEVICE_ERROR_INVALID_CONFIG",
        14002 => "QNN_DEVICE_ERROR_HARDWARE_UNAVAILABLE",
        14003 => "QNN_DEVICE_ERROR_ASSOCIATED_TO_CONTEXT",
        30000 => "QNN_SYSTEM_CONTEXT_ERROR_INVALID_HANDLE",
        30001 => "QNN_SYSTEM_CONTEXT_ERROR_INVALID_ARGUMENT",
        30002 => "QNN_SYSTEM_CONTEXT_ERROR_OPERATION_FAILED",
        30010 => "QNN_SYSTEM_CONTEXT_ERROR_MALFORMED_BINARY",
        1001..=1999 => "QNN_COMMON_ERROR (unknown code)",
        2001..=2999 => "QNN_PROPERTY_ERROR (unknown code)",
        3000..=3999 => "QNN_OP_PACKAGE_ERROR",
        4001..=4999 => "QNN_BACKEND_ERROR (unknown code)",
        5015..=5999 => "QNN_CONTEXT_ERROR (unknown code)",
        6040..=6999 => "QNN_GRAPH_ERROR (unknown code)",
        7000..=7999 => "QNN_TENSOR_ERROR (unknown code)",
        8006..=8999 => "QNN_MEM_ERROR (unknown code)",
        9000..=9999 => "QNN_SIGNAL_ERROR",
        10000..=10999 => "QNN_ERROR_API_ERROR",
        11000..=11999 => "QNN_LOG_ERROR (unknown code)",
        12003..=12999 => "QNN_PROFILE_ERROR (unknown code)",
        13007..=13999 => "QNN_PERF_INFRASTRUCTURE_ERROR (unknown code)",
        14004..=14999 => "QNN_DEVICE_ERROR (unknown code)",
        15000..=15999 => "QNN_GLOBAL_CONFIG_ERROR",
        30003..=49999 => "QNN_SYSTEM_ERROR (unknown code)",
        60000..=60999 => "QNN_INTERFACE_ERROR",
        _ => "QNN_ERROR (unknown code)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_reserved_high_bits() {
        let s = QnnStatus(0xABCD_0000_0000_0000 | 5005);
        assert_eq!(s.code(), 5005);
        assert_eq!(s.name(), "QNN_CONTEXT_ERROR_CREATE_FROM_BINARY");
        assert!(!s.is_ok());
        assert!(QnnStatus(0x1234_0000).is_ok());
    }

    #[test]
    fn names_known_and_range_codes() {
        assert_eq!(error_name(0x3ea), "QNN_COMMON_ERROR_MEM_ALLOC");
        assert_eq!(error_name(6004), "QNN_GRAPH_ERROR_INVALID_TENSOR");
        assert_eq!(error_name(6900), "QNN_GRAPH_ERROR (unknown code)");
        assert!(QnnStatus(1007).to_string().contains("1007"));
    }
}
