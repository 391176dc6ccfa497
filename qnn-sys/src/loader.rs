//! Loading a QNN backend and system library with libloading and picking a provider.

use crate::error::QnnStatus;
use crate::interface::*;
use crate::system::*;
use crate::types::QnnVersion;
use std::ffi::CStr;
use std::path::{Path, PathBuf};

/// Why a QNN library could not be used. Every variant names the library path.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot load {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: libloading::Error,
    },
    #[error("{} is not a QNN {what} library: symbol {symbol} not found", path.display())]
    MissingSymbol {
        path: PathBuf,
        what: &'static str,
        symbol: &'static str,
    },
    #[error("{symbol} in {} failed: {status}", path.display())]
    GetProviders {
        path: PathBuf,
        symbol: &'static str,
        status: QnnStatus,
    },
    #[error("{} offers no {what} interface provider", path.display())]
    NoProviders { path: PathBuf, what: &'static str },
    #[error(
        "{} reports {what} API {found}, but qhx needs {need_major}.{need_minor} or a newer {need_major}.x (use QAIRT libraries from the SDK the bundle was built with)",
        path.display()
    )]
    Version {
        path: PathBuf,
        what: &'static str,
        found: QnnVersion,
        need_major: u32,
        need_minor: u32,
    },
}

fn open(path: &Path) -> Result<libloading::Library, LoadError> {
    #[cfg(unix)]
    let lib = {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        // SAFETY: loading a library runs its initialisers; QNN libraries are trusted input
        // named by the user, as with any dlopen-based runtime.
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map(libloading::Library::from)
    };
    #[cfg(not(unix))]
    // SAFETY: as above.
    let lib = unsafe { libloading::Library::new(path) };
    lib.map_err(|source| LoadError::Open {
        path: path.to_path_buf(),
        source,
    })
}

/// Call a library's `*_getProviders` and return its non-null provider pointers.
fn provider_list<T>(
    lib: &libloading::Library,
    path: &Path,
    what: &'static str,
    symbol: &'static str,
) -> Result<Vec<*const T>, LoadError> {
    type GetProviders<T> = unsafe extern "C" fn(*mut *const *const T, *mut u32) -> u64;
    let name = format!("{symbol}\0");
    // SAFETY: both getProviders symbols have this shape (QnnInterface.h /
    // QnnSystemInterface.h), with T the provider struct of that library.
    let get: libloading::Symbol<GetProviders<T>> =
        unsafe { lib.get(name.as_bytes()) }.map_err(|_| LoadError::MissingSymbol {
            path: path.to_path_buf(),
            what,
            symbol,
        })?;
    let mut list: *const *const T = std::ptr::null();
    let mut n: u32 = 0;
    // SAFETY: both out-params point to live locals of the documented types.
    let status = QnnStatus(unsafe { get(&mut list, &mut n) });
    if !status.is_ok() {
        return Err(LoadError::GetProviders {
            path: path.to_path_buf(),
            symbol,
            status,
        });
    }
    if list.is_null() || n == 0 {
        return Err(LoadError::NoProviders {
            path: path.to_path_buf(),
            what,
        });
    }
    // SAFETY: the library wrote an array of `n` provider pointers that lives as long as
    // the library stays loaded.
    let all = unsafe { std::slice::from_raw_parts(list, n as usize) };
    Ok(all.iter().copied().filter(|p| !p.is_null()).collect())
}

/// A loaded backend library (e.g. libQnnHtp.so) and its selected interface provider.
pub struct BackendLibrary {
    provider: *const QnnInterface,
    /// The provider's function table, entries absent from its API version set to `None`.
    pub table: QnnInterfaceTable,
    pub backend_id: u32,
    pub provider_name: String,
    pub core_api: QnnVersion,
    pub backend_api: QnnVersion,
    pub path: PathBuf,
    // Dropped last: the provider and table point into this library.
    _lib: libloading::Library,
}

// SAFETY: the provider struct is immutable library-owned data, valid while `_lib` lives;
// the function pointers may be called from any thread per the QNN threading model (calls
// on one handle are serialised by the wrapper above this crate).
unsafe impl Send for BackendLibrary {}
// SAFETY: as above, nothing here is mutated after construction.
unsafe impl Sync for BackendLibrary {}

