//! Host tensor buffers and persistent graph bindings.
//!
//! A [`Binding`] owns one 8-byte-aligned buffer per graph input and output plus the
//! `Qnn_Tensor_t` array that points at them. It is built once; a step only rewrites bytes
//! inside the buffers, never the tensor structs.

use super::binary::{GraphDesc, TensorDesc};
use super::context::{Context, Graph};
use super::runtime::Runtime;
use super::status::check;
use crate::error::{Error, Result};
use crate::ops::convert::{Quant, Typed, TypedMut};
use qnn_sys::{dtype, mem_type, QnnTensor, QNN_TENSOR_VERSION_1, QNN_TENSOR_VERSION_2};
use std::ffi::CString;
use std::sync::Arc;

/// Where a buffer's bytes live.
enum Storage {
    /// Process heap, passed to QNN as a client buffer.
    Heap(Vec<u64>),
    /// An rpcmem allocation (shared with the DSP), freed through its runtime.
    Rpc {
        ptr: *mut u8,
        fd: i32,
        rt: Arc<Runtime>,
    },
}

/// An 8-byte aligned, zero-initialised byte buffer.
pub struct HostBuf {
    storage: Storage,
    bytes: usize,
}

// SAFETY: an rpcmem buffer is plain memory owned by this value alone.
unsafe impl Send for HostBuf {}

impl Drop for HostBuf {
    fn drop(&mut self) {
        if let Storage::Rpc { ptr, rt, .. } = &self.storage {
            if let Some(r) = &rt.rpcmem {
                // SAFETY: allocated by this library in `HostBuf::rpc`; freed once, after the
                // owning binding deregistered it.
                unsafe { r.free(*ptr) };
            }
        }
    }
}

impl HostBuf {
    pub fn zeroed(bytes: usize) -> Self {
        HostBuf {
            storage: Storage::Heap(vec![0u64; bytes.div_ceil(8)]),
            bytes,
        }
    }

    /// A zeroed rpcmem buffer, or None when the allocator refuses.
    fn rpc(rt: &Arc<Runtime>, bytes: usize) -> Option<Self> {
        let (ptr, fd) = rt.rpcmem.as_ref()?.alloc(bytes)?;
        Some(HostBuf {
            storage: Storage::Rpc {
                ptr,
                fd,
                rt: rt.clone(),
            },
            bytes,
        })
    }

    fn base(&self) -> *const u8 {
        match &self.storage {
            Storage::Heap(w) => w.as_ptr() as *const u8,
            Storage::Rpc { ptr, .. } => *ptr,
        }
    }

