//! The operating system's edge that is not QNN: read-only file maps and the process's
//! stdout descriptor. With [`crate::qnn`], the only module allowed `unsafe`.

pub mod stdio;

use crate::error::{Error, Result};
use std::path::Path;

/// Memory-map a file read-only.
pub fn map_file(file: &std::fs::File, path: &Path) -> Result<memmap2::Mmap> {
    // SAFETY: the map is read-only and private to this process. Bundle files are not
    // expected to change while a generation runs; if another process truncates one, reads
    // may fault, as with any mmap-based loader (documented in README).
    unsafe { memmap2::Mmap::map(file) }.map_err(|e| Error::io(path, e))
}

/// The process's resident set size in bytes (`VmRSS` of /proc/self/status, Linux and
/// Android); None where the system does not say.
pub fn resident_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// View little-endian bytes as f16 values when aligned (always true for rows of a mapped
/// table: the map is page-aligned and rows are whole elements). None otherwise.
pub fn bytes_as_f16(b: &[u8]) -> Option<&[half::f16]> {
    let v = bytemuck::try_cast_slice(b).ok()?;
    cfg!(target_endian = "little").then_some(v)
}

/// As [`bytes_as_f16`], for f32.
pub fn bytes_as_f32(b: &[u8]) -> Option<&[f32]> {
    let v = bytemuck::try_cast_slice(b).ok()?;
    cfg!(target_endian = "little").then_some(v)
}