impl BackendLibrary {
    /// Open `path`, call `QnnInterface_getProviders` and take the first provider with core
    /// API major 2 and minor >= [`MIN_CORE_API`].minor.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        let lib = open(path)?;
        let providers =
            provider_list::<QnnInterface>(&lib, path, "backend", "QnnInterface_getProviders")?;
        let mut last_version = None;
        for p in providers {
            // SAFETY: a non-null provider points to a library-owned QnnInterface_t; its
            // header (first 40 bytes) is the same in every API 2.x version.
            let (backend_id, name_ptr, api) =
                unsafe { ((*p).backend_id, (*p).provider_name, (*p).api_version) };
            if api.core.major != MIN_CORE_API.major || api.core.minor < MIN_CORE_API.minor {
                last_version = Some(api.core);
                continue;
            }
            // SAFETY: the version check passed, so the table holds every entry the version
            // implies; `read_versioned` reads no further.
            let table = unsafe { QnnInterfaceTable::read_versioned(p) };
            let provider_name = if name_ptr.is_null() {
                String::new()
            } else {
                // SAFETY: a non-null provider name is a NUL-terminated static string.
                unsafe { CStr::from_ptr(name_ptr) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Ok(BackendLibrary {
                provider: p,
                table,
                backend_id,
                provider_name,
                core_api: api.core,
                backend_api: api.backend,
                path: path.to_path_buf(),
                _lib: lib,
            });
        }
        Err(LoadError::Version {
            path: path.to_path_buf(),
            what: "core",
            found: last_version.unwrap_or_default(),
            need_major: MIN_CORE_API.major,
            need_minor: MIN_CORE_API.minor,
        })
    }

    /// The raw provider pointer (library-owned; must not be freed).
    pub fn provider(&self) -> *const QnnInterface {
        self.provider
    }
}

/// A loaded system library (libQnnSystem.so) and its selected provider.
pub struct SystemLibrary {
    pub table: QnnSystemInterfaceTable,
    pub api: QnnVersion,
    pub provider_name: String,
    pub path: PathBuf,
    _lib: libloading::Library,
}

// SAFETY: see BackendLibrary; the table is copied out and immutable.
unsafe impl Send for SystemLibrary {}
// SAFETY: as above.
unsafe impl Sync for SystemLibrary {}

impl SystemLibrary {
    /// Open `path` and take the first provider with system API major 1, minor >= 1.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        let lib = open(path)?;
        let providers = provider_list::<QnnSystemInterface>(
            &lib,
            path,
            "system",
            "QnnSystemInterface_getProviders",
        )?;
        let mut last_version = None;
        for p in providers {
            // SAFETY: the 32-byte header is stable across system API 1.x.
            let (name_ptr, api) = unsafe { ((*p).provider_name, (*p).system_api_version) };
            if api.major != MIN_SYSTEM_API.major || api.minor < MIN_SYSTEM_API.minor {
                last_version = Some(api);
                continue;
            }
            // SAFETY: entries 0-3 exist at the same offsets in every system API >= 1.1;
            // the later entries are never read.
            let first4 = unsafe {
                std::ptr::read_unaligned((p as *const u8).add(SYSTEM_TABLE_OFFSET)
                    as *const [crate::interface::OpaqueFn; 4])
            };
            let mut table = QnnSystemInterfaceTable::empty();
            // SAFETY: each slot holds the library's pointer for the entry of that index,
            // whose signature is the one declared in QnnSystemInterfaceTable.
            unsafe {
                table.system_context_create = std::mem::transmute::<
                    crate::interface::OpaqueFn,
                    Option<SystemContextCreateFn>,
                >(first4[0]);
                table.system_context_get_binary_info = std::mem::transmute::<
                    crate::interface::OpaqueFn,
                    Option<SystemContextGetBinaryInfoFn>,
                >(first4[1]);
                table.system_context_get_meta_data = std::mem::transmute::<
                    crate::interface::OpaqueFn,
                    Option<SystemContextGetMetaDataFn>,
                >(first4[2]);
                table.system_context_free = std::mem::transmute::<
                    crate::interface::OpaqueFn,
                    Option<SystemContextFreeFn>,
                >(first4[3]);
            }
            let provider_name = if name_ptr.is_null() {
                String::new()
            } else {
                // SAFETY: NUL-terminated static string owned by the library.
                unsafe { CStr::from_ptr(name_ptr) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Ok(SystemLibrary {
                table,
                api,
                provider_name,
                path: path.to_path_buf(),
                _lib: lib,
            });
        }
        Err(LoadError::Version {
            path: path.to_path_buf(),
            what: "system",
            found: last_version.unwrap_or_default(),
            need_major: MIN_SYSTEM_API.major,
            need_minor: MIN_SYSTEM_API.minor,
        })
    }
}
