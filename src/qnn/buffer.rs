//! Host tensor buffers and persistent graph bindings.
//!
//! A [`Binding`] owns one 8-byte-aligned buffer per graph input and output plus the
//! `Qnn_Tensor_t` array that points at them. It is built once; a step only rewrites bytes
//! inside the buffers, never the tensor structs.

use super::binary::{GraphDesc, TensorDesc};
use crate::ops::convert::{Quant, Typed, TypedMut};
use qnn_sys::{dtype, mem_type, QnnTensor, QNN_TENSOR_VERSION_1, QNN_TENSOR_VERSION_2};
use std::ffi::CString;

/// An 8-byte aligned, zero-initialised byte buffer.
pub struct HostBuf {
    words: Vec<u64>,
    bytes: usize,
}

impl HostBuf {
    pub fn zeroed(bytes: usize) -> Self {
        HostBuf {
            words: vec![0u64; bytes.div_ceil(8)],
            bytes,
        }
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: the Vec<u64> holds at least `bytes` initialised bytes; u8 has no
        // alignment or validity requirements.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.bytes) }
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, with unique access through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.bytes) }
    }

    fn ptr(&mut self) -> *mut u8 {
        self.words.as_mut_ptr() as *mut u8
    }

    /// Reinterpret as a slice of `T`.
    ///
    /// # Safety
    /// `T` must be a plain number type (every bit pattern valid) of size 1, 2, 4 or 8.
    unsafe fn cast<T>(&self) -> &[T] {
        let n = self.bytes / std::mem::size_of::<T>();
        // SAFETY: the storage is 8-aligned (>= align of T), holds `bytes` initialised bytes,
        // and the caller promises every bit pattern is a valid T.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const T, n) }
    }

    /// # Safety
    /// As for `cast`.
    unsafe fn cast_mut<T>(&mut self) -> &mut [T] {
        let n = self.bytes / std::mem::size_of::<T>();
        // SAFETY: as in `cast`, with unique access.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut T, n) }
    }

    /// A typed view for a tensor of `desc`'s dtype; None for unsupported dtypes.
    pub fn typed_mut(&mut self, desc: &TensorDesc) -> Option<TypedMut<'_>> {
        let q = desc.quant.unwrap_or(Quant {
            scale: 1.0,
            offset: 0,
        });
        // SAFETY (all arms): f32, f16, u16, i16, u8, i8 and i32 accept every bit pattern.
        Some(unsafe {
            match desc.dtype {
                dtype::FLOAT_32 => TypedMut::F32(self.cast_mut()),
                dtype::FLOAT_16 => TypedMut::F16(self.cast_mut()),
                dtype::UFIXED_POINT_16 | dtype::UINT_16 => TypedMut::U16(self.cast_mut(), q),
                dtype::SFIXED_POINT_16 | dtype::INT_16 => TypedMut::I16(self.cast_mut(), q),
                dtype::UFIXED_POINT_8 | dtype::UINT_8 => TypedMut::U8(self.cast_mut(), q),
                dtype::SFIXED_POINT_8 | dtype::INT_8 => TypedMut::I8(self.cast_mut(), q),
                dtype::INT_32 => TypedMut::I32(self.cast_mut()),
                _ => return None,
            }
        })
    }

    pub fn typed(&self, desc: &TensorDesc) -> Option<Typed<'_>> {
        let q = desc.quant.unwrap_or(Quant {
            scale: 1.0,
            offset: 0,
        });
        // SAFETY (all arms): as in typed_mut.
        Some(unsafe {
            match desc.dtype {
                dtype::FLOAT_32 => Typed::F32(self.cast()),
                dtype::FLOAT_16 => Typed::F16(self.cast()),
                dtype::UFIXED_POINT_16 | dtype::UINT_16 => Typed::U16(self.cast(), q),
                dtype::SFIXED_POINT_16 | dtype::INT_16 => Typed::I16(self.cast(), q),
                dtype::UFIXED_POINT_8 | dtype::UINT_8 => Typed::U8(self.cast(), q),
                dtype::SFIXED_POINT_8 | dtype::INT_8 => Typed::I8(self.cast(), q),
                dtype::INT_32 => Typed::I32(self.cast()),
                _ => return None,
            }
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
    /// Inputs whose memory belongs to another binding (see `alias_input`).
    aliased: Vec<bool>,
    // Kept alive for the tensor structs' name and dimensions pointers.
    _names: Vec<CString>,
    _dims: Vec<Box<[u32]>>,
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
            aliased: vec![false; inputs.len()],
            inputs,
            outputs,
            in_bufs,
            out_bufs,
            _names: names,
            _dims: dims,
        }
    }

    /// Make input `i` read the memory of `owner`'s input `j`; this binding's own buffer for
    /// `i` is released and the host must not touch input `i` here any more.
    ///
    /// # Safety
    /// `owner`'s buffers must outlive every `execute` of this binding. [`PairedBindings`]
    /// guarantees it by owning both.
    unsafe fn alias_input(
        &mut self,
        i: usize,
        owner: &mut Binding,
        j: usize,
    ) -> Result<(), String> {
        let (a, b) = (&self.desc.inputs[i], &owner.desc.inputs[j]);
        if a.dtype != b.dtype || a.bytes() != b.bytes() || a.quant != b.quant {
            return Err(format!(
                "{} cannot share the buffer of {}: dtype, size or quantization differ",
                a.describe(),
                b.describe()
            ));
        }
        let ptr = owner.in_bufs[j].ptr();
        // SAFETY: V1 is the common prefix of both tensor versions; the client buffer is
        // repointed at memory of the same size that the caller keeps alive.
        let c = unsafe { self.inputs[i].common_mut() };
        c.mem.client_buf = qnn_sys::QnnClientBuffer {
            data: ptr as *mut std::ffi::c_void,
            data_size: owner.in_bufs[j].len() as u32,
        };
        self.in_bufs[i] = HostBuf::zeroed(0);
        self.aliased[i] = true;
        Ok(())
    }

    pub fn input_index(&self, name: &str) -> Option<usize> {
        self.desc.inputs.iter().position(|t| t.name == name)
    }

    pub fn output_index(&self, name: &str) -> Option<usize> {
        self.desc.outputs.iter().position(|t| t.name == name)
    }

    /// Typed view of input `i` (dtype checked supported at model load). An aliased input
    /// has no storage here: write it through its owner.
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

    pub fn output_bytes(&self, i: usize) -> &[u8] {
        self.out_bufs[i].as_bytes()
    }

    /// Bytes of output `o` and input `i` of another binding, for same-dtype copies.
    pub fn total_bytes(&self) -> usize {
        self.in_bufs
            .iter()
            .chain(&self.out_bufs)
            .map(HostBuf::len)
            .sum()
    }
}

