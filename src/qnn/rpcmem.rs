//! rpcmem from `libcdsprpc.so` (fact sheet §7.2): shared, DSP-visible buffers for
//! zero-copy graph I/O. Written against the documented ABI; on this host the emulator's
//! stand-in exports the same three symbols. Not verified on hardware.

use std::ffi::c_void;
use std::path::{Path, PathBuf};

pub const RPCMEM_HEAP_ID_SYSTEM: i32 = 25;
pub const RPCMEM_DEFAULT_FLAGS: u32 = 1;

type AllocFn = unsafe extern "C" fn(heap: i32, flags: u32, size: i32) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(p: *mut c_void);
type ToFdFn = unsafe extern "C" fn(p: *mut c_void) -> i32;

pub struct RpcMem {
    _lib: libloading::Library,
    alloc: AllocFn,
    free: FreeFn,
    to_fd: ToFdFn,
    pub path: PathBuf,
}

impl RpcMem {
    pub fn load(path: &Path) -> Result<RpcMem, String> {
        // SAFETY: loading a shared library runs its initialisers; libcdsprpc (or the
        // emulator) is a plain C library whose initialisers have no preconditions.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("{}: {e}", path.display()))?;
        // SAFETY: the symbols have the rpcmem.h signatures declared above.
        let (alloc, free, to_fd) = unsafe {
            let a = *lib
                .get::<AllocFn>(b"rpcmem_alloc\0")
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let f = *lib
                .get::<FreeFn>(b"rpcmem_free\0")
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let t = *lib
                .get::<ToFdFn>(b"rpcmem_to_fd\0")
                .map_err(|e| format!("{}: {e}", path.display()))?;
            (a, f, t)
        };
        Ok(RpcMem {
            _lib: lib,
            alloc,
            free,
            to_fd,
            path: path.to_path_buf(),
        })
    }

    /// A zeroed shared buffer of `bytes` (at least 8) and its fd; None when the allocator
    /// refuses or the size exceeds rpcmem_alloc's 2 GB limit.
    pub fn alloc(&self, bytes: usize) -> Option<(*mut u8, i32)> {
        let n = i32::try_from(bytes.max(8)).ok()?;
        // SAFETY: plain values; the result is NULL or a mapping of n bytes.
        let p = unsafe { (self.alloc)(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, n) };
        if p.is_null() {
            return None;
        }
        // SAFETY: p is a live rpcmem allocation.
        let fd = unsafe { (self.to_fd)(p) };
        if fd < 0 {
            // SAFETY: freeing what we just allocated.
            unsafe { (self.free)(p) };
            return None;
        }
        // SAFETY: p holds n writable bytes; zero them (rpcmem does not promise zeroed memory).
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, n as usize) };
        Some((p as *mut u8, fd))
    }

    /// # Safety
    /// `p` must come from [`RpcMem::alloc`] of this library and not be used afterwards.
    pub unsafe fn free(&self, p: *mut u8) {
        // SAFETY: per the caller's contract.
        unsafe { (self.free)(p as *mut c_void) }
    }
}
