//! Every FFI call and system call of the crate, behind safe types: the one
//! module allowed `unsafe` code (lib.rs denies it everywhere else). Each
//! `unsafe` block states why it is sound in a `// SAFETY:` comment (clippy's
//! `undocumented_unsafe_blocks` is denied).
//!
//! - [`rdma`]: the verbs and rdma_cm wrapper over rdma-sys (RAII resources,
//!   registered memory, posting that takes ownership of the buffer).
//! - [`os`]: waiting on descriptors, shutdown signals, resource limits.
//! - [`dirfd`]: directory-relative file operations that never follow links.
#![deny(missing_docs)]

pub mod dirfd;
mod error;
#[allow(unsafe_code)]
pub mod os;
#[allow(unsafe_code)]
pub mod rdma;

pub use error::{Result, SysError};
