//! Reading context-binary metadata through libQnnSystem and deep-copying it.

use super::check;
use super::runtime::Runtime;
use crate::error::{Error, Result};
use crate::ops::convert::Quant;
use qnn_sys::*;
use std::ffi::CStr;
use std::path::Path;

/// One graph input or output as the binary describes it.
#[derive(Debug, Clone)]
pub struct TensorDesc {
    pub id: u32,
    pub name: String,
    pub tensor_type: u32,
    pub dtype: u32,
    pub dims: Vec<u32>,
    /// Per-tensor scale/offset for fixed-point tensors.
    pub quant: Option<Quant>,
    /// The quantize params exactly as read, echoed back at execute.
    pub raw_quant: QnnQuantizeParams,
}

// SAFETY: `raw_quant` is either default (no pointers) or a per-tensor SCALE_OFFSET
// encoding, whose union member holds plain numbers; no pointer in it is ever dereferenced
// by qhx, and the descriptor owns everything else. So moving or sharing it across threads
// is sound.
unsafe impl Send for TensorDesc {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for TensorDesc {}

impl TensorDesc {
    pub fn elems(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }
    pub fn bytes(&self) -> usize {
        self.elems() * dtype::size_of(self.dtype).unwrap_or(0)
    }
    /// "name [d0, d1] FLOAT_16", for messages.
    pub fn describe(&self) -> String {
        format!("{} {:?} {}", self.name, self.dims, dtype::name(self.dtype))
    }
}

#[derive(Debug, Clone)]
pub struct GraphDesc {
    pub name: String,
    pub inputs: Vec<TensorDesc>,
    pub outputs: Vec<TensorDesc>,
    /// Tensor struct version the library used (1 or 2); execute tensors mirror it.
    pub tensor_version: u32,
}

#[derive(Debug, Clone)]
pub struct BinaryInfo {
    pub graphs: Vec<GraphDesc>,
    pub soc_model: Option<u32>,
    pub build_id: String,
    pub core_api: QnnVersion,
}

/// Pick the stride of a library-owned array: the first candidate at which the next
/// element's version tag looks valid. The library's struct size is not known up front.
///
/// # Safety
/// `base` must point to at least `n` elements of the library's (unknown) stride, the
/// largest candidate included when `n > 1`.
unsafe fn guess_stride(
    base: *const u8,
    n: usize,
    candidates: &[usize],
    valid: impl Fn(u32) -> bool,
) -> usize {
    if n < 2 {
        return candidates[0];
    }
    for &s in candidates {
        // SAFETY: element 1 exists at offset `s` for the true stride; for a smaller wrong
        // candidate we still read inside element 0 or 1, which the caller guarantees.
        let v = unsafe { std::ptr::read_unaligned(base.add(s) as *const u32) };
        if valid(v) {
            return s;
        }
    }
    candidates[0]
}

/// # Safety
/// `p` must be null or a NUL-terminated string.
unsafe fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: per the contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// # Safety
/// `base` must point to `n` library-owned tensors of the library's stride.
unsafe fn copy_tensors(
    base: *const QnnTensor,
    n: u32,
    graph: &str,
    bin: &Path,
) -> Result<(Vec<TensorDesc>, u32)> {
    let mut out = Vec::with_capacity(n as usize);
    if n == 0 {
        return Ok((out, 2));
    }
    if base.is_null() {
        return Err(Error::File {
            path: bin.to_path_buf(),
            msg: format!("graph {graph}: binary info lists {n} tensors but no array"),
        });
    }
    // SAFETY: array of n tensors; the true stride is 144 (V2-era) or 120 (API 2.10 era).
    let stride = unsafe {
        guess_stride(base as *const u8, n as usize, &[144, 120], |v| {
            v == 1 || v == 2
        })
    };
    let mut version = 2;
    for i in 0..n as usize {
        // SAFETY: element i of the library's array.
        let t = unsafe { &*((base as *const u8).add(i * stride) as *const QnnTensor) };
        if t.version != QNN_TENSOR_VERSION_1 && t.version != QNN_TENSOR_VERSION_2 {
            return Err(Error::File {
                path: bin.to_path_buf(),
                msg: format!(
                    "graph {graph}: tensor {i} has unknown struct version {}",
                    t.version
                ),
            });
        }
        version = t.version;
        // SAFETY: version checked; V1 is the common prefix of both variants.
        let c = unsafe { t.common() };
        let dims = if c.rank == 0 || c.dimensions.is_null() {
            Vec::new()
        } else {
            // SAFETY: `dimensions` holds `rank` entries owned by the system context.
            unsafe { std::slice::from_raw_parts(c.dimensions, c.rank as usize) }.to_vec()
        };
        let quant = if c.quantize_params.encoding_definition == QNN_DEFINITION_DEFINED
            && c.quantize_params.quantization_encoding == quant_encoding::SCALE_OFFSET
        {
            // SAFETY: the encoding tag says the scale_offset member is the live one.
            let so = unsafe { c.quantize_params.encoding.scale_offset };
            Some(Quant {
                scale: so.scale,
                offset: so.offset,
            })
        } else {
            None
        };
        out.push(TensorDesc {
            id: c.id,
            // SAFETY: tensor names are NUL-terminated strings owned by the system context.
            name: unsafe { cstr(c.name) },
            tensor_type: c.tensor_type,
            dtype: c.data_type,
            dims,
            quant,
            raw_quant: if quant.is_some() {
                c.quantize_params
            } else {
                QnnQuantizeParams::default()
            },
        });
    }
    Ok((out, version))
}

/// Read graph names and I/O descriptors of a context binary with the system library.
pub fn read_binary_info(rt: &Runtime, bytes: &[u8], bin: &Path) -> Result<BinaryInfo> {
    read_binary_info_with(rt.system(), bytes, bin)
}

/// [`read_binary_info`] with the system library alone (no backend, device or log), e.g. to
/// inspect a bundle on a host that has only libQnnSystem.
pub fn read_binary_info_with(
    sys_lib: &SystemLibrary,
    bytes: &[u8],
    bin: &Path,
) -> Result<BinaryInfo> {
    let t = &sys_lib.table;
    let step = || format!("reading binary info of {}", bin.display());
    let (Some(create), Some(free)) = (t.system_context_create, t.system_context_free) else {
        return Err(Error::MissingEntry {
            step: step(),
            entry: "systemContextCreate/systemContextFree",
        });
    };
    let mut sys: QnnSystemContextHandle = std::ptr::null_mut();
    // SAFETY: out-param to a live local.
    check(unsafe { create(&mut sys) }, step)?;
    struct Guard(QnnSystemContextHandle, SystemContextFreeFn);
    impl Drop for Guard {
        fn drop(&mut self) {
            // SAFETY: the handle came from systemContextCreate and is freed once.
            let _ = unsafe { (self.1)(self.0) };
        }
    }
    let _guard = Guard(sys, free);
    let mut info: *const QnnSystemContextBinaryInfo = std::ptr::null();
    let status = if let Some(get) = t.system_context_get_meta_data {
        // SAFETY: bytes is readable for its length; out-param to a live local.
        unsafe {
            get(
                sys,
                bytes.as_ptr() as *const _,
                bytes.len() as u64,
                &mut info,
            )
        }
    } else if let Some(get) = t.system_context_get_binary_info {
        let mut size = 0u64;
        // The deprecated entry takes a mutable pointer but does not write through it.
        // SAFETY: as above.
        unsafe {
            get(
                sys,
                bytes.as_ptr() as *mut _,
                bytes.len() as u64,
                &mut info,
                &mut size,
            )
        }
    } else {
        return Err(Error::MissingEntry {
            step: step(),
            entry: "systemContextGetMetaData",
        });
    };
    check(status, step)?;
    if info.is_null() {
        return Err(Error::File {
            path: bin.to_path_buf(),
            msg: "system library returned no binary info".into(),
        });
    }
    // SAFETY: a non-null info points to a BinaryInfo owned by `sys`, alive until the guard.
    let info = unsafe { &*info };
    // SAFETY: (each arm) the version tag selects the live union member.
    let (num_graphs, graphs, soc_model, build_id, core_api) = unsafe {
        match info.version {
            BINARY_INFO_VERSION_1 | BINARY_INFO_VERSION_2 => {
                let v = &info.u.v1;
                (
                    v.num_graphs,
                    v.graphs,
                    None,
                    cstr(v.build_id),
                    v.core_api_version,
                )
            }
            BINARY_INFO_VERSION_3 => {
                let v = &info.u.v3;
                (
                    v.num_graphs,
                    v.graphs,
                    Some(v.soc_model),
                    cstr(v.build_id),
                    v.core_api_version,
                )
            }
            other => {
                return Err(Error::File {
                    path: bin.to_path_buf(),
                    msg: format!("unknown binary info version {other}"),
                })
            }
        }
    };
    if num_graphs == 0 || graphs.is_null() {
        return Err(Error::File {
            path: bin.to_path_buf(),
            msg: "context binary contains no graphs".into(),
        });
    }
    // SAFETY: array of num_graphs graph infos; stride 88 (V3-era), 64 or 48.
    let stride = unsafe {
        guess_stride(
            graphs as *const u8,
            num_graphs as usize,
            &[88, 64, 48],
            |v| (1..=3).contains(&v),
        )
    };
    let mut out = Vec::new();
    for i in 0..num_graphs as usize {
        // SAFETY: element i of the library's array.
        let g = unsafe {
            &*((graphs as *const u8).add(i * stride) as *const QnnSystemContextGraphInfo)
        };
        if !(1..=3).contains(&g.version) {
            return Err(Error::File {
                path: bin.to_path_buf(),
                msg: format!("graph {i} has unknown graph info version {}", g.version),
            });
        }
        // SAFETY: the first five fields are common to V1, V2 and V3.
        let v1 = unsafe { g.u.v1 };
        // SAFETY: graph names are NUL-terminated strings owned by `sys`.
        let name = unsafe { cstr(v1.graph_name) };
        // SAFETY: arrays of the stated lengths owned by `sys`.
        let (inputs, vi) =
            unsafe { copy_tensors(v1.graph_inputs, v1.num_graph_inputs, &name, bin)? };
        // SAFETY: as above.
        let (outputs, vo) =
            unsafe { copy_tensors(v1.graph_outputs, v1.num_graph_outputs, &name, bin)? };
        out.push(GraphDesc {
            name,
            inputs,
            outputs,
            tensor_version: vi.min(vo),
        });
    }
    Ok(BinaryInfo {
        graphs: out,
        soc_model,
        build_id,
        core_api,
    })
}
