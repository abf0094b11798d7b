//! Thin safe wrapper over `rdma-sys` (libibverbs + librdmacm).
//!
//! Resources are RAII types; children hold `Rc`s of their parents so that
//! Drop always runs in a legal order (QP before CQ and PD, MR before PD, CM
//! id before its event channel), on success and on every error path.
//!
//! Memory the NIC uses is never reachable from safe code while the NIC may
//! use it:
//! - Local registered memory is a [`BufferPool`] of equal slots, each owned
//!   by one [`Buffer`] token. Safe code reads or writes a slot only through
//!   a borrow of its token (and of the pool). Posting a request *moves* the
//!   token into the endpoint; only the request's completion gives it back
//!   ([`Completion::buffer`]), and the endpoint keeps the memory alive (and
//!   registered) until then or until its QP is destroyed.
//! - Memory the peer may write ([`RemoteRing`]) has no `&[u8]` view at all:
//!   the NIC may change it at any moment. It is copied out with raw-pointer
//!   operations, and its real address is never sent to the peer (it is
//!   registered at a random I/O virtual address).

mod cm;
mod device;
mod inventory;
mod memory;
mod pd;
mod queue;

pub use crate::sys::{Result, SysError};
pub use cm::{CmEventKind, CmId, ConnectRequest, EventChannel, IncomingConnection};
pub use device::probe_devices;
#[cfg(test)]
pub(crate) use inventory::tests as inventory_fixtures;
pub use inventory::{DRIVER_MODULES, Device, DeviceFile, Gid, Inventory, Port, devices};
pub use memory::{Buffer, BufferFiller, BufferPool, RemoteRing, ring_copy};
pub use pd::ProtectionDomain;
pub use queue::{Completion, Endpoint, QpCaps, RemoteTarget, WcOpcode};
