//! Who starts a worker process and with what command: the head itself, as its child on this
//! machine; or a launcher on another node — ssh to a host, or SLURM's `srun` inside the run's
//! allocation — whose client is the head's child. A remote worker reads the run's secret from its
//! stdin (through ssh's session or srun's stdin forwarding), never from its command line or its
//! environment, and the end of that stdin tells it that its head is gone.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;

use super::Role;
use super::auth::{SECRET_ENV, Secret};
use super::process::WorkerSpec;

/// How workers reach their parent.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    /// A Unix socket in a private directory: workers on this machine (the default).
    Unix,
    /// TCP on an interface of this machine (`cluster.listen`), a port per worker; each
    /// connection must prove it holds `secret` ([`super::auth`]) or it is refused.
    Tcp {
        listen: std::net::IpAddr,
        secret: Secret,
        launch: Launch,
    },
}

impl Transport {
    /// The remote launch of a worker started on another node (ssh, srun), if it is one.
    pub fn remote(&self) -> Option<&RemoteLaunch> {
        match self {
            Transport::Tcp {
                launch: Launch::Remote(remote),
                ..
            } => Some(remote),
            _ => None,
        }
    }

    /// Whether its remote workers keep mirrors of their host areas (no shared directory).
    pub fn mirrors(&self) -> bool {
        self.remote().is_some_and(|r| r.mirror)
    }
}

/// Who starts a worker that connects over TCP.
#[derive(Debug, Clone, PartialEq)]
pub enum Launch {
    /// This process, as its child.
    Local,
    /// A launcher on another node: the local child is its client (ssh, srun).
    Remote(RemoteLaunch),
}

/// `launcher: ssh` or `launcher: slurm` (`cluster:`).
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteLaunch {
    pub launcher: Launcher,
    /// The node of each role's workers: an ssh destination, or a node of the allocation.
    pub hosts: BTreeMap<Role, String>,
    /// `roll-tui` on the nodes, and the working directory there.
    pub program: PathBuf,
    pub dir: PathBuf,
    /// The nodes do not see the head's host areas (no `cluster.shared_dir`): each worker keeps a
    /// mirror of its role's area, kept up to date over TCP ([`super::mirror`]).
    pub mirror: bool,
}

/// The remote launcher's command and its options; the node and the worker's command follow.
#[derive(Debug, Clone, PartialEq)]
pub enum Launcher {
    Ssh(Vec<String>),
    Srun(Vec<String>),
}

impl Launcher {
    /// As events name it: `ssh`, `srun`.
    pub fn name(&self) -> &'static str {
        match self {
            Launcher::Ssh(_) => "ssh",
            Launcher::Srun(_) => "srun",
        }
    }
}

static TRANSPORT: std::sync::RwLock<Transport> = std::sync::RwLock::new(Transport::Unix);

/// The transport of the workers this process starts from now on (the run's `cluster:`).
pub fn set_transport(transport: Transport) {
    if let Ok(mut t) = TRANSPORT.write() {
        *t = transport;
    }
}

/// Whether the workers started from now on keep mirrors of their host areas: their nodes do not
/// see this machine's files (a remote launcher and no `cluster.shared_dir`).
pub fn workers_mirror() -> bool {
    transport().mirrors()
}

/// The node each role's workers run on, for the workers started from now on: the launcher's
/// hosts (`None` with every worker on this machine).
pub fn remote_hosts() -> Option<BTreeMap<Role, String>> {
    transport().remote().map(|r| r.hosts.clone())
}

pub(super) fn transport() -> Transport {
    TRANSPORT.read().map_or(Transport::Unix, |t| t.clone())
}

/// Where a worker connects: what `roll-tui worker` is told.
#[derive(Debug, Clone, PartialEq)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(std::net::SocketAddr),
}

