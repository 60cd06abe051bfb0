//! The fleet lab: many hosts driven by an engine over SSH, as a fleet of machines is. One
//! controller host (where ansible-playbook or a shell loop runs), agent hosts and server
//! hosts on one [`Lab::lan`], an sshd in every agent and server ([`Lab::sshd`], keys made for
//! the lab), and what ansible-playbook needs to reach them: an inventory of the three groups
//! `deploy/ansible` plays on, and the command that runs a playbook inside the controller with
//! every file ansible keeps (ssh control sockets, temporary files) inside the lab's directory,
//! so fleets built side by side in one process never share a connection.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Map, Value};

use crate::{Host, Lab, LabError, Proc, SshKeys};

/// The port every lab sshd listens on (each host has a namespace, so one port serves all).
pub const SSH_PORT: u16 = 22022;

/// Where scripts/setup.sh installs ansible-core (a venv: Debian 12's pip refuses system
/// installs).
pub const ANSIBLE_BIN: &str = "/opt/tcpkit-ansible/bin";

/// The inventory groups of `deploy/ansible/fleet.yml`.
pub const GROUP_CONTROLLER: &str = "tcpkit_controller";
/// Hosts that run `tcpkit load` (or `copy`), one shard each.
pub const GROUP_AGENTS: &str = "tcpkit_agents";
/// Hosts that run the server under test (`tcpkit echo`).
pub const GROUP_SERVERS: &str = "tcpkit_servers";

/// One host of the fleet: its inventory name, its namespace and its LAN address.
#[derive(Debug, Clone)]
pub struct Member {
    /// The inventory name (`agent1`, `server1`, `controller`), also the lab host's name.
    pub name: String,
    /// The lab host.
    pub host: Host,
    /// Its address on the LAN.
    pub addr: Ipv4Addr,
}

/// A controller, agents and servers on one LAN, the agents and servers reachable over SSH.
#[derive(Debug)]
pub struct Fleet {
    /// The lab owning every namespace and process (sshd included): dropped, it removes all.
    pub lab: Lab,
    /// Where the engine runs (`ansible_connection: local` in the inventory).
    pub controller: Member,
    /// `agent1` ... `agentN`.
    pub agents: Vec<Member>,
    /// `server1` ... `serverM`.
    pub servers: Vec<Member>,
    /// The lab's SSH keys.
    pub keys: SshKeys,
    /// The sshd of each agent and server, in that order.
    pub sshd: Vec<Proc>,
    known_hosts: PathBuf,
}

impl Fleet {
    /// A new fleet lab of `agents` agents and `servers` servers, their sshd listening.
    pub fn new(tag: &str, agents: usize, servers: usize) -> Result<Fleet, LabError> {
        let mut lab = Lab::new(tag)?;
        let mut names = vec!["controller".to_string()];
        names.extend((1..=agents).map(|i| format!("agent{i}")));
        names.extend((1..=servers).map(|i| format!("server{i}")));
        let hosts = names
            .iter()
            .map(|n| lab.host(n))
            .collect::<Result<Vec<_>, _>>()?;
        let addrs = lab.lan(&hosts.iter().collect::<Vec<_>>())?;
        let mut members = names
            .into_iter()
            .zip(hosts)
            .zip(addrs)
            .map(|((name, host), addr)| Member { name, host, addr });
        let controller = members.next().expect("the controller is first");
        let managed: Vec<Member> = members.collect();
        let keys = SshKeys::new(&lab.dir().join("ssh"))?;
        let mut sshd = Vec::with_capacity(managed.len());
        let mut ends = Vec::with_capacity(managed.len());
        for m in &managed {
            let at = SocketAddr::from((m.addr, SSH_PORT));
            sshd.push(lab.sshd(&m.host, &keys, at)?);
            ends.push(at);
        }
        let known_hosts = keys.known_hosts(&ends)?;
        let mut managed = managed.into_iter();
        let agents = managed.by_ref().take(agents).collect();
        let servers = managed.collect();
        Ok(Fleet {
            lab,
            controller,
            agents,
            servers,
            keys,
            sshd,
            known_hosts,
        })
    }

    /// The file naming every sshd's address with the lab's host key.
    pub fn known_hosts(&self) -> &Path {
        &self.known_hosts
    }

    /// The member named `name` (inventory name).
    pub fn member(&self, name: &str) -> Option<&Member> {
        std::iter::once(&self.controller)
            .chain(&self.agents)
            .chain(&self.servers)
            .find(|m| m.name == name)
    }

