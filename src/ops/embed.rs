//! The host embedding table: a memory-mapped raw [vocab, hidden] array of f16 or f32.

use crate::bundle::manifest::EmbedDtype;
use crate::error::{Error, Result};
use crate::ops::convert::TypedMut;
use half::f16;
use half::slice::HalfFloatSliceExt;
use std::path::{Path, PathBuf};

pub struct EmbedTable {
    map: memmap2::Mmap,
    dtype: EmbedDtype,
    vocab: usize,
    hidden: usize,
    path: PathBuf,
}

impl EmbedTable {
    /// Map `path` and check its size is exactly vocab * hidden * element size.
    pub fn open(path: &Path, dtype: EmbedDtype, vocab: usize, hidden: usize) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let Some(want) = vocab
            .checked_mul(hidden)
            .and_then(|n| n.checked_mul(dtype.size()))
            .map(|n| n as u64)
        else {
            return Err(Error::File {
                path: path.to_path_buf(),
                msg: format!("vocab {vocab} x hidden {hidden} overflows the address space"),
            });
        };
        if len != want {
            return Err(Error::File {
                path: path.to_path_buf(),
                msg: format!(
                    "embedding table is {len} bytes, but vocab {vocab} x hidden {hidden} x {} bytes ({dtype:?}) = {want}",
                    dtype.size()
                ),
            });
        }
        let map = crate::os::map_file(&file, path)?;
        Ok(EmbedTable {
            map,
            dtype,
            vocab,
            hidden,
            path: path.to_path_buf(),
        })
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write the row of `token` into elements `at..at+hidden` of `dst`.
    pub fn write_row(&self, token: u32, dst: &mut TypedMut<'_>, at: usize) -> Result<()> {
        let t = token as usize;
        if t >= self.vocab {
            return Err(Error::TokenOutOfRange {
                id: token,
                vocab: self.vocab,
                path: self.path.clone(),
            });
        }
        let h = self.hidden;
        let es = self.dtype.size();
        let bytes = &self.map[t * h * es..(t + 1) * h * es];
        let (v16, v32) = (
            crate::os::bytes_as_f16(bytes),
            crate::os::bytes_as_f32(bytes),
        );
        match (self.dtype, dst) {
            // Same element type: a straight copy of the row.
            (EmbedDtype::F16, TypedMut::F16(d)) if v16.is_some() => {
                d[at..at + h].copy_from_slice(v16.unwrap_or_default())
            }
            (EmbedDtype::F32, TypedMut::F32(d)) if v32.is_some() => {
                d[at..at + h].copy_from_slice(v32.unwrap_or_default())
            }
            (_, d) => {
                // Convert through a small stack buffer: no allocation per step.
                let mut buf = [0f32; 256];
                let mut i = 0;
                while i < h {
                    let n = (h - i).min(buf.len());
                    let chunk = &mut buf[..n];
                    match (self.dtype, v16, v32) {
                        (EmbedDtype::F16, Some(v), _) => v[i..i + n].convert_to_f32_slice(chunk),
                        (EmbedDtype::F32, _, Some(v)) => chunk.copy_from_slice(&v[i..i + n]),
                        _ => {
                            let row = self.row_f32(t, bytes);
                            chunk.copy_from_slice(&row[i..i + n]);
                        }
                    }
                    d.write_f32(at + i, chunk);
                    i += n;
                }
            }
        }
        Ok(())
    }

    fn row_f32(&self, _t: usize, bytes: &[u8]) -> Vec<f32> {
        match self.dtype {
            EmbedDtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            EmbedDtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflowing_shape_is_an_error_not_a_panic() {
        let p = std::env::temp_dir().join(format!("qhx-embed-ovf-{}", std::process::id()));
        std::fs::write(&p, [0u8; 8]).unwrap();
        let e = EmbedTable::open(&p, EmbedDtype::F32, usize::MAX / 2, 3)
            .err()
            .expect("must fail")
            .to_string();
        assert!(e.contains("overflows"), "{e}");
        let _ = std::fs::remove_file(&p);
    }
}
