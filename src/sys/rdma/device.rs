//! Is there any RDMA device at all?

use super::{Result, SysError};
use rdma_sys::{ibv_free_device_list, ibv_get_device_list};

/// Returns the number of RDMA devices, or `NoDevice` when there is none.
///
/// A kernel without RDMA makes `ibv_get_device_list` return NULL with ENOSYS;
/// a kernel with RDMA but no device (or no provider library) returns an empty
/// list. Both mean the same thing to a user.
pub fn probe_devices() -> Result<usize> {
    let mut count: libc::c_int = 0;
    // SAFETY: count is a valid out-pointer; the returned list is freed below.
    let list = unsafe { ibv_get_device_list(&mut count) };
    if list.is_null() {
        return Err(SysError::NoDevice);
    }
    // SAFETY: list came from ibv_get_device_list and is freed exactly once.
    unsafe { ibv_free_device_list(list) };
    if count <= 0 {
        return Err(SysError::NoDevice);
    }
    Ok(count as usize)
}
