//! `tcpkit load`, `echo`, `tune` and `merge`: find the limit of a TCP server with many
//! clients. `load` opens connections and sends queries on an open-loop schedule
//! (`tcpkit-pace`), measuring each answer's latency from its intended send time
//! (`tcpkit-stats`); `echo` is the reference server; `tune` explains the host limits that stop
//! either from holding many connections; `merge` joins the reports of several client hosts.
//! Each job's report lives here with it: [`report`] is load's (the one `merge` reads and
//! writes), `echo` and `tune` keep theirs in their own modules.

pub mod echo;
pub mod loadgen;
pub mod merge;
mod nofile;
pub mod report;
mod run_id;
pub mod series;
pub mod tls_report;
pub mod tune;

pub use nofile::raise_nofile_limit;
