//! Core QNN value types (QAIRT 2.43 / core API 2.32 layouts, LP64 and LLP64 alike).
//!
//! C enums are bound as plain integer aliases plus constants, never as Rust enums: a
//! library may hand back values this crate has never heard of.

use std::ffi::{c_char, c_void};

/// `Qnn_ErrorHandle_t`: a u64 whose low 16 bits carry the error code.
pub type QnnErrorHandle = u64;

pub type QnnBackendHandle = *mut c_void;
pub type QnnContextHandle = *mut c_void;
pub type QnnDeviceHandle = *mut c_void;
pub type QnnGraphHandle = *mut c_void;
pub type QnnLogHandle = *mut c_void;
pub type QnnMemHandle = *mut c_void;
pub type QnnProfileHandle = *mut c_void;
pub type QnnSignalHandle = *mut c_void;
pub type QnnSystemContextHandle = *mut c_void;
pub type QnnContextBinarySize = u64;

/// `Qnn_Version_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct QnnVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl std::fmt::Display for QnnVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// `Qnn_ApiVersion_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QnnApiVersion {
    pub core: QnnVersion,
    pub backend: QnnVersion,
}

/// `Qnn_DataType_t` values. The low byte is the bit width written as hex digits.
pub mod dtype {
    pub type DataType = u32;
    pub const INT_8: DataType = 0x0008;
    pub const INT_16: DataType = 0x0016;
    pub const INT_32: DataType = 0x0032;
    pub const INT_64: DataType = 0x0064;
    pub const UINT_8: DataType = 0x0108;
    pub const UINT_16: DataType = 0x0116;
    pub const UINT_32: DataType = 0x0132;
    pub const UINT_64: DataType = 0x0164;
    pub const FLOAT_16: DataType = 0x0216;
    pub const BFLOAT_16: DataType = 0x0226;
    pub const FLOAT_32: DataType = 0x0232;
    pub const FLOAT_64: DataType = 0x0264;
    pub const SFIXED_POINT_4: DataType = 0x0304;
    pub const SFIXED_POINT_8: DataType = 0x0308;
    pub const SFIXED_POINT_16: DataType = 0x0316;
    pub const SFIXED_POINT_32: DataType = 0x0332;
    pub const UFIXED_POINT_4: DataType = 0x0404;
    pub const UFIXED_POINT_8: DataType = 0x0408;
    pub const UFIXED_POINT_16: DataType = 0x0416;
    pub const UFIXED_POINT_32: DataType = 0x0432;
    pub const BOOL_8: DataType = 0x0508;
    pub const STRING: DataType = 0x0608;
    pub const UNDEFINED: DataType = 0x7FFF_FFFF;

    /// Bytes per element (4-bit types live in 8-bit containers); `None` for unknown values.
    pub fn size_of(dt: DataType) -> Option<usize> {
        if dt == UNDEFINED || !(0x0000..=0x0608).contains(&dt) {
            return None;
        }
        let low = dt & 0xFF;
        // 0x08 -> 8 bits, 0x16 -> 16 bits, 0x32 -> 32, 0x64 -> 64, 0x04 -> 4.
        let bits = (low >> 4) * 10 + (low & 0xF);
        match bits {
            4 | 8 => Some(1),
            16 => Some(2),
            32 => Some(4),
            64 => Some(8),
            _ => None,
        }
    }

    /// The header's spelling, for messages.
    pub fn name(dt: DataType) -> &'static str {
        match dt {
            INT_8 => "INT_8",
            INT_16 => "INT_16",
            INT_32 => "INT_32",
            INT_64 => "INT_64",
            UINT_8 => "UINT_8",
            UINT_16 => "UINT_16",
            UINT_32 => "UINT_32",
            UINT_64 => "UINT_64",
            FLOAT_16 => "FLOAT_16",
            BFLOAT_16 => "BFLOAT_16",
            FLOAT_32 => "FLOAT_32",
            FLOAT_64 => "FLOAT_64",
            SFIXED_POINT_4 => "SFIXED_POINT_4",
            SFIXED_POINT_8 => "SFIXED_POINT_8",
            SFIXED_POINT_16 => "SFIXED_POINT_16",
            SFIXED_POINT_32 => "SFIXED_POINT_32",
            UFIXED_POINT_4 => "UFIXED_POINT_4",
            UFIXED_POINT_8 => "UFIXED_POINT_8",
            UFIXED_POINT_16 => "UFIXED_POINT_16",
            UFIXED_POINT_32 => "UFIXED_POINT_32",
            BOOL_8 => "BOOL_8",
            STRING => "STRING",
            _ => "UNKNOWN",
        }
    }
}