    fn base_mut(&mut self) -> *mut u8 {
        match &mut self.storage {
            Storage::Heap(w) => w.as_mut_ptr() as *mut u8,
            Storage::Rpc { ptr, .. } => *ptr,
        }
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: the storage holds at least `bytes` initialised bytes (heap: zeroed Vec;
        // rpcmem: zeroed at allocation); u8 has no alignment or validity requirements.
        unsafe { std::slice::from_raw_parts(self.base(), self.bytes) }
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, with unique access through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.base_mut(), self.bytes) }
    }

    fn ptr(&mut self) -> *mut u8 {
        self.base_mut()
    }

    /// View as a slice of `T` (whole elements only; the storage is 8-byte aligned).
    fn cast<T: bytemuck::Pod>(&self) -> &[T] {
        let n = self.bytes / std::mem::size_of::<T>() * std::mem::size_of::<T>();
        bytemuck::cast_slice(&self.as_bytes()[..n])
    }

    fn cast_mut<T: bytemuck::Pod>(&mut self) -> &mut [T] {
        let n = self.bytes / std::mem::size_of::<T>() * std::mem::size_of::<T>();
        bytemuck::cast_slice_mut(&mut self.as_bytes_mut()[..n])
    }

    /// A typed view for a tensor of `desc`'s dtype; None for unsupported dtypes.
    pub fn typed_mut(&mut self, desc: &TensorDesc) -> Option<TypedMut<'_>> {
        let q = desc.quant.unwrap_or(Quant {
            scale: 1.0,
            offset: 0,
        });
        Some(match desc.dtype {
            dtype::FLOAT_32 => TypedMut::F32(self.cast_mut()),
            dtype::FLOAT_16 => TypedMut::F16(self.cast_mut()),
            dtype::UFIXED_POINT_16 | dtype::UINT_16 => TypedMut::U16(self.cast_mut(), q),
            dtype::SFIXED_POINT_16 | dtype::INT_16 => TypedMut::I16(self.cast_mut(), q),
            dtype::UFIXED_POINT_8 | dtype::UINT_8 => TypedMut::U8(self.cast_mut(), q),
            dtype::SFIXED_POINT_8 | dtype::INT_8 => TypedMut::I8(self.cast_mut(), q),
            dtype::INT_32 => TypedMut::I32(self.cast_mut()),
            _ => return None,
        })
    }

    pub fn typed(&self, desc: &TensorDesc) -> Option<Typed<'_>> {
        let q = desc.quant.unwrap_or(Quant {
            scale: 1.0,
            offset: 0,
        });
        Some(match desc.dtype {
            dtype::FLOAT_32 => Typed::F32(self.cast()),
            dtype::FLOAT_16 => Typed::F16(self.cast()),
            dtype::UFIXED_POINT_16 | dtype::UINT_16 => Typed::U16(self.cast(), q),
            dtype::SFIXED_POINT_16 | dtype::INT_16 => Typed::I16(self.cast(), q),
            dtype::UFIXED_POINT_8 | dtype::UINT_8 => Typed::U8(self.cast(), q),
            dtype::SFIXED_POINT_8 | dtype::INT_8 => Typed::I8(self.cast(), q),
            dtype::INT_32 => Typed::I32(self.cast()),
            _ => return None,
        })
    }
}

/// Whether the host can read and write this dtype.
pub fn dtype_supported(dt: u32) -> bool {
    matches!(
        dt,
        dtype::FLOAT_32
            | dtype::FLOAT_16
            | dtype::UFIXED_POINT_16
            | dtype::UINT_16
            | dtype::SFIXED_POINT_16
            | dtype::INT_16
            | dtype::UFIXED_POINT_8
            | dtype::UINT_8
            | dtype::SFIXED_POINT_8
            | dtype::INT_8
            | dtype::INT_32
    )
}

/// Persistent execute arguments of one graph.
pub struct Binding {
    pub desc: GraphDesc,
    pub(crate) inputs: Vec<QnnTensor>,
    pub(crate) outputs: Vec<QnnTensor>,
    in_bufs: Vec<HostBuf>,
    out_bufs: Vec<HostBuf>,
    // Kept alive for the tensor structs' name and dimensions pointers.
    _names: Vec<CString>,
    _dims: Vec<Box<[u32]>>,
    /// Registered memory handles (zero-copy mode) and the context they belong to; they are
    /// deregistered before the buffers are freed and before the context can be.
    mem: Vec<qnn_sys::QnnMemHandle>,
    ctx: Option<Arc<Context>>,
    /// Inputs whose memory belongs to another binding (see `alias_input`).
    aliased: Vec<bool>,
    /// The graph this binding was built for ([`Binding::for_graph`]); None for a binding
    /// built from a descriptor alone ([`Binding::new`]), which is matched by name.
    graph: Option<usize>,
}

// SAFETY: every pointer in the tensor structs points at heap memory the binding owns
// (names, dims, host or rpcmem buffers) or, for an aliased input, at a buffer of the other
// binding of the same `PairedBindings`, which moves with it; moving the struct moves none
// of them. The quantize params' pointers are never dereferenced (see `binary.rs`). Memory
// handles are process-wide, not tied to the creating thread. Not `Sync`: executing needs
// `&mut Binding`.
unsafe impl Send for Binding {}

