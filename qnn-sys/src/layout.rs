//! Compile-time layout assertions against the QAIRT 2.43 headers (LP64; LLP64 is identical
//! because the API uses no `long`). A wrong offset here would corrupt every call.

use crate::interface::*;
use crate::system::*;
use crate::types::*;
use std::mem::{align_of, offset_of, size_of};

macro_rules! assert_layout {
    ($t:ty, size = $s:expr, align = $a:expr $(, $f:ident = $o:expr)* $(,)?) => {
        const _: () = assert!(size_of::<$t>() == $s, concat!("size of ", stringify!($t)));
        const _: () = assert!(align_of::<$t>() == $a, concat!("align of ", stringify!($t)));
        $(const _: () = assert!(offset_of!($t, $f) == $o, concat!(stringify!($t), ".", stringify!($f)));)*
    };
}

assert_layout!(
    QnnVersion,
    size = 12,
    align = 4,
    major = 0,
    minor = 4,
    patch = 8
);
assert_layout!(QnnApiVersion, size = 24, align = 4, core = 0, backend = 12);
assert_layout!(QnnScaleOffset, size = 8, align = 4, scale = 0, offset = 4);
assert_layout!(
    QnnAxisScaleOffset,
    size = 16,
    align = 8,
    axis = 0,
    num_scale_offsets = 4,
    scale_offset = 8
);
assert_layout!(
    QnnBwAxisScaleOffset,
    size = 32,
    align = 8,
    bitwidth = 0,
    axis = 4,
    num_elements = 8,
    scales = 16,
    offsets = 24
);
assert_layout!(QnnQuantizeEncodingUnion, size = 32, align = 8);
assert_layout!(
    QnnQuantizeParams,
    size = 40,
    align = 8,
    encoding_definition = 0,
    quantization_encoding = 4,
    encoding = 8
);
assert_layout!(
    QnnClientBuffer,
    size = 16,
    align = 8,
    data = 0,
    data_size = 8
);
assert_layout!(QnnTensorMem, size = 16, align = 8);
assert_layout!(
    QnnTensorV1,
    size = 112,
    align = 8,
    id = 0,
    name = 8,
    tensor_type = 16,
    data_format = 20,
    data_type = 24,
    quantize_params = 32,
    rank = 72,
    dimensions = 80,
    mem_type = 88,
    mem = 96,
);
assert_layout!(
    QnnTensorV2,
    size = 136,
    align = 8,
    id = 0,
    name = 8,
    tensor_type = 16,
    data_format = 20,
    data_type = 24,
    quantize_params = 32,
    rank = 72,
    dimensions = 80,
    mem_type = 88,
    mem = 96,
    is_dynamic_dimensions = 112,
    sparse_params = 120,
    is_produced = 132,
);
assert_layout!(QnnSparseParams, size = 12, align = 4);
assert_layout!(QnnTensor, size = 144, align = 8, version = 0, u = 8);
assert_layout!(
    QnnMemShape,
    size = 24,
    align = 8,
    num_dim = 0,
    dim_size = 8,
    shape_config = 16
);
assert_layout!(
    QnnMemDescriptor,
    size = 48,
    align = 8,
    mem_shape = 0,
    data_type = 24,
    mem_type = 28,
    info = 32
);
assert_layout!(QnnDmaBufInfo, size = 16, align = 8, fd = 0, data = 8);
assert_layout!(
    QnnMemHtpDescriptor,
    size = 32,
    align = 8,
    htp_type = 0,
    size = 8,
    fd = 16,
    offset = 24
);
assert_layout!(QnnConfigEntry, size = 16, align = 8, option = 0, value = 8);
assert_layout!(
    QnnDevicePlatformInfo,
    size = 24,
    align = 8,
    version = 0,
    num_hw_devices = 8,
    hw_devices = 16
);
assert_layout!(
    QnnDeviceHardwareInfo,
    size = 40,
    align = 8,
    version = 0,
    device_id = 8,
    device_type = 12,
    num_cores = 16,
    cores = 24,
    device_info_extension = 32,
);
assert_layout!(
    QnnHtpDeviceInfoExtension,
    size = 32,
    align = 8,
    dev_type = 0,
    vtcm_size_mb = 8,
    soc_model = 16,
    signed_pd_support = 20,
    dlbc_support = 21,
    arch = 24,
);