/// `Qnn_TensorType_t`.
pub mod tensor_type {
    pub type TensorType = u32;
    pub const APP_WRITE: TensorType = 0;
    pub const APP_READ: TensorType = 1;
    pub const APP_READWRITE: TensorType = 2;
    pub const NATIVE: TensorType = 3;
    pub const STATIC: TensorType = 4;
    pub const NULL: TensorType = 5;
    pub const UPDATEABLE_APP_WRITE: TensorType = 8;
    pub const UPDATEABLE_APP_READ: TensorType = 9;
    pub const UPDATEABLE_APP_READWRITE: TensorType = 10;
    pub const OPTIONAL_APP_WRITE: TensorType = 11;
    pub const OPTIONAL_APP_READ: TensorType = 12;
    pub const OPTIONAL_APP_READWRITE: TensorType = 13;
    pub const UNDEFINED: TensorType = 0x7FFF_FFFF;
}

/// `Qnn_TensorMemType_t`.
pub mod mem_type {
    pub const RAW: u32 = 0;
    pub const MEMHANDLE: u32 = 1;
    pub const RETRIEVE_RAW: u32 = 2;
    pub const UNDEFINED: u32 = 0x7FFF_FFFF;
}

/// `Qnn_TensorVersion_t`.
pub const QNN_TENSOR_VERSION_1: u32 = 1;
pub const QNN_TENSOR_VERSION_2: u32 = 2;
/// `Qnn_TensorDataFormat_t` FLAT_BUFFER / DENSE.
pub const QNN_TENSOR_DATA_FORMAT_FLAT_BUFFER: u32 = 0;

/// `Qnn_Definition_t`.
pub const QNN_DEFINITION_IMPL_GENERATED: u32 = 0;
pub const QNN_DEFINITION_DEFINED: u32 = 1;
pub const QNN_DEFINITION_UNDEFINED: u32 = 0x7FFF_FFFF;

/// `Qnn_QuantizationEncoding_t`.
pub mod quant_encoding {
    pub const SCALE_OFFSET: u32 = 0;
    pub const AXIS_SCALE_OFFSET: u32 = 1;
    pub const BW_SCALE_OFFSET: u32 = 2;
    pub const BW_AXIS_SCALE_OFFSET: u32 = 3;
    pub const UNDEFINED: u32 = 0x7FFF_FFFF;
}

/// `Qnn_ScaleOffset_t`: real = (q + offset) * scale.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QnnScaleOffset {
    pub scale: f32,
    pub offset: i32,
}

/// `Qnn_AxisScaleOffset_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnAxisScaleOffset {
    pub axis: i32,
    pub num_scale_offsets: u32,
    pub scale_offset: *mut QnnScaleOffset,
}

/// `Qnn_BwScaleOffset_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnBwScaleOffset {
    pub bitwidth: u32,
    pub scale: f32,
    pub offset: i32,
}

/// `Qnn_BwAxisScaleOffset_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnBwAxisScaleOffset {
    pub bitwidth: u32,
    pub axis: i32,
    pub num_elements: u32,
    pub scales: *mut f32,
    pub offsets: *mut i32,
}

/// The 32-byte encoding union inside `Qnn_QuantizeParams_t`. Only the variants a runtime
/// reads are named; `raw` pins the size and alignment of the whole union.
#[repr(C)]
#[derive(Clone, Copy)]
pub union QnnQuantizeEncodingUnion {
    pub scale_offset: QnnScaleOffset,
    pub axis_scale_offset: QnnAxisScaleOffset,
    pub bw_scale_offset: QnnBwScaleOffset,
    pub bw_axis_scale_offset: QnnBwAxisScaleOffset,
    pub ptr: *mut c_void,
    pub raw: [u64; 4],
}

/// `Qnn_QuantizeParams_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnQuantizeParams {
    pub encoding_definition: u32,
    pub quantization_encoding: u32,
    pub encoding: QnnQuantizeEncodingUnion,
}

impl Default for QnnQuantizeParams {
    fn default() -> Self {
        Self {
            encoding_definition: QNN_DEFINITION_UNDEFINED,
            quantization_encoding: quant_encoding::UNDEFINED,
            encoding: QnnQuantizeEncodingUnion { raw: [0; 4] },
        }
    }
}

