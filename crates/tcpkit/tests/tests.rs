//! The binary's integration tests, linked into one test binary (as ripgrep does): each file
//! here is a module of it, so the suite links once instead of once per file. A file's tests
//! run with `cargo test -p tcpkit --test integration -- FILE::`.

mod common;
mod copy_common;

mod bad_input;
mod balance;
mod contract;
mod copy;
mod copy_check;
mod copy_faults;
mod copy_metrics;
mod copy_modes;
mod copy_on_target;
mod copy_server_first;
mod copy_transparent;
mod copy_transparent_faults;
mod copy_transparent_multi;
mod deploy_kubernetes;
mod docs;
mod echo;
mod echo_hostile;
mod exit_rule;
mod fleet_ansible;
mod fleet_barrier;
mod intercept_hostile;
mod load;
mod load_contract;
mod load_h2;
mod load_plot;
mod load_scale;
mod load_tls;
mod load_tls_h2;
mod load_tls_peers;
mod load_unbound;
mod load_usage;
mod load_wrk;
mod merge_bad_input;
mod merge_fleet;
mod mpcat;
mod mpcat_abort;
mod mpcat_duplex;
mod mpcat_mptcp;
mod mpcat_nc;
mod mpcat_paths;
mod mpcat_secure;
mod package;
mod replay_contract;
mod replay_features;
mod replay_intf2;
mod replay_rate;
mod replay_wire;
mod replay_xdp;
mod rewrite_oracle;
mod shard;
mod tune;