    /// The ssh options of every connection: the lab's known_hosts, checked, and no other
    /// configuration (ansible adds the user, key, port and its control socket).
    fn ssh_common_args(&self) -> String {
        format!(
            "-F /dev/null -o IdentitiesOnly=yes -o UserKnownHostsFile={} -o StrictHostKeyChecking=yes",
            self.known_hosts.display()
        )
    }

    /// Writes an inventory (YAML's JSON subset) of the three groups to `path`: the controller
    /// as `ansible_connection: local`, agents and servers over SSH as root with the lab's key.
    /// `vars` (an object) goes into `all.vars`; `host_vars` adds variables to single hosts;
    /// `more_groups` adds groups of members named (copy.yml's `tcpkit_online`).
    pub fn inventory(
        &self,
        path: &Path,
        vars: &Value,
        host_vars: &[(&str, Value)],
        more_groups: &[(&str, &[&str])],
    ) -> Result<(), LabError> {
        let remote = |m: &Member| -> (String, Value) {
            let mut v = json!({
                "ansible_host": m.addr.to_string(),
                "ansible_port": SSH_PORT,
                "ansible_user": "root",
                "ansible_ssh_private_key_file": self.keys.client_key(),
                "ansible_ssh_common_args": self.ssh_common_args(),
                "ansible_python_interpreter": "/usr/bin/python3",
                "lab_addr": m.addr.to_string(),
            });
            add_host_vars(&mut v, &m.name, host_vars);
            (m.name.clone(), v)
        };
        let group = |ms: &[Member]| -> Value {
            json!({ "hosts": ms.iter().map(remote).collect::<Map<String, Value>>() })
        };
        let mut ctl = json!({
            "ansible_connection": "local",
            "ansible_python_interpreter": "{{ ansible_playbook_python }}",
            "lab_addr": self.controller.addr.to_string(),
        });
        add_host_vars(&mut ctl, &self.controller.name, host_vars);
        let mut children = json!({
            GROUP_CONTROLLER: { "hosts": { &self.controller.name: ctl } },
            GROUP_AGENTS: group(&self.agents),
            GROUP_SERVERS: group(&self.servers),
        });
        for (g, names) in more_groups {
            // A host's variables are set where it is first listed; here it is only named.
            let hosts: Map<String, Value> =
                names.iter().map(|n| (n.to_string(), json!({}))).collect();
            children[*g] = json!({ "hosts": hosts });
        }
        let inv = json!({ "all": { "vars": vars, "children": children } });
        let text = serde_json::to_string_pretty(&inv)
            .map_err(|e| LabError::invalid(format!("inventory: {e}")))?;
        std::fs::write(path, text).map_err(|e| LabError::io(format!("write {}", path.display()), e))
    }

    /// `ansible-playbook ARGS` inside the controller, not started: ansible's ssh control
    /// sockets and local temporary files in directories of this lab (two fleets in one
    /// process would otherwise share a master connection to the same address and port, which
    /// is another namespace's sshd), colour off, `config` as its ansible.cfg.
    pub fn ansible_playbook(&self, config: &Path, args: &[&str]) -> Result<Command, LabError> {
        let bin = format!("{ANSIBLE_BIN}/ansible-playbook");
        if !Path::new(&bin).exists() {
            return Err(LabError::invalid(format!(
                "{bin} is not installed (scripts/setup.sh installs ansible-core there)"
            )));
        }
        let cp = self.lab.dir().join("cp");
        let tmp = self.lab.dir().join("ansible-tmp");
        for d in [&cp, &tmp] {
            std::fs::create_dir_all(d)
                .map_err(|e| LabError::io(format!("create {}", d.display()), e))?;
        }
        let mut argv = vec![bin.as_str()];
        argv.extend_from_slice(args);
        let mut c = self.controller.host.command(&argv);
        c.env("ANSIBLE_CONFIG", config)
            .env("ANSIBLE_SSH_CONTROL_PATH_DIR", &cp)
            .env("ANSIBLE_LOCAL_TEMP", &tmp)
            .env("ANSIBLE_NOCOLOR", "1")
            .env("ANSIBLE_FORCE_COLOR", "0")
            .env("ANSIBLE_RETRY_FILES_ENABLED", "0");
        Ok(c)
    }
}

fn add_host_vars(v: &mut Value, name: &str, host_vars: &[(&str, Value)]) {
    for (h, extra) in host_vars {
        if *h != name {
            continue;
        }
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
    }
}
