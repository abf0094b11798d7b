//! The RDMA test suites, one binary with a module each (`make e2e` runs
//! it, scripts/e2e.sh): the built tools, and the verbs wrapper, on a real
//! RDMA stack (SoftRoCE in the QEMU guest of scripts/guest/run.sh, or a host
//! that has an RDMA device). docs/testing.md says what each suite covers.
//! The tests run one at a time (`--test-threads=1`): the guest has 2 vCPUs
//! and parallel transfers would only measure contention.

#[path = "../support/mod.rs"]
mod support;

mod auth;
mod deb;
mod dry_run;
mod e2e;
mod faults;
mod hostile;
mod json;
mod lanes;
mod memlock;
mod peers;
mod pipes;
mod policies;
mod relay;
mod reruns;
mod resume;
mod sessions;
mod ssh;
mod verbs;