/// The command that starts `spec`'s worker told to connect `at`: the worker itself, or the
/// launcher's client running it on its node.
pub(super) fn child_command(spec: &WorkerSpec, at: &Endpoint) -> tokio::process::Command {
    let mut env: Vec<(&str, String)> = vec![];
    if let Some(n) = spec.threads {
        env.push(("RAYON_NUM_THREADS", n.to_string()));
    }
    if let Some(device) = spec.device {
        env.push((crate::device::DEVICE_ENV, device.to_string()));
    }
    // The same kernels as this process (`ROLL_KERNELS`): a worker computes as its parent does.
    for (key, value) in crate::device::worker_env() {
        env.push((key, value.to_string()));
    }
    let mut args: Vec<String> = vec![
        "worker".into(),
        spec.role.as_str().into(),
        "--index".into(),
        spec.index.to_string(),
    ];
    match at {
        Endpoint::Unix(path) => args.extend(["--socket".into(), path.display().to_string()]),
        Endpoint::Tcp(addr) => args.extend(["--connect".into(), addr.to_string()]),
    }
    let mut command = match &spec.transport {
        Transport::Tcp {
            launch: Launch::Remote(remote),
            ..
        } => {
            // The secret comes on stdin, which also tells the worker when its head is gone.
            args.push("--secret-stdin".into());
            if spec.mirrors() {
                args.push("--mirror".into());
            }
            let node = remote.hosts.get(&spec.role).map_or("", String::as_str);
            let mut command = match &remote.launcher {
                Launcher::Ssh(ssh) => {
                    let mut command = tokio::process::Command::new(&ssh[0]);
                    command
                        .args(&ssh[1..])
                        .arg(node)
                        .arg(ssh_remote_command(remote, &env, &args));
                    command
                }
                Launcher::Srun(srun) => {
                    let mut command = tokio::process::Command::new(&srun[0]);
                    command
                        .args(&srun[1..])
                        .args(srun_options(spec, remote, node))
                        .arg(&remote.program)
                        .args(&args)
                        // srun passes its environment on to the task (`--export=ALL`).
                        .envs(env.iter().map(|(k, v)| (k, v)));
                    command
                }
            };
            command.stdin(Stdio::piped());
            command
        }
        transport => {
            let mut command = tokio::process::Command::new(&spec.program);
            if let Transport::Tcp { secret, .. } = transport {
                command.env(SECRET_ENV, secret.as_text());
            }
            command.envs(env.iter().map(|(k, v)| (k, v)));
            args.extend(["--parent".into(), std::process::id().to_string()]);
            command.args(&args).stdin(Stdio::null());
            command
        }
    };
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    command
}

/// The shell command ssh runs on the host: into the working directory, then the worker with the
/// environment it needs (nothing secret: the secret comes on stdin), every word quoted.
fn ssh_remote_command(remote: &RemoteLaunch, env: &[(&str, String)], args: &[String]) -> String {
    let quote = |w: &str| shlex::try_quote(w).map_or_else(|_| w.to_string(), |q| q.into_owned());
    let mut words = vec!["exec".to_string(), "env".into()];
    words.extend(env.iter().map(|(k, v)| quote(&format!("{k}={v}"))));
    words.push(quote(&remote.program.display().to_string()));
    words.extend(args.iter().map(|a| quote(a)));
    format!(
        "cd {} && {}",
        quote(&remote.dir.display().to_string()),
        words.join(" ")
    )
}

