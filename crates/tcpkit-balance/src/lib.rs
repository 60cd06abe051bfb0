//! tcpkit-balance: `tcpkit balance`. connect() to a virtual address (VIP:port) is sent to one
//! of its backends by BPF programs attached to a cgroup v2 (cgroup/connect4 rewrites the
//! destination once, inside the system call, so nothing is paid per packet afterwards;
//! cgroup/getpeername4 shows the VIP again). `run -- CMD` puts one command and its children in
//! a fresh cgroup, attaches there with bpf_link (the links die with this process, even on
//! SIGKILL), and removes the cgroup when the command ends.
//!
//! The BPF programs are C (`bpf/balance.bpf.c`, shared structs in `bpf/balance.h`), compiled
//! by clang from build.rs and loaded by aya; the Rust side of the header is generated from it
//! (`bpf`).

pub mod attached;
pub mod bpf;
pub mod cgroup;
pub mod config;
pub mod control;
pub mod drain;
pub mod features;
pub mod file;
pub mod health;
pub mod holder;
pub mod loader;
pub mod pin;
pub mod report;
pub mod run;
pub mod status;
pub mod up;

pub use config::{Algorithm, Backend, ConfigError, HashKey, Protocol, Service};
pub use health::HealthOptions;
pub use report::RunReport;
pub use run::{run, RunError, RunOptions};
pub use status::StatusReport;
pub use up::{up, UpError, UpOptions};
pub mod table;
pub mod trace;
