//! The system library: `QnnSystemContext_*` with binary info v3 built from our header.

use crate::exec::tensor_specs;
use crate::format;
use crate::knobs;
use crate::registry::{self, Kind};
use qnn_sys::*;
use std::ffi::{c_void, CString};

const E_SYS_INVALID_HANDLE: u64 = 30000;
const E_SYS_INVALID_ARGUMENT: u64 = 30001;
const E_SYS_MALFORMED_BINARY: u64 = 30010;

/// Everything a binary-info answer points into; owned by the system context handle.
#[derive(Default)]
struct InfoStore {
    strings: Vec<CString>,
    dims: Vec<Vec<u32>>,
    tensors: Vec<Vec<QnnTensor>>,
    graphs: Vec<QnnSystemContextGraphInfo>,
    info: Option<Box<QnnSystemContextBinaryInfo>>,
}

#[derive(Default)]
struct SysCtx {
    store: InfoStore,
}

unsafe extern "C" fn create(out: *mut QnnSystemContextHandle) -> QnnErrorHandle {
    if out.is_null() {
        return E_SYS_INVALID_ARGUMENT;
    }
    let p = Box::into_raw(Box::<SysCtx>::default());
    registry::add(p as usize, Kind::SystemContext);
    // SAFETY: checked non-null.
    unsafe { *out = p as QnnSystemContextHandle };
    0
}

unsafe extern "C" fn free(h: QnnSystemContextHandle) -> QnnErrorHandle {
    if !registry::remove(h as usize, Kind::SystemContext) {
        return E_SYS_INVALID_HANDLE;
    }
    // SAFETY: registry-confirmed Box<SysCtx> from `create`.
    drop(unsafe { Box::from_raw(h as *mut SysCtx) });
    0
}

fn build(h: &format::Header, store: &mut InfoStore) -> *const QnnSystemContextBinaryInfo {
    *store = InfoStore::default();
    let specs = tensor_specs(h);
    // Pass 1: own every string and dims array (inner heap buffers never move afterwards).
    for (g, (ins, outs)) in h.graphs.iter().zip(&specs) {
        store
            .strings
            .push(CString::new(g.name.clone()).unwrap_or_default());
        for s in ins.iter().chain(outs) {
            store
                .strings
                .push(CString::new(s.name.clone()).unwrap_or_default());
            store.dims.push(s.dims.clone());
        }
    }
    let mut si = 0;
    let mut di = 0;
    let mut graph_names = Vec::new();
    for (ins, outs) in &specs {
        graph_names.push(store.strings[si].as_ptr());
        si += 1;
        for (list, ttype) in [(ins, tensor_type::APP_WRITE), (outs, tensor_type::APP_READ)] {
            let mut v = Vec::with_capacity(list.len());
            for s in list.iter() {
                let mut t = QnnTensor::new_v2();
                // SAFETY: new_v2 initialised the V2 variant.
                let t2 = unsafe { &mut t.u.v2 };
                t2.id = s.id;
                t2.name = store.strings[si].as_ptr();
                t2.tensor_type = ttype;
                t2.data_type = s.dtype;
                t2.quantize_params = if s.is_quantized() {
                    QnnQuantizeParams::scale_offset(s.scale, s.offset)
                } else {
                    QnnQuantizeParams::default()
                };
                t2.rank = s.dims.len() as u32;
                t2.dimensions = store.dims[di].as_mut_ptr();
                t2.mem_type = mem_type::RAW;
                si += 1;
                di += 1;
                v.push(t);
            }
            store.tensors.push(v);
        }
    }
    for (gi, name) in graph_names.iter().enumerate() {
        let (ins, outs) = (&store.tensors[2 * gi], &store.tensors[2 * gi + 1]);
        store.graphs.push(QnnSystemContextGraphInfo {
            version: GRAPH_INFO_VERSION_3,
            u: QnnSystemContextGraphInfoUnion {
                v3: QnnSystemContextGraphInfoV3 {
                    v2: QnnSystemContextGraphInfoV2 {
                        v1: QnnSystemContextGraphInfoV1 {
                            graph_name: *name,
                            num_graph_inputs: ins.len() as u32,
                            graph_inputs: ins.as_ptr() as *mut QnnTensor,
                            num_graph_outputs: outs.len() as u32,
                            graph_outputs: outs.as_ptr() as *mut QnnTensor,
                        },
                        num_updateable_tensors: 0,
                        updateable_tensors: std::ptr::null_mut(),
                    },
                    graph_blob_info_size: 0,
                    graph_blob_info: std::ptr::null_mut(),
                    start_op_index: 0,
                    end_op_index: 0,
                },
            },
        });
    }
    store
        .strings
        .push(CString::new("qnn-emu v0.1.0").unwrap_or_default());
    let build_id = store
        .strings
        .last()
        .map_or(std::ptr::null(), |s| s.as_ptr());
    store
        .strings
        .push(CString::new(h.dsp_arch.clone()).unwrap_or_default());
    let soc_version = store
        .strings
        .last()
        .map_or(std::ptr::null(), |s| s.as_ptr());
    let info = Box::new(QnnSystemContextBinaryInfo {
        version: BINARY_INFO_VERSION_3,
        u: QnnSystemContextBinaryInfoUnion {
            v3: QnnSystemContextBinaryInfoV3 {
                backend_id: QNN_BACKEND_ID_HTP,
                build_id,
                core_api_version: knobs::get().core_api,
                backend_api_version: QnnVersion {
                    major: 5,
                    minor: 43,
                    patch: 0,
                },
                soc_version,
                context_blob_version: QnnVersion {
                    major: 3,
                    minor: 3,
                    patch: 4,
                },
                context_blob_size: 0,
                num_context_tensors: 0,
                context_tensors: std::ptr::null_mut(),
                num_graphs: store.graphs.len() as u32,
                graphs: store.graphs.as_mut_ptr(),
                platform_info: std::ptr::null_mut(),
                context_metadata_size: 0,
                context_metadata: std::ptr::null_mut(),
                soc_model: h.soc_model,
            },
        },
    });
    let ptr: *const QnnSystemContextBinaryInfo = &*info;
    store.info = Some(info);
    ptr
}

