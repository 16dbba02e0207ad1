//! nvml-sim's integration tests: the built `libnvml_sim.so` loaded by path, as clients load the
//! driver. One binary for every scenario: each test takes its turn with the library (see
//! `common`), and the library loads the test's scenario at its `nvmlInit`.

#![allow(
    unsafe_code,
    reason = "these tests call the NVML C ABI as its C clients do"
)]

mod common;

mod a100x4_remap;
mod bad_privileged;
mod bad_scenario;
mod clock;
mod driver_restart;
mod fabric;
mod faults;
mod gpm_h100x8;
mod gpm_pinned;
mod gpm_unsupported;
mod h100x8_pinned;
mod init_fault;
mod lifecycle;
mod mig_a100;
mod mig_h100_pinned;
mod mig_h100_reconfigure;
mod mig_unprivileged;
mod other_scenarios;
mod reload;
mod replay;
mod support_matrix;
mod xid_events;