/// A prefill binding and a decode binding whose inputs may share memory: a chunked prefill
/// graph reads the decode graph's KV cache in place, so the cache is never copied. Owning
/// both keeps the shared buffers alive for as long as either binding can execute.
pub struct PairedBindings {
    pre: Option<Binding>,
    dec: Binding,
}

impl PairedBindings {
    /// `shared`: (prefill input index, decode input index) pairs to back with the decode
    /// binding's buffers.
    pub fn new(
        pre: Option<&GraphDesc>,
        dec: &GraphDesc,
        shared: &[(usize, usize)],
    ) -> Result<Self, String> {
        let mut dec = Binding::new(dec);
        let mut pre = pre.map(Binding::new);
        if let Some(p) = pre.as_mut() {
            for &(i, j) in shared {
                // SAFETY: `dec` is owned by the returned struct next to `pre`, is never
                // replaced, and a Binding never frees or reallocates its buffers while alive.
                unsafe { p.alias_input(i, &mut dec, j)? };
            }
        }
        Ok(PairedBindings { pre, dec })
    }

    pub fn dec(&mut self) -> &mut Binding {
        &mut self.dec
    }

    pub fn dec_ref(&self) -> &Binding {
        &self.dec
    }

    /// Both at once (prefill outputs are copied into the decode cache).
    pub fn both(&mut self) -> (Option<&mut Binding>, &mut Binding) {
        (self.pre.as_mut(), &mut self.dec)
    }
}