assert_layout!(
    QnnInterfaceTable,
    size = 568,
    align = 8,
    property_has_capability = 0,
    backend_create = 8,
    backend_get_api_version = 24,
    backend_free = 64,
    context_create_from_binary = 104,
    context_free = 112,
    graph_set_config = 136,
    graph_retrieve = 160,
    graph_execute = 168,
    log_create = 200,
    log_set_log_level = 208,
    log_free = 216,
    mem_register = 280,
    mem_de_register = 288,
    device_get_platform_info = 296,
    device_free_platform_info = 304,
    device_get_infrastructure = 312,
    device_create = 320,
    device_free = 344,
    error_get_message = 384,
    error_get_verbose_message = 392,
    error_free_verbose_message = 400,
    context_create_from_binary_list_async = 448,
    context_free_binary_section_update = 560,
);
assert_layout!(
    QnnInterface,
    size = 608,
    align = 8,
    backend_id = 0,
    provider_name = 8,
    api_version = 16,
    table = 40
);
const _: () = assert!(INTERFACE_TABLE_OFFSET == 40);
const _: () = assert!(size_of::<QnnInterfaceTable>() == 8 * INTERFACE_TABLE_LEN);

assert_layout!(
    QnnSystemInterfaceTable,
    size = 128,
    align = 8,
    system_context_create = 0,
    system_context_get_binary_info = 8,
    system_context_get_meta_data = 16,
    system_context_free = 24,
    rest = 32,
);
assert_layout!(
    QnnSystemInterface,
    size = 160,
    align = 8,
    backend_id = 0,
    provider_name = 8,
    system_api_version = 16,
    table = 32
);
const _: () = assert!(SYSTEM_TABLE_OFFSET == 32);

