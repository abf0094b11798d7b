//! Standard input and output as pipes, on both tools.

use std::fs::File;
use tracing::debug;

/// A pipe as big as a chunk (when `fd` is one), for fewer wake-ups.
pub(crate) fn grow_pipe(fd: &impl std::os::fd::AsFd, chunk: usize) {
    let is_fifo = File::from(match fd.as_fd().try_clone_to_owned() {
        Ok(f) => f,
        Err(_) => return,
    })
    .metadata()
    .map(|m| std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()))
    .unwrap_or(false);
    if is_fifo {
        match crate::sys::os::set_pipe_size(fd, chunk.min(1 << 20)) {
            Ok(n) => debug!(bytes = n, "pipe buffer"),
            Err(e) => debug!("pipe buffer left as it is: {e}"),
        }
    }
}
