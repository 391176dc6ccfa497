//! Reading context-binary metadata through libQnnSystem and deep-copying it.

use super::runtime::Runtime;
use super::status::check;
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
    /// The graph's weight bytes, when the binary records them (HTP, QAIRT 2.4x).
    pub weights: Option<WeightBytes>,
}

/// A graph's constant bytes as its HTP graph blob records them: its own and those it
/// shares with the other graphs of the binary (weight sharing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WeightBytes {
    pub own: u64,
    pub shared: u64,
}

impl BinaryInfo {
    /// Bytes of weights the binary's graphs share (the largest any graph records; 0 when
    /// none is shared or the binary does not say).
    pub fn shared_weight_bytes(&self) -> u64 {
        self.graphs
            .iter()
            .filter_map(|g| g.weights)
            .map(|w| w.shared)
            .max()
            .unwrap_or(0)
    }
}

/// Refuse, before any context is created, a binary this host's backend cannot load: on
/// x86_64 the HTP library is the simulator, and its QAIRT 2.51 build fails to create a
/// context whose graphs share weights ("Shared weights buffer isn't supported on this
/// platform") and then crashes cleaning up. Devices load such binaries.
pub fn check_loadable(info: &BinaryInfo, bin: &Path) -> Result<()> {
    let shared = info.shared_weight_bytes();
    if cfg!(target_arch = "x86_64") && shared > 0 {
        return Err(Error::File {
            path: bin.to_path_buf(),
            msg: format!(
                "its {} graphs share {:.1} MB of weights, which the x86_64 HTP simulator cannot load (a phone can); export with --no-weight-sharing to run the bundle here",
                info.graphs.len(),
                shared as f64 / 1e6
            ),
        });
    }
    Ok(())
}

/// The HTP graph blob of a GraphInfo V3, as QAIRT 2.51 writes it (seen in its binaries,
/// not in a header): 112 bytes, the V1 member (version 1, 40 bytes) followed by a V2
/// record (version u32 @40; ..., constSize u64 @88, ddrTensorSize @96, sharedWeightsSize
/// @104). Shorter or other blobs record no weight bytes.
fn blob_weights(blob: &[u8]) -> Option<WeightBytes> {
    let u64_at = |o: usize| Some(u64::from_le_bytes(blob.get(o..o + 8)?.try_into().ok()?));
    if blob.len() < 112 || u32_at(blob, 40)? != 2 {
        return None;
    }
    Some(WeightBytes {
        own: u64_at(88)?,
        shared: u64_at(104)?,
    })
}

#[derive(Debug, Clone)]
pub struct BinaryInfo {
    pub graphs: Vec<GraphDesc>,
    pub soc_model: Option<u32>,
    pub build_id: String,
    pub core_api: QnnVersion,
}

/// Sizes `Qnn_Tensor_t` has had: 120 (API 2.10 era, V1 only), 144 (with V2).
const TENSOR_SIZES: [usize; 2] = [120, 144];
/// Sizes `QnnSystemContext_GraphInfo_t` has had: 48 (V1 only), 64 (V2), 88 (V3).
const GRAPH_INFO_SIZES: [usize; 3] = [48, 64, 88];
/// No pointer the library hands out lies in the first page.
const MIN_POINTER: u64 = 4096;
/// More inputs or outputs than any graph has: a count above it is not a count.
const MAX_IO: u32 = 1 << 16;

/// The stride of a library-owned array of `n` structs whose size (one of `candidates`,
/// smallest first) the library chose, not us.
///
/// `region` is the first `n * candidates[0]` bytes of the array: all that is readable
/// whatever the true size. A candidate below `min_size` (what the first element's version
/// tag requires) is skipped; a candidate is taken when every later element that starts
/// inside `region` passes `plausible` (given that element's bytes up to the region's end),
/// smallest first. Smallest first because a too-small stride lands inside element 0's
/// newer fields, which libraries leave zero / NULL, while a too-large one lands on an older
/// element's small integers (a tensor type of 1 reads as a version tag). None when no
/// candidate fits: the array is not what the library's version says it is.
fn guess_stride(
    region: &[u8],
    n: usize,
    candidates: &[usize],
    min_size: usize,
    plausible: impl Fn(&[u8]) -> bool,
) -> Option<usize> {
    let first = candidates.iter().copied().find(|&s| s >= min_size)?;
    if n < 2 {
        return Some(first);
    }
    candidates
        .iter()
        .copied()
        .filter(|&s| s >= min_size)
        .find(|&s| {
            (1..n)
                .map(|i| i * s)
                .take_while(|&at| at < region.len())
                .all(|at| plausible(&region[at..]))
        })
}

