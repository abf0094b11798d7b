//! rdma-xfer: file transfer over RDMA.
//!
//! Layers, bottom up:
//! - [`verbs`]: thin safe RAII wrapper over rdma-sys; all `unsafe` lives here.
//! - [`proto`]: wire codec and session state machines; pure, no I/O.
//! - [`engine`]: drives the state machines over verbs (sender pipeline,
//!   receiver ring) and the file system.
//! - `src/bin/{sender,receiver}.rs`: command line, logging, exit codes.

pub mod cli;
pub mod engine;
pub mod error;
pub mod proto;
pub mod units;
pub mod verbs;

pub use error::{ExitCode, XferError};