impl Drop for Binding {
    fn drop(&mut self) {
        if let (Some(ctx), false) = (&self.ctx, self.mem.is_empty()) {
            if let Some(f) = ctx.runtime().backend().table.mem_de_register {
                // SAFETY: handles registered by `for_graph` with this context, freed once;
                // the graph is not executing (we hold &mut self).
                let s = unsafe { f(self.mem.as_ptr(), self.mem.len() as u32) };
                let what = || format!("deregistering the I/O memory of graph {}", self.desc.name);
                if let Err(e) = check(s, what) {
                    ctx.runtime().record_release_error(e);
                }
            }
        }
        // Fields drop next: buffers (rpcmem_free), then the context Arc.
    }
}

impl Binding {
    /// Allocate buffers and tensor structs for every input and output of `desc`.
    pub fn new(desc: &GraphDesc) -> Binding {
        let mut names = Vec::new();
        let mut dims = Vec::new();
        let mut make = |list: &[TensorDesc], bufs: &mut Vec<HostBuf>| -> Vec<QnnTensor> {
            list.iter()
                .map(|t| {
                    let mut buf = HostBuf::zeroed(t.bytes());
                    let name = CString::new(t.name.clone()).unwrap_or_default();
                    let mut d: Box<[u32]> = t.dims.clone().into_boxed_slice();
                    let mut qt = QnnTensor::new_v2();
                    qt.version = if desc.tensor_version == 1 {
                        QNN_TENSOR_VERSION_1
                    } else {
                        QNN_TENSOR_VERSION_2
                    };
                    // SAFETY: new_v2 initialised the union; V1 is its prefix, so the common
                    // view is valid for either version tag.
                    let c = unsafe { qt.common_mut() };
                    c.id = t.id;
                    c.name = name.as_ptr();
                    c.tensor_type = t.tensor_type;
                    c.data_type = t.dtype;
                    c.quantize_params = t.raw_quant;
                    c.rank = d.len() as u32;
                    c.dimensions = if d.is_empty() {
                        std::ptr::null_mut()
                    } else {
                        d.as_mut_ptr()
                    };
                    c.mem_type = mem_type::RAW;
                    c.mem.client_buf = qnn_sys::QnnClientBuffer {
                        data: buf.ptr() as *mut std::ffi::c_void,
                        data_size: buf.len() as u32,
                    };
                    names.push(name);
                    dims.push(d);
                    bufs.push(buf);
                    qt
                })
                .collect()
        };
        let mut in_bufs = Vec::new();
        let mut out_bufs = Vec::new();
        let inputs = make(&desc.inputs, &mut in_bufs);
        let outputs = make(&desc.outputs, &mut out_bufs);
        Binding {
            desc: desc.clone(),
            inputs,
            outputs,
            in_bufs,
            out_bufs,
            _names: names,
            _dims: dims,
            mem: Vec::new(),
            ctx: None,
            aliased: vec![false; desc.inputs.len()],
            graph: None,
        }
    }

    /// Like [`Binding::new`], but with zero-copy I/O when the graph's runtime has rpcmem:
    /// every input and output is an rpcmem buffer, registered once with `memRegister`
    /// (ION descriptor, one buffer per tensor) and bound as a MEMHANDLE tensor. Without
    /// rpcmem, client buffers as in `new`.
    pub fn for_graph(graph: &Graph, desc: &GraphDesc) -> Result<Binding> {
        let mut b = Binding::for_graph_inner(graph, desc)?;
        b.graph = Some(graph.id());
        Ok(b)
    }

    /// The graph this binding was built for, when built by [`Binding::for_graph`].
    pub(crate) fn graph_id(&self) -> Option<usize> {
        self.graph
    }