impl std::fmt::Debug for QnnQuantizeParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("QnnQuantizeParams");
        d.field("definition", &self.encoding_definition)
            .field("encoding", &self.quantization_encoding);
        if self.quantization_encoding == quant_encoding::SCALE_OFFSET {
            // SAFETY: the encoding tag selects the scale_offset member; any bits are valid
            // for its f32/i32 fields.
            let so = unsafe { self.encoding.scale_offset };
            d.field("scale", &so.scale).field("offset", &so.offset);
        }
        d.finish()
    }
}

impl QnnQuantizeParams {
    /// A defined per-tensor scale/offset encoding.
    pub fn scale_offset(scale: f32, offset: i32) -> Self {
        let mut raw = Self::default();
        raw.encoding_definition = QNN_DEFINITION_DEFINED;
        raw.quantization_encoding = quant_encoding::SCALE_OFFSET;
        raw.encoding = QnnQuantizeEncodingUnion {
            raw: [0; 4], // zero the tail before writing the 8-byte variant
        };
        // Writing a Copy field of a union is safe; only reads need `unsafe`.
        raw.encoding.scale_offset = QnnScaleOffset { scale, offset };
        raw
    }
}

/// `Qnn_ClientBuffer_t`. `data_size` is 32-bit: one tensor buffer is at most 4 GiB.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnClientBuffer {
    pub data: *mut c_void,
    pub data_size: u32,
}

/// Memory union of a tensor: client buffer, registered mem handle, or (V2) retrieve-raw.
#[repr(C)]
#[derive(Clone, Copy)]
pub union QnnTensorMem {
    pub client_buf: QnnClientBuffer,
    pub mem_handle: QnnMemHandle,
    pub retrieve_raw: *mut c_void,
}

/// `Qnn_TensorV1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnTensorV1 {
    pub id: u32,
    pub name: *const c_char,
    pub tensor_type: u32,
    pub data_format: u32,
    pub data_type: u32,
    pub quantize_params: QnnQuantizeParams,
    pub rank: u32,
    pub dimensions: *mut u32,
    pub mem_type: u32,
    pub mem: QnnTensorMem,
}

/// `Qnn_SparseParams_t`, flattened: layout type + the hybrid-COO pair.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct QnnSparseParams {
    pub layout_type: u32,
    pub num_specified_elements: u32,
    pub num_sparse_dimensions: u32,
}

/// `Qnn_TensorV2_t`: V1's fields, then dynamic dims, sparsity and `isProduced`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnTensorV2 {
    pub id: u32,
    pub name: *const c_char,
    pub tensor_type: u32,
    pub data_format: u32,
    pub data_type: u32,
    pub quantize_params: QnnQuantizeParams,
    pub rank: u32,
    pub dimensions: *mut u32,
    pub mem_type: u32,
    pub mem: QnnTensorMem,
    pub is_dynamic_dimensions: *mut u8,
    pub sparse_params: QnnSparseParams,
    pub is_produced: u8,
}

/// Version-tagged union of V1 / V2 tensor descriptions.
#[repr(C)]
#[derive(Clone, Copy)]
pub union QnnTensorUnion {
    pub v1: QnnTensorV1,
    pub v2: QnnTensorV2,
}

/// `Qnn_Tensor_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnTensor {
    pub version: u32,
    pub u: QnnTensorUnion,
}

impl QnnTensor {
    /// An all-default V2 tensor (the 2.43 `QNN_TENSOR_INIT` values).
    pub fn new_v2() -> Self {
        QnnTensor {
            version: QNN_TENSOR_VERSION_2,
            u: QnnTensorUnion {
                v2: QnnTensorV2 {
                    id: 0,
                    name: std::ptr::null(),
                    tensor_type: tensor_type::UNDEFINED,
                    data_format: QNN_TENSOR_DATA_FORMAT_FLAT_BUFFER,
                    data_type: dtype::UNDEFINED,
                    quantize_params: QnnQuantizeParams::default(),
                    rank: 0,
                    dimensions: std::ptr::null_mut(),
                    mem_type: mem_type::UNDEFINED,
                    mem: QnnTensorMem {
                        client_buf: QnnClientBuffer {
                            data: std::ptr::null_mut(),
                            data_size: 0,
                        },
                    },
                    is_dynamic_dimensions: std::ptr::null_mut(),
                    sparse_params: QnnSparseParams::default(),
                    is_produced: 0,
                },
            },
        }
    }