/// The stride of a library's `Qnn_Tensor_t` array of `n` elements (`region`: its first
/// `n * 120` bytes).
fn tensor_stride(region: &[u8], n: usize) -> Option<usize> {
    // A V2 tensor means a library whose Qnn_Tensor_t has the V2 member (144 bytes).
    let min = if u32_at(region, 0) == Some(QNN_TENSOR_VERSION_2) {
        TENSOR_SIZES[1]
    } else {
        0
    };
    guess_stride(region, n, &TENSOR_SIZES, min, tensor_plausible)
}

/// The stride of a library's `QnnSystemContext_GraphInfo_t` array of `n` elements
/// (`region`: its first `n * 48` bytes), from a binary info of version `bin_version`.
fn graph_info_stride(region: &[u8], n: usize, bin_version: u32) -> Option<usize> {
    // A library that writes binary info V3 or a V2 / V3 graph info has that member in its
    // GraphInfo union (BinaryInfo V3 and GraphInfo V3 came in together, API 2.21).
    let min = match (bin_version, u32_at(region, 0)) {
        (BINARY_INFO_VERSION_3, _) | (_, Some(3)) => GRAPH_INFO_SIZES[2],
        (_, Some(2)) => GRAPH_INFO_SIZES[1],
        _ => 0,
    };
    guess_stride(region, n, &GRAPH_INFO_SIZES, min, graph_info_plausible)
}