assert_layout!(
    QnnSystemContextGraphInfoV1,
    size = 40,
    align = 8,
    graph_name = 0,
    num_graph_inputs = 8,
    graph_inputs = 16,
    num_graph_outputs = 24,
    graph_outputs = 32
);
assert_layout!(
    QnnSystemContextGraphInfoV2,
    size = 56,
    align = 8,
    v1 = 0,
    num_updateable_tensors = 40,
    updateable_tensors = 48
);
assert_layout!(
    QnnSystemContextGraphInfoV3,
    size = 80,
    align = 8,
    v2 = 0,
    graph_blob_info_size = 56,
    graph_blob_info = 64,
    start_op_index = 72,
    end_op_index = 76
);
assert_layout!(
    QnnSystemContextGraphInfo,
    size = 88,
    align = 8,
    version = 0,
    u = 8
);
assert_layout!(
    QnnSystemContextBinaryInfoV1,
    size = 128,
    align = 8,
    backend_id = 0,
    build_id = 8,
    core_api_version = 16,
    backend_api_version = 28,
    soc_version = 40,
    hw_info_blob_version = 48,
    context_blob_version = 60,
    hw_info_blob_size = 72,
    hw_info_blob = 80,
    context_blob_size = 88,
    num_context_tensors = 96,
    context_tensors = 104,
    num_graphs = 112,
    graphs = 120
);
assert_layout!(
    QnnSystemContextBinaryInfoV2,
    size = 136,
    align = 8,
    v1 = 0,
    platform_info = 128
);
assert_layout!(
    QnnSystemContextBinaryInfoV3,
    size = 136,
    align = 8,
    backend_id = 0,
    build_id = 8,
    core_api_version = 16,
    backend_api_version = 28,
    soc_version = 40,
    context_blob_version = 48,
    context_blob_size = 64,
    num_context_tensors = 72,
    context_tensors = 80,
    num_graphs = 88,
    graphs = 96,
    platform_info = 104,
    context_metadata_size = 112,
    context_metadata = 120,
    soc_model = 128
);
assert_layout!(
    QnnSystemContextBinaryInfo,
    size = 144,
    align = 8,
    version = 0,
    u = 8
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The same facts at run time, so the test count shows them and a cross build that
    /// skipped const evaluation would still be caught by `cargo test` on target.
    #[test]
    fn tensor_offsets_inside_qnn_tensor_t() {
        let t = QnnTensor::new_v2();
        let base = &t as *const QnnTensor as usize;
        // SAFETY: new_v2 initialises the V2 variant.
        let v2 = unsafe { &t.u.v2 };
        let off = |p: *const u8| p as usize - base;
        assert_eq!(off(&v2.id as *const u32 as *const u8), 8);
        assert_eq!(off(&v2.name as *const _ as *const u8), 16);
        assert_eq!(off(&v2.data_type as *const u32 as *const u8), 32);
        assert_eq!(off(&v2.quantize_params as *const _ as *const u8), 40);
        assert_eq!(off(&v2.rank as *const u32 as *const u8), 80);
        assert_eq!(off(&v2.dimensions as *const _ as *const u8), 88);
        assert_eq!(off(&v2.mem_type as *const u32 as *const u8), 96);
        assert_eq!(off(&v2.mem as *const _ as *const u8), 104);
        assert_eq!(off(&v2.is_dynamic_dimensions as *const _ as *const u8), 120);
        assert_eq!(off(&v2.is_produced as *const u8), 140);
    }

    #[test]
    fn entry_min_minor_follows_revision_history() {
        assert!(ENTRY_MIN_MINOR[..48].iter().all(|&m| m == 10));
        assert_eq!(ENTRY_MIN_MINOR[48], 17);
        assert_eq!(ENTRY_MIN_MINOR[56], 17);
        assert_eq!(ENTRY_MIN_MINOR[59], 18);
        assert_eq!(ENTRY_MIN_MINOR[62], 22);
        assert_eq!(ENTRY_MIN_MINOR[68], 28);
        assert_eq!(ENTRY_MIN_MINOR[70], 32);
    }

    #[test]
    fn dtype_sizes() {
        assert_eq!(dtype::size_of(dtype::FLOAT_32), Some(4));
        assert_eq!(dtype::size_of(dtype::FLOAT_16), Some(2));
        assert_eq!(dtype::size_of(dtype::UFIXED_POINT_16), Some(2));
        assert_eq!(dtype::size_of(dtype::UFIXED_POINT_8), Some(1));
        assert_eq!(dtype::size_of(dtype::SFIXED_POINT_4), Some(1));
        assert_eq!(dtype::size_of(dtype::INT_64), Some(8));
        assert_eq!(dtype::size_of(dtype::UNDEFINED), None);
    }

    #[test]
    fn scale_offset_constructor_sets_encoding() {
        let q = QnnQuantizeParams::scale_offset(0.5, -3);
        assert_eq!(q.encoding_definition, QNN_DEFINITION_DEFINED);
        assert_eq!(q.quantization_encoding, quant_encoding::SCALE_OFFSET);
        // SAFETY: the constructor wrote the scale_offset variant.
        let so = unsafe { q.encoding.scale_offset };
        assert_eq!((so.scale, so.offset), (0.5, -3));
    }
}

// Perf infrastructure (fact sheet §3.7 / §7.1).
assert_layout!(
    QnnHtpDcvsV3,
    size = 64,
    align = 4,
    context_id = 0,
    power_mode = 12,
    sleep_latency = 20,
    bus_voltage_corner_min = 36,
    core_voltage_corner_max = 60
);
const _: () = assert!(size_of::<QnnHtpPowerConfigValue>() == 64);
assert_layout!(
    QnnHtpPowerConfig,
    size = 68,
    align = 4,
    option = 0,
    value = 4
);
assert_layout!(
    QnnHtpPerfInfrastructure,
    size = 32,
    align = 8,
    create_power_config_id = 0,
    destroy_power_config_id = 8,
    set_power_config = 16,
    set_memory_config = 24
);
assert_layout!(
    QnnHtpDeviceInfrastructure,
    size = 40,
    align = 8,
    infra_type = 0,
    perf = 8
);
