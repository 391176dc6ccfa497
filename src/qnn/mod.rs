//! Safe wrapper over `qnn-sys`: with [`crate::os`], the only place in the qhx library with
//! `unsafe` code.
//!
//! Ownership mirrors the QNN object tree: [`Runtime`] (libraries, log, backend, device) is
//! shared by [`Context`]s through an `Arc`, and each [`Graph`] holds its context, so handles
//! are freed child-first on every path, including errors.

mod binary;
mod buffer;
mod context;
mod log;
mod perf;
mod rpcmem;
mod runtime;
mod status;

pub use binary::{
    check_loadable, read_binary_info, read_binary_info_with, short_dtype, BinaryInfo, GraphDesc,
    TensorDesc, WeightBytes,
};
pub use buffer::{dtype_supported as buffer_dtype_supported, Binding, BindingSet, HostBuf};
pub use context::{Context, Graph};
pub use log::{last_error_line, set_verbosity};
pub use perf::PerfMode;
pub use qnn_sys::SystemLibrary;
pub use runtime::{DeviceFacts, Runtime};
pub use status::hint_for;
