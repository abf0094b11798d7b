//! The protection domain: every MR and QP of a connection belongs to one.

use super::Result;
use super::SysError;
use super::cm::CmId;
use rdma_sys::*;
use std::rc::Rc;

/// A protection domain on the device of a CM id.
pub struct ProtectionDomain {
    raw: *mut ibv_pd,
    _id: Rc<CmId>,
}

impl ProtectionDomain {
    /// Allocates a PD on the device `id` is bound to.
    pub fn new(id: &Rc<CmId>) -> Result<Rc<Self>> {
        let ctx = id.context()?;
        // SAFETY: ctx is the live verbs context of a bound id.
        let raw = unsafe { ibv_alloc_pd(ctx) };
        if raw.is_null() {
            return Err(SysError::last_os("ibv_alloc_pd"));
        }
        Ok(Rc::new(ProtectionDomain {
            raw,
            _id: id.clone(),
        }))
    }

    pub(crate) fn raw(&self) -> *mut ibv_pd {
        self.raw
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every MR and the QP hold an Rc of this PD, so they are gone.
        let rc = unsafe { ibv_dealloc_pd(self.raw) };
        if rc != 0 {
            // EBUSY after a leaked registration (see Registration's drop):
            // the PD leaks with it.
            tracing::warn!(
                "ibv_dealloc_pd failed: {} (the protection domain is leaked)",
                std::io::Error::from_raw_os_error(rc)
            );
        }
    }
}