    fn for_graph_inner(graph: &Graph, desc: &GraphDesc) -> Result<Binding> {
        let ctx = graph.ctx.clone();
        let rt = ctx.runtime().clone();
        if rt.rpcmem.is_none() || rt.zero_copy_refused().is_some() {
            return Ok(Binding::new(desc));
        }
        let Some(register) = rt.backend().table.mem_register else {
            rt.refuse_zero_copy("the backend has no memRegister".into());
            return Ok(Binding::new(desc));
        };
        let mut b = Binding::new(desc);
        b.ctx = Some(ctx.clone());
        let n_in = b.inputs.len();
        for k in 0..n_in + b.outputs.len() {
            let (t, buf, qt) = if k < n_in {
                (&desc.inputs[k], &mut b.in_bufs[k], &mut b.inputs[k])
            } else {
                let j = k - n_in;
                (&desc.outputs[j], &mut b.out_bufs[j], &mut b.outputs[j])
            };
            // Shared memory is an optimisation: when the allocator or the backend refuses it
            // (the x86 HTP simulator answers memRegister with "not supported"), the handles
            // registered so far are released with `b` and the graph runs on client buffers.
            let Some(shared) = HostBuf::rpc(&rt, t.bytes()) else {
                rt.refuse_zero_copy(format!(
                    "rpcmem_alloc of {} bytes for tensor {} of graph {} failed",
                    t.bytes(),
                    t.name,
                    desc.name
                ));
                return Ok(Binding::new(desc));
            };
            let Storage::Rpc { fd, .. } = shared.storage else {
                unreachable!("HostBuf::rpc returns rpcmem storage")
            };
            *buf = shared;
            let mut dims: Vec<u32> = if t.dims.is_empty() {
                vec![1]
            } else {
                t.dims.clone()
            };
            let desc_m = qnn_sys::QnnMemDescriptor {
                mem_shape: qnn_sys::QnnMemShape {
                    num_dim: dims.len() as u32,
                    dim_size: dims.as_mut_ptr(),
                    shape_config: std::ptr::null(),
                },
                data_type: t.dtype,
                mem_type: qnn_sys::mem_kind::ION,
                info: qnn_sys::QnnMemInfo { ion_fd: fd },
            };
            let mut h: qnn_sys::QnnMemHandle = std::ptr::null_mut();
            // SAFETY: a live context; one descriptor whose dims outlive the call; one
            // handle slot.
            let s = unsafe { register(ctx.handle(), &desc_m, 1, &mut h) };
            if let Err(e) = check(s, || {
                format!(
                    "memRegister of the rpcmem buffer of tensor {} of graph {}",
                    t.name, desc.name
                )
            }) {
                rt.refuse_zero_copy(e.to_string());
                return Ok(Binding::new(desc));
            }
            b.mem.push(h);
            // SAFETY: new_v2 initialised the union; the common V1 prefix is valid.
            let c = unsafe { qt.common_mut() };
            c.mem_type = mem_type::MEMHANDLE;
            c.mem.mem_handle = h;
        }
        Ok(b)
    }

