//! `cluster:`: how a run's worker processes reach the head process — over TCP on a network
//! interface, each connection authenticated with the run's secret (`crate::worker::auth`) —
//! instead of the Unix sockets of a run on one machine.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// How workers are started.
    #[serde(default)]
    pub launcher: Launcher,
    /// The address of this machine's interface the head listens on for its workers' control
    /// connections (a port per worker, chosen by the system).
    #[serde(default = "loopback")]
    pub listen: IpAddr,
}

fn loopback() -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
}

/// Who starts the worker processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Launcher {
    /// The head, as child processes on its own machine.
    #[default]
    Local,
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
    }
}