    /// The fields common to V1 and V2 (they share one prefix layout).
    ///
    /// # Safety
    /// `self.version` must be 1 or 2, and the union must have been initialised as that version.
    pub unsafe fn common(&self) -> &QnnTensorV1 {
        // SAFETY: V1 is a layout prefix of V2 (asserted in `layout`), and the caller promises
        // that one of the two variants was written.
        unsafe { &self.u.v1 }
    }

    /// Mutable access to the common V1/V2 prefix.
    ///
    /// # Safety
    /// As for [`QnnTensor::common`].
    pub unsafe fn common_mut(&mut self) -> &mut QnnTensorV1 {
        // SAFETY: see `common`.
        unsafe { &mut self.u.v1 }
    }
}

/// `Qnn_MemDescriptor_t`'s shape part.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnMemShape {
    pub num_dim: u32,
    pub dim_size: *mut u32,
    pub shape_config: *const c_char,
}

/// `Qnn_MemDescriptor_t` union.
#[repr(C)]
#[derive(Clone, Copy)]
pub union QnnMemInfo {
    pub ion_fd: i32,
    pub custom_info: *mut c_void,
    pub dma_buf: QnnDmaBufInfo,
}

/// `Qnn_MemDmaBufInfo_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnDmaBufInfo {
    pub fd: i32,
    pub data: *mut c_void,
}

/// `Qnn_MemType_t` values.
pub mod mem_kind {
    pub const ION: u32 = 1;
    pub const CUSTOM: u32 = 2;
    pub const DMA_BUF: u32 = 3;
}

/// `Qnn_MemDescriptor_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnMemDescriptor {
    pub mem_shape: QnnMemShape,
    pub data_type: u32,
    pub mem_type: u32,
    pub info: QnnMemInfo,
}

/// `QnnMemHtp_Descriptor_t` (used with `mem_kind::CUSTOM` for many tensors per buffer).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnMemHtpDescriptor {
    pub htp_type: u32,
    pub size: u64,
    pub fd: i32,
    pub offset: u64,
}

/// A generic `{option u32; union(8 bytes)}` config entry: the shape of `QnnContext_Config_t`,
/// `QnnDevice_Config_t`, `QnnBackend_Config_t` and `QnnGraph_Config_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnConfigEntry {
    pub option: u32,
    pub value: QnnConfigValue,
}

/// The 8-byte payload of a config entry.
#[repr(C)]
#[derive(Clone, Copy)]
pub union QnnConfigValue {
    pub ptr: *const c_void,
    pub u32_value: u32,
    pub u64_value: u64,
    pub u8_value: u8,
}

pub type QnnContextConfig = QnnConfigEntry;
pub type QnnDeviceConfig = QnnConfigEntry;
pub type QnnBackendConfig = QnnConfigEntry;
pub type QnnGraphConfig = QnnConfigEntry;

/// `QnnContext_ConfigOption_t` values.
pub mod context_option {
    pub const CUSTOM: u32 = 0;
    pub const PRIORITY: u32 = 1;
    pub const ENABLE_GRAPHS: u32 = 5;
    pub const MEMORY_LIMIT_HINT: u32 = 6;
    pub const PERSISTENT_BINARY: u32 = 7;
}

/// `QnnLog_Level_t`: levels start at 1.
pub mod log_level {
    pub const ERROR: u32 = 1;
    pub const WARN: u32 = 2;
    pub const INFO: u32 = 3;
    pub const VERBOSE: u32 = 4;
    pub const DEBUG: u32 = 5;
}

/// `QnnLog_Callback_t`. The `va_list` is passed as an opaque pointer-sized value, which
/// matches x86_64 SysV, AAPCS64 (a pointer to the caller's copy) and Windows (`char*`).
pub type QnnLogCallback =
    Option<unsafe extern "C" fn(fmt: *const c_char, level: u32, timestamp: u64, args: *mut c_void)>;

/// Property keys.
pub const QNN_PROPERTY_GROUP_DEVICE: u32 = 1501;

/// `QnnDevice_PlatformInfo_t` (version 1).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnDevicePlatformInfo {
    pub version: u32,
    pub _pad: u32,
    pub num_hw_devices: u32,
    pub hw_devices: *const QnnDeviceHardwareInfo,
}

/// `QnnDevice_HardwareDeviceInfo_t` (version 1).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnDeviceHardwareInfo {
    pub version: u32,
    pub _pad: u32,
    pub device_id: u32,
    pub device_type: u32,
    pub num_cores: u32,
    pub cores: *const c_void,
    pub device_info_extension: *const c_void,
}

