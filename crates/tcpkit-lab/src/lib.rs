//! tcpkit-lab: the network-namespace lab used by tcpkit's integration tests, benchmarks and
//! README demo.
//!
//! A [`Lab`] creates hosts (network namespaces named `tk<pid>x<n><name>`), joins them with
//! veth [`Link`]s (addressed from 198.18.0.0/15 and fd00::/8 only, optionally shaped with
//! tbf), runs processes and captures inside them, and removes all of it on drop, also when
//! the test panicked. Leftovers of killed runs are swept by the next lab
//! ([`sweep_leftovers`]). The root namespace is never modified, except through the guards a
//! test asks for ([`Cgroup`], [`Bpffs`], [`KillOnDrop`]), which undo themselves on drop and
//! fail the test when they cannot.
//!
//! The lab drives iproute2 (`ip`, `tc`), `ethtool`, `tcpdump` and sshd; tests use the lab
//! instead of calling them by hand. A [`Fleet`] is a controller, agents and servers on one
//! LAN ([`Lab::lan`]), reached over SSH ([`Lab::sshd`]) by ansible-playbook as machines are.
//! TLS peers: a [`TestCa`] made per test issues certificates (valid, expired, for other names)
//! that unbound ([`Lab::unbound`]: DNS, DoT, DoH) and nginx ([`Lab::nginx`]: HTTPS, HTTP/2)
//! present.
//!
//! ```no_run
//! # fn main() -> Result<(), tcpkit_lab::LabError> {
//! let (_lab, a, _b, _link) = tcpkit_lab::Lab::pair("doc")?;
//! a.run(&["ping", "-c1", "198.18.0.2"])?;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod cmd;
pub mod corpus;
mod error;
mod fleet;
mod guard;
mod host;
mod lab;
mod link;
mod nginx;
mod proc;
mod sides;
mod ssh;
mod sweep;
mod tcpdump;
mod tls;
mod topology;
mod unbound;

pub use error::LabError;
pub use fleet::{
    Fleet, Member, ANSIBLE_BIN, GROUP_AGENTS, GROUP_CONTROLLER, GROUP_SERVERS, SSH_PORT,
};
pub use guard::{Bpffs, Cgroup, KillOnDrop};
pub use host::Host;
pub use lab::{Lab, KEEP_ENV};
pub use link::{in_test_range, IfStats, Iface, Link, LinkOpts, Tbf, IFNAME_MAX};
pub use nginx::{Nginx, NginxConf, INDEX_HTML_LEN, NGINX};
pub use proc::{Proc, STOP_GRACE};
pub use sides::client_server_runs;
pub use ssh::{SshKeys, SSHD};
pub use sweep::{netns_name, owner_pid, sweep_leftovers, NETNS_PREFIX};
pub use tcpdump::{Capture, Tcpdump};
pub use tls::{CertKey, Purpose, TestCa, Validity, OPENSSL};
pub use topology::{
    LAN_MAX, LAN_NET, MULTIPATH_A4, MULTIPATH_A6, MULTIPATH_B4, MULTIPATH_B6, MULTIPATH_MAX,
};
pub use unbound::{Unbound, UnboundConf, DOH_PATH, UNBOUND, WWW_EXAMPLE, WWW_EXAMPLE_A};

/// Re-exported so callers can name signals for [`Proc::signal`] without their own nix.
pub use nix::sys::signal::Signal;
