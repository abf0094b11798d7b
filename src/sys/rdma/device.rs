//! Which RDMA devices are there at all?

use super::{Result, SysError};
use rdma_sys::{ibv_free_device_list, ibv_get_device_list, ibv_get_device_name};
use std::ffi::CStr;

/// Returns the names of the RDMA devices (`rxe0`, `mlx5_0`...), or
/// `NoDevice` when there is none.
///
/// A kernel without RDMA makes `ibv_get_device_list` return NULL with ENOSYS;
/// a kernel with RDMA but no device (or no provider library) returns an empty
/// list. Both mean the same thing to a user.
pub fn probe_devices() -> Result<Vec<String>> {
    let mut count: libc::c_int = 0;
    // SAFETY: count is a valid out-pointer; the returned list is freed below.
    let list = unsafe { ibv_get_device_list(&mut count) };
    if list.is_null() {
        return Err(SysError::no_device());
    }
    let mut names = Vec::with_capacity(count.max(0) as usize);
    for i in 0..count.max(0) as usize {
        // SAFETY: the list holds `count` valid device pointers (NULL-terminated
        // after them) until it is freed below.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: dev is a device of the live list; the name it returns is a
        // NUL-terminated string owned by the device, copied out at once.
        let name = unsafe { ibv_get_device_name(dev) };
        if !name.is_null() {
            // SAFETY: name is non-NULL and NUL-terminated (see above).
            names.push(
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    // SAFETY: list came from ibv_get_device_list and is freed exactly once.
    unsafe { ibv_free_device_list(list) };
    if names.is_empty() {
        return Err(SysError::no_device());
    }
    Ok(names)
}
