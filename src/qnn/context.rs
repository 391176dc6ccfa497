//! Contexts created from binaries, and graphs retrieved from them.

use super::runtime::Runtime;
use super::status::check;
use crate::error::{Error, Result};
use qnn_sys::*;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct Context {
    rt: Arc<Runtime>,
    handle: QnnContextHandle,
    pub bin: PathBuf,
}

// SAFETY: a context handle may be used from any thread; qhx uses each from one at a time.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// `contextCreateFromBinary` on `bytes` (the mapped file; needed only during the call).
    pub fn from_binary(rt: &Arc<Runtime>, bytes: &[u8], bin: &Path) -> Result<Arc<Context>> {
        let t = &rt.backend().table;
        let step = || format!("creating context from {}", bin.display());
        let create = t
            .context_create_from_binary
            .ok_or_else(|| Error::MissingEntry {
                step: step(),
                entry: "contextCreateFromBinary",
            })?;
        let mut handle: QnnContextHandle = std::ptr::null_mut();
        // SAFETY: backend/device are live handles of `rt`; `bytes` is readable for its
        // length during the call; no configs; the out-param is a live local.
        let s = unsafe {
            create(
                rt.backend_handle(),
                rt.device_handle(),
                std::ptr::null(),
                bytes.as_ptr() as *const _,
                bytes.len() as u64,
                &mut handle,
                std::ptr::null_mut(),
            )
        };
        check(s, step)?;
        Ok(Arc::new(Context {
            rt: rt.clone(),
            handle,
            bin: bin.to_path_buf(),
        }))
    }

    pub(crate) fn runtime(&self) -> &Arc<Runtime> {
        &self.rt
    }

    pub(crate) fn handle(&self) -> QnnContextHandle {
        self.handle
    }

    /// `graphRetrieve` by name.
    pub fn graph(self: &Arc<Self>, name: &str) -> Result<Graph> {
        let t = &self.rt.backend().table;
        let step = || format!("retrieving graph {name} from {}", self.bin.display());
        let retrieve = t.graph_retrieve.ok_or_else(|| Error::MissingEntry {
            step: step(),
            entry: "graphRetrieve",
        })?;
        let execute = t.graph_execute.ok_or_else(|| Error::MissingEntry {
            step: step(),
            entry: "graphExecute",
        })?;
        let cname = CString::new(name).map_err(|_| Error::graph(name, "name contains NUL"))?;
        let mut handle: QnnGraphHandle = std::ptr::null_mut();
        // SAFETY: live context handle; NUL-terminated name; out-param to a live local.
        let status = unsafe { retrieve(self.handle, cname.as_ptr(), &mut handle) };
        check(status, step)?;
        Ok(Graph {
            ctx: self.clone(),
            handle,
            execute,
            name: name.to_string(),
            running: std::sync::Mutex::new(()),
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if let Some(f) = self.rt.backend().table.context_free {
            // SAFETY: a live context handle, freed once; its graphs hold an Arc to this
            // context, so none can be executed afterwards.
            let s = unsafe { f(self.handle, std::ptr::null_mut()) };
            if let Err(e) = check(s, || {
                format!("freeing the context of {}", self.bin.display())
            }) {
                self.rt.record_release_error(e);
            }
        }
    }
}

pub struct Graph {
    pub(crate) ctx: Arc<Context>,
    pub(super) handle: QnnGraphHandle,
    pub(super) execute: GraphExecuteFn,
    pub name: String,
    /// Held during graphExecute: QNN does not promise that one graph may run on two
    /// threads at once, so executions of one graph are serialised (uncontended in a
    /// single-threaded loop: one atomic swap per execute).
    pub(super) running: std::sync::Mutex<()>,
}

// SAFETY: a graph handle may be used from any thread (QNN handles are process-wide); the
// context it belongs to is kept alive by `ctx`, and executions are serialised by `running`,
// so sharing `&Graph` between threads cannot run one graph twice at once.
unsafe impl Send for Graph {}
// SAFETY: as above.
unsafe impl Sync for Graph {}

impl Graph {
    /// The graph's handle as an identity (bindings record which graph they were built for).
    pub(crate) fn id(&self) -> usize {
        self.handle as usize
    }
}