/// A little-endian (native) u32 / u64 at `at` of `w`, when `w` holds it.
fn u32_at(w: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(w.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(w: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(w.get(at..at + 8)?.try_into().ok()?))
}

/// A pointer field: NULL or a real address (not a small integer read as one).
fn pointer_ok(p: Option<u64>, required: bool) -> bool {
    p.is_none_or(|p| p >= MIN_POINTER || (!required && p == 0))
}

/// Whether the bytes at `w` (up to the readable end) look like a `Qnn_Tensor_t`: version
/// 1 or 2, a name, a tensor type QNN defines, a data type of QNN's numbering, a small rank
/// with dimensions.
/// Fields past the end of `w` are not judged.
fn tensor_plausible(w: &[u8]) -> bool {
    let version_ok = u32_at(w, 0).is_some_and(|v| v == 1 || v == 2);
    let type_ok = u32_at(w, 24).is_none_or(|t| t <= tensor_type::OPTIONAL_APP_READWRITE);
    // Data types are 0xCCBB: class CC (0 int .. 6 string), bit-width code BB (never 0); the
    // test is that loose so data types newer than this build still pass.
    let dtype_ok =
        u32_at(w, 32).is_none_or(|d| d == dtype::UNDEFINED || (d <= 0x06FF && d & 0xFF != 0));
    let rank = u32_at(w, 80);
    let rank_ok = rank.is_none_or(|r| r <= 16);
    let dims_ok = pointer_ok(u64_at(w, 88), rank.is_some_and(|r| r > 0));
    version_ok && pointer_ok(u64_at(w, 16), true) && type_ok && dtype_ok && rank_ok && dims_ok
}

/// Whether the bytes at `w` look like a `QnnSystemContext_GraphInfo_t`: version 1 to 3, a
/// name, input and output counts with their arrays, and at least one output.
fn graph_info_plausible(w: &[u8]) -> bool {
    let version_ok = u32_at(w, 0).is_some_and(|v| (1..=3).contains(&v));
    let n_in = u32_at(w, 16);
    let n_out = u32_at(w, 32);
    version_ok
        && pointer_ok(u64_at(w, 8), true)
        && n_in.is_none_or(|n| n <= MAX_IO)
        && pointer_ok(u64_at(w, 24), n_in.is_some_and(|n| n > 0))
        && n_out.is_none_or(|n| (1..=MAX_IO).contains(&n))
        && pointer_ok(u64_at(w, 40), true)
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
    // SAFETY: an array of n tensors of at least the smallest size ever, owned by the system
    // context and alive for this call.
    let region =
        unsafe { std::slice::from_raw_parts(base as *const u8, n as usize * TENSOR_SIZES[0]) };
    let stride = tensor_stride(region, n as usize).ok_or_else(|| Error::File {
            path: bin.to_path_buf(),
            msg: format!(
                "graph {graph}: the tensor array fits no Qnn_Tensor_t size of {TENSOR_SIZES:?} bytes (a libQnnSystem of another SDK than the binary?)"
            ),
        })?;
    // SAFETY: the whole array, now that its stride is known.
    let region = unsafe { std::slice::from_raw_parts(base as *const u8, n as usize * stride) };
    let mut version = 2;
    for i in 0..n as usize {
        // Only the version tag and the V1 member are read: a 120-byte element is shorter
        // than our QnnTensor.
        let at = i * stride;
        let v = u32_at(region, at).unwrap_or(0);
        if v != QNN_TENSOR_VERSION_1 && v != QNN_TENSOR_VERSION_2 {
            return Err(Error::File {
                path: bin.to_path_buf(),
                msg: format!("graph {graph}: tensor {i} has unknown struct version {v}"),
            });
        }
        version = v;
        let v1_at = at + std::mem::offset_of!(QnnTensor, u);
        // SAFETY: element i starts at `at` in the library's array (stride checked above); its
        // union holds the V1 member (the common prefix of V1 and V2, 112 bytes, inside even a
        // 120-byte element), at the union's offset, aligned as the array is.
        let c = unsafe { &*((base as *const u8).add(v1_at) as *const QnnTensorV1) };
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
    let bin_version = info.version;
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
    // SAFETY: an array of num_graphs graph infos of at least the smallest size ever, owned
    // by `sys` and alive until the guard.
    let region = unsafe {
        std::slice::from_raw_parts(
            graphs as *const u8,
            num_graphs as usize * GRAPH_INFO_SIZES[0],
        )
    };
    let stride = graph_info_stride(region, num_graphs as usize, bin_version).ok_or_else(|| Error::File {
        path: bin.to_path_buf(),
        msg: format!(
            "the graph info array fits no QnnSystemContext_GraphInfo_t size of {GRAPH_INFO_SIZES:?} bytes (a libQnnSystem of another SDK than the binary?)"
        ),
    })?;
    // SAFETY: the whole array, now that its stride is known.
    let region =
        unsafe { std::slice::from_raw_parts(graphs as *const u8, num_graphs as usize * stride) };
    let mut out = Vec::new();
    for i in 0..num_graphs as usize {
        // Only the version tag and the V1 member are read: a 48-byte element is shorter
        // than our QnnSystemContextGraphInfo.
        let at = i * stride;
        let v = u32_at(region, at).unwrap_or(0);
        if !(1..=3).contains(&v) {
            return Err(Error::File {
                path: bin.to_path_buf(),
                msg: format!("graph {i} has unknown graph info version {v}"),
            });
        }
        let v1_at = at + std::mem::offset_of!(QnnSystemContextGraphInfo, u);
        // SAFETY: element i starts at `at` (stride checked above); the first five fields,
        // the V1 member, are common to V1, V2 and V3 and fit in even a 48-byte element.
        let v1 =
            unsafe { *((graphs as *const u8).add(v1_at) as *const QnnSystemContextGraphInfoV1) };
        // SAFETY: graph names are NUL-terminated strings owned by `sys`.
        let name = unsafe { cstr(v1.graph_name) };
        // SAFETY: arrays of the stated lengths owned by `sys`.
        let (inputs, vi) =
            unsafe { copy_tensors(v1.graph_inputs, v1.num_graph_inputs, &name, bin)? };
        // SAFETY: as above.
        let (outputs, vo) =
            unsafe { copy_tensors(v1.graph_outputs, v1.num_graph_outputs, &name, bin)? };
        let weights = if v == 3 && stride == GRAPH_INFO_SIZES[2] {
            let v3_at = at + std::mem::offset_of!(QnnSystemContextGraphInfo, u);
            // SAFETY: a V3 element of the full 88-byte stride: its V3 member is readable.
            let v3 = unsafe {
                *((graphs as *const u8).add(v3_at) as *const QnnSystemContextGraphInfoV3)
            };
            let n = v3.graph_blob_info_size as usize;
            if v3.graph_blob_info.is_null() || n == 0 || n > 4096 {
                None
            } else {
                // SAFETY: the library's blob of the size it states, owned by `sys`.
                let blob =
                    unsafe { std::slice::from_raw_parts(v3.graph_blob_info as *const u8, n) };
                blob_weights(blob)
            }
        } else {
            None
        };
        out.push(GraphDesc {
            name,
            inputs,
            outputs,
            tensor_version: vi.min(vo),
            weights,
        });
    }
    Ok(BinaryInfo {
        graphs: out,
        soc_model,
        build_id,
        core_api,
    })
}

/// `FLOAT_16` → `f16`, `UFIXED_POINT_16` → `ufixed16`: the short form for tables.
pub fn short_dtype(qnn_name: &str) -> String {
    let n = qnn_name.to_lowercase().replace("_point", "");
    match n.strip_prefix("float_") {
        Some(bits) => format!("f{bits}"),
        None => n.replace('_', ""),
    }
}

#[cfg(test)]
mod tests {
    //! `guess_stride` on synthetic binary-info arrays of every struct size QNN has used, with
    //! the field values that fooled the version-tag probe (review of 560418f).
    use super::*;

    /// The 112-byte blob of a graph of a weight-shared QAIRT 2.51 binary (three graphs, two
    /// 1024x1024 fp16 MatMuls): no weights of its own, 4 MiB + 4 KiB shared; and of the same
    /// graph compiled alone: the same bytes its own.
    #[test]
    fn reads_weight_bytes_from_the_htp_graph_blob() {
        let words = |w: &[u64]| -> Vec<u8> { w.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let shared = words(&[
            1, 0, 0x400000, 0, 0, 2, 0x100, 0x40, 0, 0x4000, 0x4400, 0, 0, 0x401000,
        ]);
        let alone = words(&[
            1, 0, 0x400000, 0, 0, 2, 0x100, 0x40, 0, 0x4000, 0x4400, 0x402000, 0, 0,
        ]);
        let w = |own, shared| Some(WeightBytes { own, shared });
        assert_eq!(blob_weights(&shared), w(0, 0x401000));
        assert_eq!(blob_weights(&alone), w(0x402000, 0));
        // A V1-only blob (40 bytes) or another record after it says nothing.
        assert_eq!(blob_weights(&shared[..40]), None);
        let mut other = shared.clone();
        other[40] = 3;
        assert_eq!(blob_weights(&other), None);
    }

    #[test]
    fn short_dtype_names() {
        assert_eq!(short_dtype("FLOAT_16"), "f16");
        assert_eq!(short_dtype("UFIXED_POINT_16"), "ufixed16");
    }

    const NAME: u64 = 0x7f12_3456_0000;
    const ARRAY: u64 = 0x7f12_3460_0000;

    fn put32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }
    fn put64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }

    /// One `Qnn_Tensor_t` of `size` bytes (120: V1-only library, 144: with V2).
    fn tensor(size: usize, version: u32, ttype: u32, dt: u32, quantized: bool, k: u64) -> Vec<u8> {
        let mut b = vec![0u8; size];
        put32(&mut b, 0, version);
        put32(&mut b, 8, 1000 + k as u32);
        put64(&mut b, 16, NAME + 64 * k);
        put32(&mut b, 24, ttype);
        put32(&mut b, 32, dt);
        if quantized {
            put32(&mut b, 40, QNN_DEFINITION_DEFINED);
            put32(&mut b, 44, quant_encoding::SCALE_OFFSET);
            b[48..52].copy_from_slice(&0.01f32.to_ne_bytes());
            put32(&mut b, 52, (-32768i32) as u32);
        } else {
            put32(&mut b, 40, 0x7FFF_FFFF);
            put32(&mut b, 44, 0x7FFF_FFFF);
        }
        put32(&mut b, 80, 2);
        put64(&mut b, 88, ARRAY + 64 * k);
        if size == 144 {
            // isDynamicDimensions NULL, dense sparse params, isProduced set.
            b[140] = 1;
        }
        b
    }

    /// One graph info of `size` bytes (48: V1-only, 64: V2, 88: V3 library).
    fn graph_info(size: usize, version: u32, n_in: u32, n_out: u32, k: u64) -> Vec<u8> {
        let mut b = vec![0u8; size];
        put32(&mut b, 0, version);
        put64(&mut b, 8, NAME + 64 * k);
        put32(&mut b, 16, n_in);
        put64(&mut b, 24, ARRAY + 0x1000 * k);
        put32(&mut b, 32, n_out);
        put64(&mut b, 40, ARRAY + 0x1000 * k + 0x800);
        if size == 88 && version == 3 {
            put32(&mut b, 64, 40);
            put64(&mut b, 72, ARRAY + 0x10_0000);
            put32(&mut b, 84, 120);
        }
        b
    }

    fn tensors(size: usize, elems: &[(u32, u32, u32, bool)]) -> Option<usize> {
        let blob: Vec<u8> = elems
            .iter()
            .enumerate()
            .flat_map(|(k, &(v, t, d, q))| tensor(size, v, t, d, q, k as u64))
            .collect();
        let n = elems.len();
        tensor_stride(&blob[..n * TENSOR_SIZES[0]], n)
    }

    fn graphs(size: usize, bin_version: u32, elems: &[(u32, u32, u32)]) -> Option<usize> {
        let blob: Vec<u8> = elems
            .iter()
            .enumerate()
            .flat_map(|(k, &(v, i, o))| graph_info(size, v, i, o, k as u64))
            .collect();
        let n = elems.len();
        graph_info_stride(&blob[..n * GRAPH_INFO_SIZES[0]], n, bin_version)
    }

    #[test]
    fn tensor_arrays_of_120_bytes_are_not_read_at_144() {
        use tensor_type::{APP_READ, APP_WRITE};
        let (f32_, u16_) = (dtype::FLOAT_32, dtype::UFIXED_POINT_16);
        // Element 1 is an APP_READ (= 1) output: at offset 144 its type reads as version 1.
        for e1 in [
            (1, APP_READ, f32_, false),
            (1, APP_READ, u16_, true),
            (1, APP_WRITE, u16_, true),
        ] {
            assert_eq!(
                tensors(120, &[(1, APP_READ, f32_, false), e1]),
                Some(120),
                "{e1:?}"
            );
            assert_eq!(
                tensors(120, &[(1, APP_WRITE, u16_, true), e1, e1, e1]),
                Some(120),
                "{e1:?}"
            );
        }
    }

    #[test]
    fn tensor_arrays_of_144_bytes_are_read_at_144() {
        use tensor_type::{APP_READ, APP_WRITE};
        let f16_ = dtype::FLOAT_16;
        for v in [1, 2] {
            let e = (v, APP_READ, f16_, false);
            assert_eq!(tensors(144, &[e, e]), Some(144));
            assert_eq!(tensors(144, &[(v, APP_WRITE, f16_, true), e, e]), Some(144));
        }
        assert_eq!(tensors(144, &[(2, APP_READ, f16_, false)]), Some(144));
    }

    #[test]
    fn graph_info_arrays_of_48_and_64_bytes_are_not_read_at_a_larger_size() {
        // A 48-byte array: offset 64 is element 1's numGraphInputs, 1 to 3 reads as a
        // version; offset 88 its outputs pointer.
        for n_in in [1, 2, 3] {
            let e1 = (1, n_in, 1);
            assert_eq!(graphs(48, 1, &[(1, 5, 3), e1]), Some(48), "{n_in}");
            assert_eq!(graphs(48, 1, &[(1, 5, 3), e1, e1]), Some(48), "{n_in}");
            let e1 = (2, n_in, 1);
            assert_eq!(graphs(64, 2, &[(2, 5, 3), e1]), Some(64), "{n_in}");
            assert_eq!(
                graphs(64, 1, &[(1, 5, 3), (1, n_in, 2), e1]),
                Some(64),
                "{n_in}"
            );
        }
    }

    #[test]
    fn graph_info_arrays_of_88_bytes_are_read_at_88() {
        assert_eq!(graphs(88, 3, &[(3, 5, 3), (3, 1, 1)]), Some(88));
        // A V3-era library writing V1 graph infos (the tail left zero).
        assert_eq!(graphs(88, 1, &[(1, 5, 3), (1, 2, 1)]), Some(88));
        assert_eq!(graphs(88, 3, &[(1, 5, 3), (1, 2, 1), (1, 3, 1)]), Some(88));
        assert_eq!(graphs(88, 3, &[(3, 5, 3)]), Some(88));
    }

    #[test]
    fn arrays_that_fit_no_size_are_refused() {
        // Element 1 with a bad version at every stride.
        let mut blob = graph_info(48, 1, 2, 1, 0);
        blob.extend(vec![0xEEu8; 48]);
        assert_eq!(graph_info_stride(&blob, 2, 1), None);
        let mut blob = tensor(120, 1, 0, dtype::FLOAT_32, false, 0);
        blob.extend(vec![0xEEu8; 120]);
        assert_eq!(tensor_stride(&blob, 2), None);
    }
}