unsafe fn info_common(
    h: QnnSystemContextHandle,
    buf: *const c_void,
    size: u64,
    out: *mut *const QnnSystemContextBinaryInfo,
) -> QnnErrorHandle {
    if !registry::is_live(h as usize, Kind::SystemContext) {
        return E_SYS_INVALID_HANDLE;
    }
    if buf.is_null() || out.is_null() || size == 0 {
        return E_SYS_INVALID_ARGUMENT;
    }
    if let Some(code) = knobs::injected_failure("getBinaryInfo") {
        return code;
    }
    // SAFETY: the caller passes `size` readable bytes.
    let bytes = unsafe { std::slice::from_raw_parts(buf as *const u8, size as usize) };
    let parsed = match format::parse(bytes) {
        Ok(p) => p,
        Err(e) => {
            crate::api::log(
                log_level::ERROR,
                &format!("qnn-emu system: malformed binary: {e}"),
            );
            return E_SYS_MALFORMED_BINARY;
        }
    };
    // SAFETY: registry-confirmed live SysCtx; the API forbids concurrent use of one handle.
    let ctx = unsafe { &mut *(h as *mut SysCtx) };
    let p = build(&parsed.header, &mut ctx.store);
    // SAFETY: checked non-null.
    unsafe { *out = p };
    0
}

unsafe extern "C" fn get_binary_info(
    h: QnnSystemContextHandle,
    buf: *mut c_void,
    size: u64,
    out: *mut *const QnnSystemContextBinaryInfo,
    out_size: *mut QnnContextBinarySize,
) -> QnnErrorHandle {
    // SAFETY: forwarded arguments, same contract.
    let r = unsafe { info_common(h, buf, size, out) };
    if r == 0 && !out_size.is_null() {
        // SAFETY: checked non-null.
        unsafe { *out_size = std::mem::size_of::<QnnSystemContextBinaryInfo>() as u64 };
    }
    r
}

unsafe extern "C" fn get_meta_data(
    h: QnnSystemContextHandle,
    buf: *const c_void,
    size: u64,
    out: *mut *const QnnSystemContextBinaryInfo,
) -> QnnErrorHandle {
    // SAFETY: forwarded arguments, same contract.
    unsafe { info_common(h, buf, size, out) }
}

pub fn table() -> QnnSystemInterfaceTable {
    let mut t = QnnSystemInterfaceTable::empty();
    t.system_context_create = Some(create);
    t.system_context_get_binary_info = Some(get_binary_info);
    t.system_context_get_meta_data = Some(get_meta_data);
    t.system_context_free = Some(free);
    t
}
