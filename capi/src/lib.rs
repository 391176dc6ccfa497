//! libqhx: the qhx runtime behind a C API (`include/qhexrt/qhexrt_c.h`), source-compatible
//! with the QHexRT surface the RunAnywhere SDK's adapter compiles against.
//!
//! Every exported function contains panics (none reaches C), checks its pointers, and
//! reports failure as a status plus a message: on the session for session calls
//! (`qhx_session_last_error`), per thread otherwise (`qhx_last_error`).

mod abi;
mod ffi;
mod session;
