//! `cluster:`: how a run's worker processes reach the head process — over TCP on a network
//! interface, each connection authenticated with the run's secret (`src/worker/auth.rs`) —
//! instead of the Unix sockets of a run on one machine, and who starts them: the head itself, ssh
//! on the hosts named, or SLURM's `srun` on the nodes of the allocation the head runs in.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::Role;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// How workers are started.
    #[serde(default)]
    pub launcher: Launcher,
    /// The address of this machine's interface the head listens on for its workers' control
    /// connections (a port per worker, chosen by the system); every worker host must reach it.
    #[serde(default = "loopback")]
    pub listen: IpAddr,
    /// `launcher: ssh`: the hosts (ssh destinations, `user@name` or a `~/.ssh/config` alias).
    #[serde(default)]
    pub hosts: Vec<String>,
    /// The host each role's workers run on (default: the first host): with `launcher: slurm`, a
    /// node of the allocation (default: its first node).
    #[serde(default)]
    pub role_hosts: BTreeMap<Role, String>,
    /// `launcher: ssh`: the ssh command and its options; the host and the remote command follow.
    #[serde(default = "default_ssh")]
    pub ssh: Vec<String>,
    /// `launcher: slurm`: the srun command and its options (a partition, CPUs per task); each
    /// worker's step options and command follow.
    #[serde(default = "default_srun")]
    pub srun: Vec<String>,
    /// `launcher: ssh | slurm`: the `roll-tui` executable on the hosts (default: this one's path).
    #[serde(default)]
    pub remote_program: Option<PathBuf>,
    /// `launcher: ssh | slurm`: the working directory on the hosts (default: this one), where the
    /// config's relative paths (models, datasets) must mean what they mean here.
    #[serde(default)]
    pub remote_dir: Option<PathBuf>,
    /// Where the head writes what workers read and write — offloaded weights, each call's rows
    /// and results — a directory every host sees at this path (a shared filesystem). Default:
    /// `/dev/shm` on the head, which only workers on the head's machine see.
    #[serde(default)]
    pub shared_dir: Option<PathBuf>,
}

fn loopback() -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
}

fn default_srun() -> Vec<String> {
    vec!["srun".into()]
}

fn default_ssh() -> Vec<String> {
    // Never wait for a password or a host-key question, nor long for a host that is gone: fail
    // instead, naming the host.
    ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
        .map(String::from)
        .to_vec()
}

/// Who starts the worker processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Launcher {
    /// The head, as child processes on its own machine.
    #[default]
    Local,
    /// ssh to `hosts`, one session per worker.
    Ssh,
    /// srun inside the SLURM allocation the head runs in (`salloc`, `sbatch`), one job step per
    /// worker on its role's node.
    Slurm,
}

impl ClusterConfig {
    /// What is wrong with it, in `p`.
    pub fn validate(&self, p: &mut Vec<String>) {
        if self.listen.is_unspecified() {
            p.push(format!(
                "cluster.listen {}: name the interface's own address (workers connect to it), \
                 not the wildcard",
                self.listen
            ));
        }
        match self.launcher {
            Launcher::Local => {
                if !self.hosts.is_empty() || !self.role_hosts.is_empty() {
                    p.push(
                        "cluster.hosts and cluster.role_hosts are for launcher: ssh or slurm \
                         (launcher: local starts every worker on this machine)"
                            .into(),
                    );
                }
            }
            Launcher::Slurm => {
                if !self.hosts.is_empty() {
                    p.push(
                        "cluster.hosts is for launcher: ssh (launcher: slurm runs workers on the \
                         nodes of the allocation; cluster.role_hosts picks among them)"
                            .into(),
                    );
                }
                if self.srun.is_empty() {
                    p.push("cluster.srun must name the srun command".into());
                }
            }
            Launcher::Ssh => {
                if self.hosts.is_empty() {
                    p.push("cluster.launcher ssh needs cluster.hosts (one or more)".into());
                }
                if self.ssh.is_empty() {
                    p.push("cluster.ssh must name the ssh command".into());
                }
                for (role, host) in &self.role_hosts {
                    if !self.hosts.contains(host) {
                        p.push(format!(
                            "cluster.role_hosts.{role}: '{host}' is not one of cluster.hosts ({})",
                            self.hosts.join(", ")
                        ));
                    }
                }
            }
        }
    }

    /// The host `role`'s workers run on, among `hosts` (`launcher: ssh`: `cluster.hosts`;
    /// `launcher: slurm`: the allocation's nodes).
    pub fn host_of<'a>(&'a self, role: Role, hosts: &'a [String]) -> Option<&'a str> {
        self.role_hosts
            .get(&role)
            .or(hosts.first())
            .map(String::as_str)
    }
}
