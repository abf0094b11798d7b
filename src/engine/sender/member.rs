//! A file of a BATCH: its offer and its open file, the reader's input for
//! a batch's files, and the way back to an entry sent on its own.

use super::{FileError, SenderConfig};
use crate::engine::entries::Entry;
use crate::engine::reader::{BatchFile, Input};
use crate::error::XferError;
use crate::proto::FileOffer;
use std::fs::File;

/// A batch file, opened and measured.
pub(super) struct Member {
    path: std::path::PathBuf,
    pub(super) offer: FileOffer,
    file: File,
}

/// The reader's input for `members`: their files back to back.
pub(super) fn input(members: &[Member]) -> Result<Input, FileError> {
    let files = members
        .iter()
        .map(|m| {
            m.file.try_clone().map(|file| BatchFile {
                file,
                size: m.offer.size,
                name: m.offer.name.clone(),
            })
        })
        .collect::<Result<_, _>>()
        .map_err(|e| XferError::io("cannot read a file of a batch", e))?;
    Ok(Input::Batch(files))
}

impl Member {
    /// Back to an entry (its file stays open) to be sent on its own.
    pub(super) fn into_entry(self) -> Entry {
        Entry::File {
            path: self.path,
            size: self.offer.size,
            name: self.offer.name,
            opened: Some(self.file),
            mtime: self.offer.mtime,
        }
    }
}

/// Opens (unless opened already) and measures a file of a batch.
pub(super) fn open_member(
    cfg: &SenderConfig,
    path: &std::path::Path,
    name: String,
    opened: Option<File>,
    mtime: Option<crate::proto::Mtime>,
) -> Result<Member, XferError> {
    let (mut offer, file) = super::open_offer(cfg, path, name, opened, mtime)?;
    // Never resumed (batchable() sends no file of a --resume run here);
    // CHECKSUM stays: the receiver refuses the batch if it would ask one
    // of its files for a digest, and then asks that file alone.
    offer.resume = false;
    Ok(Member {
        path: path.to_path_buf(),
        offer,
        file,
    })
}