/// `QnnHtpDevice_DeviceInfoExtension_t` (on-chip variant).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnHtpDeviceInfoExtension {
    pub dev_type: u32,
    pub vtcm_size_mb: usize,
    pub soc_model: u32,
    pub signed_pd_support: u8,
    pub dlbc_support: u8,
    pub arch: u32,
}

/// HTP perf infrastructure (`HTP/QnnHtpPerfInfrastructure.h`, `HTP/QnnHtpDevice.h`).
pub mod perf {
    /// `QnnHtpPerfInfrastructure_PowerConfigOption_t`.
    pub const OPTION_DCVS_V3: u32 = 1;
    pub const OPTION_RPC_CONTROL_LATENCY: u32 = 2;
    pub const OPTION_RPC_POLLING_TIME: u32 = 3;
    /// `QnnHtpPerfInfrastructure_PowerMode_t`.
    pub const POWER_MODE_ADJUST_UP_DOWN: u32 = 0x1;
    pub const POWER_MODE_POWER_SAVER: u32 = 0x4;
    pub const POWER_MODE_PERFORMANCE: u32 = 0x10;
    /// `QnnHtpPerfInfrastructure_VoltageCorner_t`.
    pub const CORNER_DISABLE: u32 = 0x10;
    pub const CORNER_SVS2: u32 = 0x30;
    pub const CORNER_SVS: u32 = 0x40;
    pub const CORNER_NOM_PLUS: u32 = 0x70;
    pub const CORNER_TURBO: u32 = 0x80;
    pub const CORNER_MAX: u32 = 0xA0;
    /// `QNN_HTP_PERF_INFRASTRUCTURE_POWER_CONFIG_MAX_RPC_POLLING_TIME`.
    pub const MAX_RPC_POLLING_TIME_US: u32 = 9999;
    /// `QnnHtpDevice_InfrastructureType_t` PERF.
    pub const INFRASTRUCTURE_TYPE_PERF: u32 = 0;
}

/// `QnnHtpPerfInfrastructure_DcvsV3_t`: 16 u32 fields.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QnnHtpDcvsV3 {
    pub context_id: u32,
    pub set_dcvs_enable: u32,
    pub dcvs_enable: u32,
    pub power_mode: u32,
    pub set_sleep_latency: u32,
    pub sleep_latency: u32,
    pub set_sleep_disable: u32,
    pub sleep_disable: u32,
    pub set_bus_params: u32,
    pub bus_voltage_corner_min: u32,
    pub bus_voltage_corner_target: u32,
    pub bus_voltage_corner_max: u32,
    pub set_core_params: u32,
    pub core_voltage_corner_min: u32,
    pub core_voltage_corner_target: u32,
    pub core_voltage_corner_max: u32,
}

/// The union of `QnnHtpPerfInfrastructure_PowerConfig_t` (64 bytes, align 4).
#[repr(C)]
#[derive(Clone, Copy)]
pub union QnnHtpPowerConfigValue {
    pub dcvs_v3: QnnHtpDcvsV3,
    pub u32_value: u32,
    pub raw: [u32; 16],
}

/// `QnnHtpPerfInfrastructure_PowerConfig_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnHtpPowerConfig {
    pub option: u32,
    pub value: QnnHtpPowerConfigValue,
}

pub type CreatePowerConfigIdFn =
    unsafe extern "C" fn(device_id: u32, core_id: u32, out: *mut u32) -> QnnErrorHandle;
pub type DestroyPowerConfigIdFn = unsafe extern "C" fn(id: u32) -> QnnErrorHandle;
pub type SetPowerConfigFn =
    unsafe extern "C" fn(id: u32, cfgs: *const *const QnnHtpPowerConfig) -> QnnErrorHandle;
pub type SetMemoryConfigFn = unsafe extern "C" fn(
    device_id: u32,
    core_id: u32,
    cfgs: *const *const std::ffi::c_void,
) -> QnnErrorHandle;

/// `QnnHtpDevice_PerfInfrastructure_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnHtpPerfInfrastructure {
    pub create_power_config_id: Option<CreatePowerConfigIdFn>,
    pub destroy_power_config_id: Option<DestroyPowerConfigIdFn>,
    pub set_power_config: Option<SetPowerConfigFn>,
    pub set_memory_config: Option<SetMemoryConfigFn>,
}

/// `QnnHtpDevice_Infrastructure_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QnnHtpDeviceInfrastructure {
    pub infra_type: u32,
    pub perf: QnnHtpPerfInfrastructure,
}
