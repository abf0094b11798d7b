//! What the receiver keeps of a file offered with `--resume` when its
//! session fails: the partial file under a hidden name beside the final
//! one, and a sidecar that says which source it came from and which prefix
//! of it was verified (one CRC32 per chunk, in order).
//!
//! The sidecar is a header, then one record per verified chunk (its
//! CRC32 and an HMAC-SHA256 over its number and CRC, keyed with the
//! directory's secret, see `key`), appended as the
//! chunks are made durable: the partial file is fsynced before the records
//! that cover it are appended (and the sidecar fsynced), so a record never
//! promises bytes the disk may not have. A torn or damaged record ends the
//! prefix there; a damaged header makes the whole sidecar unusable.
//!
//! `sidecar`: the record's format; `key`: the secret that tags it; `find`:
//! what is held for an offer;
//! `resumable`: writing a partial file (and the claim on it); `sweep`:
//! removing old leftovers.

mod find;
mod key;
mod resumable;
mod sidecar;
mod sweep;

pub(in crate::engine::receiver) use find::{
    Holding, KeptPrefix, OpenSidecar, copy_digest, copy_of, kept_prefix,
};
pub(in crate::engine::receiver) use key::SidecarKey;
pub(in crate::engine::receiver) use resumable::{Claim, Resumable, TempInUse, remove};
pub(in crate::engine::receiver) use sidecar::Identity;
pub(in crate::engine::receiver) use sweep::sweep;
#[cfg(test)]
pub(in crate::engine::receiver) use {
    key::KEY_NAME,
    resumable::SYNC_EVERY,
    sidecar::{Sidecar, partial_names},
};