/// srun's options for one worker: a job step of one task on its node, inside the head's
/// allocation. `--overlap`: the step shares the node's CPUs with the head and the other workers
/// (they time-share their devices), where a step of its own would wait for CPUs no step frees;
/// the step's name says whose it is in `squeue --steps`. The CPUs a step may use are SLURM's
/// default unless `cluster.srun` says more (`--cpus-per-task`): the worker's thread count is
/// worked out on the head's machine, which need not be the node's.
fn srun_options(spec: &WorkerSpec, remote: &RemoteLaunch, node: &str) -> Vec<String> {
    vec![
        "--nodes=1".to_string(),
        "--ntasks=1".into(),
        format!("--nodelist={node}"),
        "--overlap".into(),
        "--quiet".into(),
        format!("--job-name=roll-tui-{}-{}", spec.role, spec.index),
        format!("--chdir={}", remote.dir.display()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args_of(command: &tokio::process::Command) -> Vec<String> {
        command
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn env_of(command: &tokio::process::Command, key: &str) -> Option<String> {
        command
            .as_std()
            .get_envs()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| Some(v?.to_string_lossy().into_owned()))
    }

    #[test]
    fn a_worker_with_threads_gets_them_in_its_environment() {
        let threads = |spec: &WorkerSpec| {
            env_of(
                &child_command(spec, &Endpoint::Unix("/tmp/s".into())),
                "RAYON_NUM_THREADS",
            )
        };
        let spec = WorkerSpec::new(Role::ActorInfer, 0).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(threads(&spec), None, "unset: the process decides");
        assert_eq!(threads(&spec.with_threads(3)).as_deref(), Some("3"));
    }

    /// A worker computes with its parent's kernels: the choice travels in `ROLL_KERNELS`.
    #[test]
    fn a_worker_gets_its_parents_kernels() {
        let spec = WorkerSpec::new(Role::ActorTrain, 0).unwrap_or_else(|e| panic!("{e}"));
        let command = child_command(&spec, &Endpoint::Unix("/tmp/s".into()));
        assert_eq!(
            env_of(&command, crate::device::KERNELS_ENV).as_deref(),
            Some(crate::device::kernels().as_str())
        );
        let device_of = |spec: &WorkerSpec| {
            env_of(
                &child_command(spec, &Endpoint::Unix("/tmp/s".into())),
                crate::device::DEVICE_ENV,
            )
        };
        assert_eq!(
            device_of(&spec),
            None,
            "unset: the parent's environment decides"
        );
        let placed = spec.with_device(crate::device::DeviceSpec::cuda(1));
        assert_eq!(device_of(&placed).as_deref(), Some("cuda:1"));
    }

    /// Over TCP the secret travels in the worker's environment, never on its command line (which
    /// `ps` shows on every node), and the worker is told the address to connect to.
    #[test]
    fn a_tcp_worker_gets_the_address_in_its_arguments_and_the_secret_in_its_environment() {
        let secret = Secret::generate();
        let mut spec = WorkerSpec::new(Role::Critic, 2).unwrap_or_else(|e| panic!("{e}"));
        spec.transport = Transport::Tcp {
            listen: [127, 0, 0, 1].into(),
            secret: secret.clone(),
            launch: Launch::Local,
        };
        let addr: std::net::SocketAddr = "127.0.0.1:4567".parse().expect("address");
        let command = child_command(&spec, &Endpoint::Tcp(addr));
        let args = args_of(&command);
        assert!(
            args.windows(2)
                .any(|w| w == ["--connect", "127.0.0.1:4567"]),
            "{args:?}"
        );
        assert!(
            !args.iter().any(|a| a.contains(secret.as_text())),
            "{args:?}"
        );
        assert_eq!(
            env_of(&command, SECRET_ENV).as_deref(),
            Some(secret.as_text())
        );
    }

    fn remote_spec(launcher: Launcher, secret: &Secret) -> WorkerSpec {
        let mut spec = WorkerSpec::new(Role::Reference, 0)
            .unwrap_or_else(|e| panic!("{e}"))
            .with_threads(4);
        spec.transport = Transport::Tcp {
            listen: [10, 0, 0, 1].into(),
            secret: secret.clone(),
            launch: Launch::Remote(RemoteLaunch {
                launcher,
                hosts: [(Role::Reference, "gpu-2".to_string())].into(),
                program: "/opt/roll tui/roll-tui".into(),
                dir: "/home/me/my runs".into(),
                mirror: false,
            }),
        };
        spec
    }

    /// ssh runs one shell command on the host: into the working directory, then the worker with
    /// its environment, every word quoted (a path with a space stays one word); the secret is
    /// not in it (it comes on stdin).
    #[test]
    fn the_ssh_command_quotes_every_word_and_carries_no_secret() {
        let secret = Secret::generate();
        let ssh = Launcher::Ssh(vec!["ssh".into(), "-p".into(), "2222".into()]);
        let spec = remote_spec(ssh, &secret);
        let addr: std::net::SocketAddr = "10.0.0.1:4567".parse().expect("address");
        let command = child_command(&spec, &Endpoint::Tcp(addr));
        assert_eq!(command.as_std().get_program(), "ssh");
        let args = args_of(&command);
        assert_eq!(args[..3], ["-p", "2222", "gpu-2"]);
        assert_eq!(
            args[3],
            format!(
                "cd '/home/me/my runs' && exec env 'RAYON_NUM_THREADS=4' 'ROLL_KERNELS={}' \
                 '/opt/roll tui/roll-tui' worker reference --index 0 --connect 10.0.0.1:4567 \
                 --secret-stdin",
                crate::device::kernels().as_str()
            )
        );
        assert!(!args.iter().any(|a| a.contains(secret.as_text())));
        assert!(command.as_std().get_envs().all(|(k, _)| k != SECRET_ENV));
    }

    /// srun starts a one-task step on the role's node of the allocation, in the working
    /// directory, overlapping the other steps; the worker's environment is srun's (which it
    /// exports to the task) and the secret is in neither its arguments nor its environment.
    #[test]
    fn the_srun_command_runs_one_task_on_the_roles_node_and_carries_no_secret() {
        let secret = Secret::generate();
        let srun = Launcher::Srun(vec!["srun".into(), "--partition=gpu".into()]);
        let spec = remote_spec(srun, &secret);
        let addr: std::net::SocketAddr = "10.0.0.1:4567".parse().expect("address");
        let command = child_command(&spec, &Endpoint::Tcp(addr));
        assert_eq!(command.as_std().get_program(), "srun");
        assert_eq!(
            args_of(&command),
            [
                "--partition=gpu",
                "--nodes=1",
                "--ntasks=1",
                "--nodelist=gpu-2",
                "--overlap",
                "--quiet",
                "--job-name=roll-tui-reference-0",
                "--chdir=/home/me/my runs",
                "/opt/roll tui/roll-tui",
                "worker",
                "reference",
                "--index",
                "0",
                "--connect",
                "10.0.0.1:4567",
                "--secret-stdin",
            ]
        );
        assert_eq!(env_of(&command, "RAYON_NUM_THREADS").as_deref(), Some("4"));
        assert!(command.as_std().get_envs().all(|(k, _)| k != SECRET_ENV));
    }
}