    /// Make input `i` read the memory of `owner`'s input `j` (a chunked prefill graph reading
    /// the decode graph's KV cache in place, so no cache is ever copied). With zero-copy I/O
    /// the owner's rpcmem buffer is registered in this binding's context too (a mem handle is
    /// per context) and this input's own buffer is deregistered and freed; with client
    /// buffers the tensor simply points at the owner's memory. The host must not touch input
    /// `i` through this binding any more.
    ///
    /// # Safety
    /// `owner`'s buffers must outlive every `execute` of this binding and its drop.
    /// [`PairedBindings`] guarantees it by owning both and dropping this one first.
    unsafe fn alias_input(&mut self, i: usize, owner: &mut Binding, j: usize) -> Result<()> {
        let (a, b) = (&self.desc.inputs[i], &owner.desc.inputs[j]);
        if a.dtype != b.dtype || a.bytes() != b.bytes() || a.quant != b.quant {
            return Err(crate::Error::graph(
                &self.desc.name,
                format!(
                    "{} cannot share the buffer of {}: dtype, size or quantization differ",
                    a.describe(),
                    b.describe()
                ),
            ));
        }
        let src = &mut owner.in_bufs[j];
        let (ptr, len) = (src.ptr(), src.len());
        let fd = match &src.storage {
            Storage::Rpc { fd, .. } => Some(*fd),
            Storage::Heap(_) => None,
        };
        match (fd, self.ctx.clone(), self.mem.is_empty()) {
            (Some(fd), Some(ctx), false) => {
                let table = &ctx.runtime().backend().table;
                let (Some(register), Some(deregister)) =
                    (table.mem_register, table.mem_de_register)
                else {
                    return Err(crate::Error::MissingEntry {
                        step: format!("sharing the KV cache with graph {}", self.desc.name),
                        entry: "memRegister/memDeRegister",
                    });
                };
                let mut dims: Vec<u32> = if a.dims.is_empty() {
                    vec![1]
                } else {
                    a.dims.clone()
                };
                let d = qnn_sys::QnnMemDescriptor {
                    mem_shape: qnn_sys::QnnMemShape {
                        num_dim: dims.len() as u32,
                        dim_size: dims.as_mut_ptr(),
                        shape_config: std::ptr::null(),
                    },
                    data_type: a.dtype,
                    mem_type: qnn_sys::mem_kind::ION,
                    info: qnn_sys::QnnMemInfo { ion_fd: fd },
                };
                let mut h: qnn_sys::QnnMemHandle = std::ptr::null_mut();
                // SAFETY: a live context; one descriptor whose dims outlive the call.
                let s = unsafe { register(ctx.handle(), &d, 1, &mut h) };
                check(s, || {
                    format!(
                        "registering the shared cache buffer {} of graph {}",
                        a.name, self.desc.name
                    )
                })?;
                // Handles are stored inputs first, in order: input i owns mem[i]. Deregister
                // it before its buffer is freed.
                let old = std::mem::replace(&mut self.mem[i], h);
                // SAFETY: `old` was registered by `for_graph` in this context, freed once.
                let _ = unsafe { deregister(&old, 1) };
                // SAFETY: V1 is the common prefix of both tensor versions.
                let c = unsafe { self.inputs[i].common_mut() };
                c.mem.mem_handle = h;
            }
            _ => {
                // SAFETY: V1 is the common prefix; the buffer has the same size and is kept
                // alive by the caller.
                let c = unsafe { self.inputs[i].common_mut() };
                c.mem_type = mem_type::RAW;
                c.mem.client_buf = qnn_sys::QnnClientBuffer {
                    data: ptr as *mut std::ffi::c_void,
                    data_size: len as u32,
                };
            }
        }
        self.in_bufs[i] = HostBuf::zeroed(0);
        self.aliased[i] = true;
        Ok(())
    }

    /// True when the I/O buffers are registered rpcmem (zero-copy).
    pub fn is_shared(&self) -> bool {
        !self.mem.is_empty()
    }

    /// Typed view of input `i` (dtype checked supported at model load).
    pub fn input_mut(&mut self, i: usize) -> TypedMut<'_> {
        assert!(
            !self.aliased[i],
            "input {i} is aliased; write it through its owner"
        );
        let d = &self.desc.inputs[i];
        self.in_bufs[i]
            .typed_mut(d)
            .expect("dtype validated at load")
    }

    pub fn output(&self, i: usize) -> Typed<'_> {
        let d = &self.desc.outputs[i];
        self.out_bufs[i].typed(d).expect("dtype validated at load")
    }

    /// Output `o` and input `i` at once (distinct buffers), for cache writes.
    pub fn output_and_input_mut(&mut self, o: usize, i: usize) -> (Typed<'_>, TypedMut<'_>) {
        let (od, id) = (&self.desc.outputs[o], &self.desc.inputs[i]);
        (
            self.out_bufs[o].typed(od).expect("dtype validated at load"),
            self.in_bufs[i]
                .typed_mut(id)
                .expect("dtype validated at load"),
        )
    }

    pub fn input_bytes_mut(&mut self, i: usize) -> &mut [u8] {
        self.in_bufs[i].as_bytes_mut()
    }

    /// Typed read view of input `i` (a cache the host keeps in the graph's own input).
    pub fn input(&self, i: usize) -> Typed<'_> {
        let d = &self.desc.inputs[i];
        self.in_bufs[i].typed(d).expect("dtype validated at load")
    }

    pub fn input_bytes(&self, i: usize) -> &[u8] {
        self.in_bufs[i].as_bytes()
    }

    /// Bytes of output `o` and input `i` at once, for same-encoding row copies.
    pub fn output_and_input_bytes_mut(&mut self, o: usize, i: usize) -> (&[u8], &mut [u8]) {
        (self.out_bufs[o].as_bytes(), self.in_bufs[i].as_bytes_mut())
    }

    pub fn output_bytes(&self, i: usize) -> &[u8] {
        self.out_bufs[i].as_bytes()
    }
}

