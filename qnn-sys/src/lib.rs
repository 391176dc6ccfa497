//! Thin, hand-written FFI for the Qualcomm QNN C API (QAIRT 2.43 / core API 2.32 layouts).
//!
//! No bindgen and no SDK at build time: every struct is declared here and its size and
//! offsets are asserted at compile time in [`layout`]. [`loader`] opens a backend and a
//! system library with libloading and picks a provider by API version.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod error;
pub mod interface;
pub mod layout;
pub mod loader;
pub mod system;
pub mod types;

pub use error::{error_name, QnnStatus};
pub use interface::*;
pub use loader::{BackendLibrary, LoadError, SystemLibrary};
pub use system::*;
pub use types::*;