/// The bindings of every graph of a plan, some of whose inputs may share memory with
/// another binding's: a chunked prefill graph reads the decode graph's KV cache in place,
/// so the cache is never copied. Owning all of them keeps shared buffers alive for as long
/// as any binding can execute. An alias always points at a later binding, and the bindings
/// drop first to last, so an aliasing binding deregisters its handles before the owner
/// frees the memory.
/// (binding, input) within a [`BindingSet`].
pub type InputAt = (usize, usize);

pub struct BindingSet {
    all: Vec<Binding>,
}

impl BindingSet {
    /// One binding per graph; `aliases`: ((binding, input), (owner binding, owner input))
    /// pairs to back with the owner's buffers. An owner must come after the binding that
    /// aliases it.
    pub fn new(graphs: &[(&Graph, &GraphDesc)], aliases: &[(InputAt, InputAt)]) -> Result<Self> {
        let mut all = Vec::with_capacity(graphs.len());
        for (g, d) in graphs {
            all.push(Binding::for_graph(g, d)?);
        }
        for &((b, i), (o, j)) in aliases {
            if b >= o || o >= all.len() {
                return Err(crate::Error::graph(
                    &graphs[b.min(graphs.len() - 1)].1.name,
                    "an input can only share the buffer of a later graph's input",
                ));
            }
            let (head, tail) = all.split_at_mut(o);
            // SAFETY: the owner is held by this set next to the alias, is never replaced or
            // removed, and drops after it (vector order, owner later); a Binding never frees
            // or reallocates its buffers while alive.
            unsafe { head[b].alias_input(i, &mut tail[0], j)? };
        }
        Ok(BindingSet { all })
    }

    pub fn get(&self, k: usize) -> &Binding {
        &self.all[k]
    }

    pub fn get_mut(&mut self, k: usize) -> &mut Binding {
        &mut self.all[k]
    }

    /// Binding `a` to read and binding `b` to write, `a != b`.
    pub fn two(&mut self, a: usize, b: usize) -> (&Binding, &mut Binding) {
        assert_ne!(a, b, "two distinct bindings");
        if a < b {
            let (l, r) = self.all.split_at_mut(b);
            (&l[a], &mut r[0])
        } else {
            let (l, r) = self.all.split_at_mut(a);
            (&r[0], &mut l[b])
        }
    }

    /// True when every binding's I/O is registered rpcmem (zero-copy).
    pub fn all_shared(&self) -> bool {
        self.all.iter().all(Binding::is_shared)
    }
}
// graphExecute lives beside the binding it reads: the context module only creates graphs.
impl Graph {
    /// Execute with the binding's persistent tensors. The binding must be one built for
    /// this graph (same descriptor name; same graph handle when built by
    /// [`Binding::for_graph`]): another graph's tensors would reach C with the wrong ids
    /// and sizes. `&mut Binding` keeps one binding out of two executions at once; the
    /// graph's own lock keeps two bindings of one graph from executing at once.
    pub fn execute(&self, b: &mut Binding) -> Result<()> {
        if b.desc.name != self.name || b.graph_id().is_some_and(|id| id != self.id()) {
            return Err(Error::graph(
                &self.name,
                format!(
                    "cannot execute with a binding built for graph {} (another graph or context)",
                    b.desc.name
                ),
            ));
        }
        let (ni, no) = (b.inputs.len() as u32, b.outputs.len() as u32);
        let _running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the graph handle is live (we hold its context); the tensor arrays are
        // contiguous Qnn_Tensor_t (stride 144) whose names, dims and buffers the binding
        // owns and keeps alive; output buffers are writable and exactly sized.
        let s = unsafe {
            (self.execute)(
                self.handle,
                b.inputs.as_ptr(),
                ni,
                b.outputs.as_mut_ptr(),
                no,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        check(s, || {
            format!("executing graph {} ({})", self.name, self.ctx.bin.display())
        })
    }
}
