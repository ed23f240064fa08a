//! The parent side of a worker: spawn `roll-tui worker ROLE` from the current executable in its own
//! process group, accept its connection, shake hands, then run four small tasks — writer, reader
//! (replies and pongs), heartbeat (pings; silence is reported) and exit watcher (exit status; pending
//! calls fail at once). Everything that happens is a [`WorkerEvent`] for the caller to store and show.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::auth::Secret;
pub use super::launch::{Endpoint, Launch, Launcher, RemoteLaunch, Transport, set_transport};
use super::launch::{child_command, transport};
use super::mirror::{MirrorLink, Moved};
use super::protocol::{
    Channel, FromWorker, Payload, ProtocolError, ToWorker, challenge, handshake_parent,
};
use super::{Role, WorkerError};

static PROGRAM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// How long a mirror transfer may make no progress before it fails (a node gone mid-transfer).
const MIRROR_STALL: Duration = Duration::from_secs(60);

/// How long a TCP connection has to prove the secret before it is refused.
const PROOF_WAIT: Duration = Duration::from_secs(2);

/// A control connection of either transport.
pub trait Connection: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Connection for T {}

/// Programs that embed the pipeline but are not `roll-tui` (test harnesses, other front-ends) name
/// the `roll-tui` executable their worker processes run. The first call wins; returns whether this
/// one did.
pub fn set_worker_program(program: impl Into<PathBuf>) -> bool {
    PROGRAM.set(program.into()).is_ok()
}

/// How to start one worker.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    pub role: Role,
    pub index: usize,
    /// The executable to run (`roll-tui` itself unless a test says otherwise).
    pub program: PathBuf,
    pub connect_timeout: Duration,
    /// Ping period; a worker silent for `silence_limit` is reported unresponsive.
    pub heartbeat: Duration,
    pub silence_limit: Duration,
    /// Compute threads of the process (`RAYON_NUM_THREADS`, which candle's CPU kernels and
    /// matrix products read); `None`: the process decides (every core).
    pub threads: Option<usize>,
    /// The device the worker computes on where no call of its role names one (the reward role's
    /// judge models): `ROLL_DEVICE` in its environment (`crate::device::tool_device`).
    pub device: Option<crate::device::DeviceSpec>,
    pub transport: Transport,
    /// The role's host area on this machine (`src/scheduler/host_copy.rs`): what a
    /// worker on a node that does not see it mirrors ([`super::mirror`]).
    pub area: Option<PathBuf>,
    /// Files of the area (relative to it) that a mirroring worker keeps to itself.
    pub worker_only: Vec<PathBuf>,
}

/// The `roll-tui` executable that child processes run: this one, or the one
/// [`set_worker_program`] named.
pub fn worker_program() -> std::io::Result<PathBuf> {
    match PROGRAM.get() {
        Some(p) => Ok(p.clone()),
        None => std::env::current_exe(),
    }
}

impl WorkerSpec {
    /// A worker of `role` running this executable (or the one [`set_worker_program`] named), with
    /// default timings (connect 20 s, ping every second, unresponsive after 5 s of silence).
    pub fn new(role: Role, index: usize) -> std::io::Result<Self> {
        let program = worker_program()?;
        Ok(WorkerSpec {
            role,
            index,
            program,
            connect_timeout: Duration::from_secs(20),
            heartbeat: Duration::from_secs(1),
            silence_limit: Duration::from_secs(5),
            threads: None,
            device: None,
            transport: transport(),
            area: None,
            worker_only: vec![],
        })
    }

    /// The same worker exchanging files with its role through the host area `dir`; a mirroring
    /// worker keeps the files `worker_only` names (relative to `dir`) to itself: state the head
    /// never reads, such as a trainer's offloaded weights and moments, which die with it.
    pub fn with_area(self, dir: &std::path::Path, worker_only: &[&str]) -> Self {
        WorkerSpec {
            area: Some(dir.to_path_buf()),
            worker_only: worker_only.iter().map(PathBuf::from).collect(),
            ..self
        }
    }

    /// Whether the worker keeps a mirror of its role's host area (a remote one that does not
    /// see it).
    pub fn mirrors(&self) -> bool {
        self.area.is_some() && self.transport.mirrors()
    }

    /// The same worker computing on `device` where its calls name none.
    pub fn with_device(self, device: crate::device::DeviceSpec) -> Self {
        WorkerSpec {
            device: Some(device),
            ..self
        }
    }

    /// The same worker with `threads` compute threads.
    pub fn with_threads(self, threads: usize) -> Self {
        WorkerSpec {
            threads: Some(threads),
            ..self
        }
    }
}

/// Something that happened to a worker.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerEvent {
    Started {
        role: Role,
        index: usize,
        pid: u32,
        /// How it is connected: `unix socket`, or `tcp ADDRESS` (the head's port it reached).
        via: String,
        /// The node a launcher started it on (`None`: this machine).
        node: Option<String>,
    },
    /// One line the worker wrote to stdout or stderr.
    Log {
        role: Role,
        index: usize,
        stream: &'static str,
        line: String,
    },
    /// A TCP connection to the worker's port that did not prove the run's secret, dropped.
    Refused {
        role: Role,
        index: usize,
        peer: String,
        reason: String,
    },
    /// No pong for this long (reported once per silence).
    Unresponsive {
        role: Role,
        index: usize,
        silent_s: f64,
    },
    Exited {
        role: Role,
        index: usize,
        pid: u32,
        status: String,
        /// After a requested shutdown.
        expected: bool,
    },
}

/// Calls waiting for replies, and whether the process has exited: one lock, so a call can never be
/// registered after the exit watcher has failed the others (it would wait for its timeout).
#[derive(Default)]
struct Calls {
    waiting: HashMap<u64, oneshot::Sender<Result<Payload, String>>>,
    exited: Option<String>,
}

type Pending = Arc<Mutex<Calls>>;

/// A running worker process. Dropping it kills the process group.
pub struct WorkerProcess {
    pub role: Role,
    pub index: usize,
    pub pid: u32,
    outgoing: mpsc::Sender<ToWorker>,
    pending: Pending,
    next_id: AtomicU64,
    exit: watch::Receiver<Option<String>>,
    shutting_down: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
    /// The local child's process group (the worker's own, or its launcher's client: ssh, srun).
    group: u32,
    /// A remotely launched worker's stdin: open while this handle lives; its end tells the worker
    /// that its head is gone.
    stdin: Option<tokio::process::ChildStdin>,
    /// The head's end of the worker's mirror of the role's host area, when it keeps one; a call
    /// holds it from the push before it to the collect after it.
    mirror: Option<Arc<tokio::sync::Mutex<MirrorLink>>>,
    _socket_dir: tempfile::TempDir,
}

/// Where a worker's parent waits for it.
enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener, Secret),
}

impl Listener {
    fn endpoint(&self) -> std::io::Result<Endpoint> {
        Ok(match self {
            Listener::Unix(_, path) => Endpoint::Unix(path.clone()),
            Listener::Tcp(l, _) => Endpoint::Tcp(l.local_addr()?),
        })
    }

    /// The worker's connection and, over TCP, where it came from: the first one, or over TCP
    /// the first that proves the secret as worker `index` of `role` (each other one is reported
    /// and dropped).
    async fn accept(
        &self,
        role: Role,
        index: usize,
        events: &mpsc::UnboundedSender<WorkerEvent>,
    ) -> std::io::Result<(Box<dyn Connection>, Option<std::net::SocketAddr>)> {
        match self {
            Listener::Unix(l, _) => Ok((Box::new(l.accept().await?.0), None)),
            Listener::Tcp(l, secret) => {
                let (conn, peer) =
                    accept_proven(l, secret, (role, index), PROOF_WAIT, events).await?;
                Ok((Box::new(conn), Some(peer)))
            }
        }
    }
}

/// Accept connections on `listener` until one proves `secret` as worker `index` of `role` (it is
/// returned with its address); every other one is refused (reported as
/// [`WorkerEvent::Refused`]) and dropped, or when it has not answered within `wait`.
/// Connections are challenged side by side, so one that says nothing cannot hold the worker's
/// own back.
pub async fn accept_proven(
    listener: &TcpListener,
    secret: &Secret,
    (role, index): (Role, usize),
    wait: Duration,
    events: &mpsc::UnboundedSender<WorkerEvent>,
) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
    type Proven = (Result<tokio::net::TcpStream, String>, std::net::SocketAddr);
    // Dropped on return: the challenges still going are abandoned with their connections.
    let mut challenges: tokio::task::JoinSet<Proven> = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = accepted?;
                let secret = secret.clone();
                challenges.spawn(async move {
                    let mut ch = Channel::new(stream);
                    let proof =
                        tokio::time::timeout(wait, challenge(&mut ch, &secret, role, index)).await;
                    let result = match proof {
                        Ok(Ok(())) => Ok(ch.into_inner().into_inner()),
                        Ok(Err(reason)) => Err(reason),
                        Err(_) => Err(format!(
                            "no proof of the run's secret within {} s",
                            wait.as_secs()
                        )),
                    };
                    (result, peer)
                });
            }
            Some(done) = challenges.join_next() => {
                let (result, peer) = done.map_err(std::io::Error::other)?;
                match result {
                    Ok(conn) => return Ok((conn, peer)),
                    Err(reason) => {
                        let _ = events.send(WorkerEvent::Refused {
                            role,
                            index,
                            peer: peer.to_string(),
                            reason,
                        });
                    }
                }
            }
        }
    }
}

/// The launcher (`ssh`, `srun`) and node of a remotely launched worker.
fn remote_launcher(spec: &WorkerSpec) -> Option<(&'static str, &str)> {
    spec.transport.remote().map(|remote| {
        (
            remote.launcher.name(),
            remote.hosts.get(&spec.role).map_or("?", String::as_str),
        )
    })
}

/// `exchange` (a push or a collect) on the held mirror link, on a thread that may block.
async fn on_link(
    mut link: tokio::sync::OwnedMutexGuard<MirrorLink>,
    exchange: fn(&mut MirrorLink) -> std::io::Result<Moved>,
) -> std::io::Result<(tokio::sync::OwnedMutexGuard<MirrorLink>, Moved)> {
    tokio::task::spawn_blocking(move || {
        let moved = exchange(&mut link)?;
        Ok((link, moved))
    })
    .await
    .map_err(std::io::Error::other)?
}

/// The last lines a worker wrote to stderr, for error messages.
type Tail = Arc<Mutex<VecDeque<String>>>;

/// `roll-tui worker ROLE` in its own process group, killed when dropped, told where to connect
/// and who its parent is.
fn start_child(spec: &WorkerSpec, at: &Endpoint) -> Result<tokio::process::Child, WorkerError> {
    child_command(spec, at)
        .spawn()
        .map_err(|source| WorkerError::Spawn {
            role: spec.role,
            index: spec.index,
            program: spec.program.display().to_string(),
            source,
        })
}

/// The writer task: send queued messages until the queue or the socket closes.
async fn write_frames<S>(mut sink: S, mut to_send: mpsc::Receiver<ToWorker>)
where
    S: futures_util::Sink<tokio_util::bytes::Bytes> + Unpin,
{
    while let Some(msg) = to_send.recv().await {
        let Ok(bytes) = serde_json::to_vec(&msg) else {
            continue;
        };
        if sink
            .send(tokio_util::bytes::Bytes::from(bytes))
            .await
            .is_err()
        {
            break;
        }
    }
}

/// The heartbeat's state, shared by the heartbeat and reader tasks: when the last pong came,
/// and the last ping sent (its number and time), whose pong gives the link's round trip.
struct Beats {
    last_pong: Instant,
    ping: (u64, Instant),
}

type SharedBeats = Arc<Mutex<Beats>>;

/// The reader task: hand each reply to the call waiting for it, note each pong's time; over TCP
/// (`link` the worker's role and index) record the round trip of each pong of the last ping.
async fn read_frames<S>(
    mut stream: S,
    pending: Pending,
    beats: SharedBeats,
    link: Option<(Role, usize)>,
) where
    S: futures_util::Stream<Item = std::io::Result<tokio_util::bytes::BytesMut>> + Unpin,
{
    while let Some(Ok(frame)) = stream.next().await {
        match serde_json::from_slice::<FromWorker>(&frame) {
            Ok(FromWorker::Pong { seq }) => {
                if let Ok(mut b) = beats.lock() {
                    b.last_pong = Instant::now();
                    if let (Some((role, index)), (sent, at)) = (link, b.ping)
                        && sent == seq
                    {
                        super::link::heard(role, index, at.elapsed());
                    }
                }
            }
            Ok(FromWorker::Reply { id, result }) => {
                let waiter = pending.lock().ok().and_then(|mut p| p.waiting.remove(&id));
                if let Some(w) = waiter {
                    let _ = w.send(result);
                }
            }
            // A second hello or proof, or a malformed frame: the connection is not trustworthy.
            Ok(FromWorker::Hello { .. } | FromWorker::Proof { .. }) | Err(_) => break,
        }
    }
}

/// The heartbeat task: ping every `spec.heartbeat`; report silence past `spec.silence_limit` once
/// per silent spell.
///
/// A worker on another host (`lost` given) that stays silent that long is taken for lost with
/// its node: its exit cannot be seen from here, and a partitioned host never closes its
/// connection. Its local child (the launcher's client: ssh, srun) is killed with the reason put in `lost`, which
/// the exit watcher then reports as the worker's exit: the calls in flight fail at once and the
/// role replaces the worker, or stops the run naming it.
async fn heartbeat(
    spec: WorkerSpec,
    outgoing: mpsc::Sender<ToWorker>,
    events: mpsc::UnboundedSender<WorkerEvent>,
    beats: SharedBeats,
    lost: Option<(LostReason, u32)>,
) {
    let (role, index, limit) = (spec.role, spec.index, spec.silence_limit);
    let mut tick = tokio::time::interval(spec.heartbeat);
    // After a stall of this process (a paused run is SIGSTOPped) the next tick comes late, once:
    // no burst of pings, and the silence counts from the end of the stall, not the worker's.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut seq, mut reported) = (0u64, false);
    let mut last_tick = Instant::now();
    loop {
        tick.tick().await;
        if last_tick.elapsed() > 2 * spec.heartbeat
            && let Ok(mut b) = beats.lock()
        {
            b.last_pong = Instant::now();
        }
        last_tick = Instant::now();
        seq += 1;
        if let Ok(mut b) = beats.lock() {
            b.ping = (seq, Instant::now());
        }
        if outgoing.send(ToWorker::Ping { seq }).await.is_err() {
            break;
        }
        let silent = beats
            .lock()
            .map(|b| b.last_pong.elapsed())
            .unwrap_or_default();
        if silent >= limit && !reported {
            reported = true;
            let _ = events.send(WorkerEvent::Unresponsive {
                role,
                index,
                silent_s: silent.as_secs_f64(),
            });
            if let Some((reason, group)) = &lost {
                if let Ok(mut r) = reason.lock() {
                    *r = Some(format!(
                        "lost: no heartbeat answer for {:.1} s (its host unreachable?)",
                        silent.as_secs_f64()
                    ));
                }
                kill_group(*group);
                break;
            }
        } else if silent < limit {
            reported = false;
        }
    }
}

/// Why a remote worker was given up for lost, once it was.
type LostReason = Arc<Mutex<Option<String>>>;

/// SIGKILL a local process group.
fn kill_group(group: u32) {
    use nix::sys::signal::{Signal, killpg};
    use nix::unistd::Pid;
    if group > 0 {
        let _ = killpg(Pid::from_raw(group as i32), Signal::SIGKILL);
    }
}

/// The exit watcher: when the process exits, fail the calls in flight, report the exit, publish
/// the status.
struct ExitWatcher {
    role: Role,
    index: usize,
    pid: u32,
    pending: Pending,
    /// Why the heartbeat gave the worker up, which is then its exit.
    lost: LostReason,
    shutting_down: Arc<AtomicBool>,
    events: mpsc::UnboundedSender<WorkerEvent>,
    exit_tx: watch::Sender<Option<String>>,
    /// The worker's mirror connection: shut at its exit, so a transfer in progress fails at
    /// once.
    mirror: Option<std::net::TcpStream>,
}

impl ExitWatcher {
    async fn watch(self, mut child: tokio::process::Child) {
        let exited = exit_text(child.wait().await);
        let status = self
            .lost
            .lock()
            .ok()
            .and_then(|mut r| r.take())
            .unwrap_or(exited);
        if let Some(stream) = &self.mirror {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        // Fail every call in flight now, rather than at its timeout, and refuse new ones.
        if let Ok(mut p) = self.pending.lock() {
            p.exited = Some(status.clone());
            p.waiting.clear();
        }
        // The event first: whoever sees the exit status can then find the event queued.
        let _ = self.events.send(WorkerEvent::Exited {
            role: self.role,
            index: self.index,
            pid: self.pid,
            status: status.clone(),
            expected: self.shutting_down.load(Ordering::SeqCst),
        });
        let _ = self.exit_tx.send(Some(status));
    }
}

fn spawn_log_reader<R>(
    reader: R,
    stream: &'static str,
    spec: &WorkerSpec,
    events: mpsc::UnboundedSender<WorkerEvent>,
    tail: Tail,
) -> JoinHandle<()>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    let (role, index) = (spec.role, spec.index);
    tokio::spawn(async move {
        let mut lines = BufReader::new(reader).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(mut t) = tail.lock() {
                if t.len() == 20 {
                    t.pop_front();
                }
                t.push_back(line.clone());
            }
            let _ = events.send(WorkerEvent::Log {
                role,
                index,
                stream,
                line,
            });
        }
    })
}

fn exit_text(status: std::io::Result<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => format!("exit status {code}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            _ => s.to_string(),
        },
        Err(e) => format!("unknown exit status ({e})"),
    }
}

impl WorkerProcess {
    /// Start the worker and wait until it has connected (over TCP, proved the run's secret) and
    /// shaken hands.
    pub async fn spawn(
        spec: &WorkerSpec,
        events: mpsc::UnboundedSender<WorkerEvent>,
    ) -> Result<WorkerProcess, WorkerError> {
        let (role, index) = (spec.role, spec.index);
        if !role.runs_out_of_process() {
            return Err(WorkerError::Unsupported(role));
        }
        let proto = |source| WorkerError::Protocol {
            role,
            index,
            source,
        };
        let dir = tempfile::Builder::new()
            .prefix("roll-worker-")
            .tempdir()
            .map_err(|e| proto(ProtocolError::Io(e)))?;
        let io = |e| proto(ProtocolError::Io(e));
        let listener = match &spec.transport {
            Transport::Unix => {
                let socket = dir.path().join(format!("{role}-{index}.sock"));
                Listener::Unix(UnixListener::bind(&socket).map_err(io)?, socket)
            }
            Transport::Tcp { listen, secret, .. } => {
                let tcp = TcpListener::bind((*listen, 0)).await.map_err(io)?;
                Listener::Tcp(tcp, secret.clone())
            }
        };
        let mut child = start_child(spec, &listener.endpoint().map_err(io)?)?;
        let group = child.id().unwrap_or(0);
        // A remotely launched worker reads the run's secret from its stdin, first thing.
        let mut stdin = child.stdin.take();
        if let (Some(pipe), Transport::Tcp { secret, .. }) = (stdin.as_mut(), &spec.transport) {
            use tokio::io::AsyncWriteExt;
            pipe.write_all(format!("{}\n", secret.as_text()).as_bytes())
                .await
                .map_err(io)?;
            pipe.flush().await.map_err(io)?;
        }
        let tail: Tail = Arc::default();
        let mut tasks = vec![];
        if let Some(out) = child.stdout.take() {
            tasks.push(spawn_log_reader(
                out,
                "stdout",
                spec,
                events.clone(),
                tail.clone(),
            ));
        }
        if let Some(err) = child.stderr.take() {
            tasks.push(spawn_log_reader(
                err,
                "stderr",
                spec,
                events.clone(),
                tail.clone(),
            ));
        }
        let no_connection = |detail: String| WorkerError::NoConnection {
            role,
            index,
            secs: spec.connect_timeout.as_secs(),
            detail,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept(role, index, &events) => accepted.map_err(io)?,
            status = child.wait() => {
                // Let the log readers catch the worker's last words.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let said = tail.lock().map(|t| t.iter().cloned().collect::<Vec<_>>().join(" | ")).unwrap_or_default();
                return Err(no_connection(format!(": it exited first ({}): {said}", exit_text(status))));
            }
            _ = tokio::time::sleep(spec.connect_timeout) => return Err(no_connection(String::new())),
        };
        let mut ch = Channel::new(stream);
        let pid =
            tokio::time::timeout(spec.connect_timeout, handshake_parent(&mut ch, role, index))
                .await
                .map_err(|_| no_connection(": no handshake".into()))?
                .map_err(proto)?;
        // A worker that mirrors its role's host area connects a second time, for the files.
        let (mirror, mirror_stream) = match (&listener, &spec.area) {
            (Listener::Tcp(l, secret), Some(area)) if spec.mirrors() => {
                let accepted = tokio::select! {
                    accepted = accept_proven(l, secret, (role, index), PROOF_WAIT, &events) => accepted.map_err(io)?,
                    status = child.wait() => return Err(no_connection(format!(
                        ": it exited before its mirror connection ({})", exit_text(status)))),
                    _ = tokio::time::sleep(spec.connect_timeout) => {
                        return Err(no_connection(": no mirror connection".into()))
                    }
                };
                let stream = accepted.0.into_std().map_err(io)?;
                stream.set_nonblocking(false).map_err(io)?;
                // A node gone mid-transfer fails the transfer instead of holding it for ever.
                stream.set_write_timeout(Some(MIRROR_STALL)).map_err(io)?;
                stream.set_read_timeout(Some(MIRROR_STALL)).map_err(io)?;
                let kept = stream.try_clone().map_err(io)?;
                let link =
                    MirrorLink::open(stream, area.clone(), spec.worker_only.clone()).map_err(io)?;
                (Some(Arc::new(tokio::sync::Mutex::new(link))), Some(kept))
            }
            _ => (None, None),
        };
        let peer_text = peer.map_or("?".into(), |p| p.to_string());
        let via = match (listener.endpoint(), remote_launcher(spec)) {
            (Ok(Endpoint::Tcp(addr)), Some((launcher, node))) => format!(
                "tcp {addr} from {peer_text}, started by {launcher} on {node}{}",
                if mirror.is_some() {
                    ", mirroring its host area"
                } else {
                    ""
                }
            ),
            (Ok(Endpoint::Tcp(addr)), None) => format!("tcp {addr} from {peer_text}"),
            _ => "unix socket".into(),
        };
        let _ = events.send(WorkerEvent::Started {
            role,
            index,
            pid,
            via,
            node: remote_launcher(spec).map(|(_, node)| node.to_string()),
        });

        let (sink, stream) = StreamExt::split::<tokio_util::bytes::Bytes>(ch.into_inner());
        let (outgoing, to_send) = mpsc::channel::<ToWorker>(64);
        tasks.push(tokio::spawn(write_frames(sink, to_send)));
        let pending: Pending = Arc::default();
        let beats = Arc::new(Mutex::new(Beats {
            last_pong: Instant::now(),
            ping: (0, Instant::now()),
        }));
        let link = matches!(spec.transport, Transport::Tcp { .. }).then_some((role, index));
        tasks.push(tokio::spawn(read_frames(
            stream,
            pending.clone(),
            beats.clone(),
            link,
        )));
        let lost = LostReason::default();
        let remote = spec.transport.remote().is_some();
        tasks.push(tokio::spawn(heartbeat(
            spec.clone(),
            outgoing.clone(),
            events.clone(),
            beats,
            remote.then(|| (lost.clone(), group)),
        )));
        let (exit_tx, exit) = watch::channel(None);
        let shutting_down = Arc::new(AtomicBool::new(false));
        let watcher = ExitWatcher {
            role,
            index,
            pid,
            pending: pending.clone(),
            lost,
            shutting_down: shutting_down.clone(),
            events,
            exit_tx,
            mirror: mirror_stream,
        };
        tasks.push(tokio::spawn(watcher.watch(child)));
        Ok(WorkerProcess {
            role,
            index,
            pid,
            outgoing,
            pending,
            next_id: AtomicU64::new(1),
            exit,
            shutting_down,
            tasks,
            group,
            stdin,
            mirror,
            _socket_dir: dir,
        })
    }

    /// The exit status, once the process has exited.
    pub fn exit_status(&self) -> Option<String> {
        self.exit.borrow().clone()
    }

    /// Send `request` (a call of `phase`, which errors and timeouts name) and wait at most
    /// `timeout` for the reply. A worker that mirrors its role's host area gets the area's changes
    /// first, and gives back what the call wrote before the reply is returned.
    pub async fn call(
        &self,
        phase: &'static str,
        request: Payload,
        timeout: Duration,
    ) -> Result<Payload, WorkerError> {
        let Some(link) = &self.mirror else {
            return self.send_call(phase, request, timeout).await;
        };
        let failed = |e: std::io::Error| WorkerError::Died {
            role: self.role,
            index: self.index,
            phase,
            status: format!("its mirror of the host area failed: {e}"),
        };
        let link = link.clone().lock_owned().await;
        let (link, pushed) = on_link(link, MirrorLink::push).await.map_err(failed)?;
        let reply = self.send_call(phase, request, timeout).await;
        // A call that failed may have written too; a worker that is gone has nothing to give.
        if matches!(reply, Ok(_) | Err(WorkerError::Failed { .. })) {
            let (_, collected) = on_link(link, MirrorLink::collect).await.map_err(failed)?;
            super::link::moved(self.role, self.index, pushed);
            super::link::moved(self.role, self.index, collected);
        }
        reply
    }

    async fn send_call(
        &self,
        phase: &'static str,
        request: Payload,
        timeout: Duration,
    ) -> Result<Payload, WorkerError> {
        let (role, index) = (self.role, self.index);
        let died = |status: String| WorkerError::Died {
            role,
            index,
            phase,
            status,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let Ok(mut p) = self.pending.lock() else {
                return Err(died("call state poisoned".into()));
            };
            if let Some(status) = &p.exited {
                return Err(died(status.clone()));
            }
            p.waiting.insert(id, tx);
        }
        if self
            .outgoing
            .send(ToWorker::Call { id, request })
            .await
            .is_err()
        {
            return Err(died(self.final_status().await));
        }
        match tokio::time::timeout(timeout, rx).await {
            Err(_) => {
                if let Ok(mut p) = self.pending.lock() {
                    p.waiting.remove(&id);
                }
                Err(WorkerError::Timeout {
                    role,
                    index,
                    phase,
                    secs: timeout.as_secs_f64(),
                })
            }
            Ok(Err(_)) => Err(died(self.final_status().await)),
            Ok(Ok(Ok(reply))) => Ok(reply),
            Ok(Ok(Err(message))) => Err(WorkerError::Failed {
                role,
                index,
                phase,
                message,
            }),
        }
    }

    /// The exit status, waiting briefly for it (the connection may drop just before the exit).
    async fn final_status(&self) -> String {
        let mut exit = self.exit.clone();
        match tokio::time::timeout(Duration::from_secs(2), exit.wait_for(Option::is_some)).await {
            Ok(Ok(s)) => s.clone().unwrap_or_default(),
            _ => "connection lost".into(),
        }
    }

    /// Ask the worker to exit and wait for it (killing it after `grace`). Returns its exit status.
    pub async fn shutdown(mut self, grace: Duration) -> String {
        self.shutting_down.store(true, Ordering::SeqCst);
        let _ = self.outgoing.send(ToWorker::Shutdown).await;
        // A remotely launched worker also ends with its stdin, and so does its launcher's client.
        drop(self.stdin.take());
        let mut exit = self.exit.clone();
        if tokio::time::timeout(grace, exit.wait_for(Option::is_some))
            .await
            .is_err()
        {
            self.kill();
        }
        let status = self.final_status().await;
        for t in self.tasks.drain(..) {
            t.abort();
        }
        status
    }

    /// SIGKILL the worker's process group (a remote one's launcher client's: its session or step ends, and the
    /// worker with it when its stdin closes).
    pub fn kill(&self) {
        kill_group(self.group);
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if self.exit_status().is_none() {
            self.kill();
        }
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection that sends garbage, one that proves another secret and one that proves the
    /// secret for another worker are each refused and reported; the worker's own is accepted.
    #[tokio::test]
    async fn only_a_connection_that_proves_the_secret_for_this_worker_is_accepted() {
        use super::super::protocol::answer_challenge;
        let secret = Secret::generate();
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (events, mut seen) = mpsc::unbounded_channel();
        let theirs = secret.clone();
        // One after another, each kept open so that a refusal is the parent's doing.
        let clients = tokio::spawn(async move {
            let mut kept = vec![];
            for proof in [
                None,
                Some((Secret::generate(), 0)),
                Some((theirs.clone(), 1)),
                Some((theirs.clone(), 0)),
            ] {
                let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
                let mut ch = Channel::new(stream);
                let refused = match proof {
                    None => {
                        ch.send(&FromWorker::Pong { seq: 1 }).await.expect("send");
                        true
                    }
                    Some((s, index)) => {
                        answer_challenge(&mut ch, &s, Role::Critic, index)
                            .await
                            .expect("answer");
                        !(s == theirs && index == 0)
                    }
                };
                // A refused one waits until the head has dropped it, so the refusals come in
                // this order.
                if refused {
                    while let Ok(Some(_)) = ch.recv::<ToWorker>("closing").await {}
                }
                kept.push(ch);
            }
            kept
        });
        let (_, peer) = tokio::time::timeout(
            Duration::from_secs(20),
            accept_proven(&listener, &secret, (Role::Critic, 0), PROOF_WAIT, &events),
        )
        .await
        .expect("accepted within 20 s")
        .expect("accepted");
        assert!(peer.ip().is_loopback());
        clients.await.expect("clients");
        let mut refused = vec![];
        while let Ok(e) = seen.try_recv() {
            match e {
                WorkerEvent::Refused {
                    role,
                    index,
                    reason,
                    ..
                } => {
                    assert_eq!((role, index), (Role::Critic, 0));
                    refused.push(reason);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            refused,
            [
                "no proof of the run's secret",
                "a wrong proof of the run's secret",
                "a wrong proof of the run's secret"
            ]
        );
    }

    /// A connection that says nothing is challenged beside the worker's own, not before it: with
    /// a wait far longer than the test's deadline the worker is still accepted at once, and the
    /// silent one is not refused yet.
    #[tokio::test]
    async fn a_silent_connection_does_not_hold_the_worker_back() {
        use super::super::protocol::answer_challenge;
        let secret = Secret::generate();
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (events, mut seen) = mpsc::unbounded_channel();
        let theirs = secret.clone();
        let clients = tokio::spawn(async move {
            let silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let mut ch = Channel::new(stream);
            answer_challenge(&mut ch, &theirs, Role::Critic, 0)
                .await
                .expect("answer");
            (silent, ch)
        });
        tokio::time::timeout(
            Duration::from_secs(20),
            accept_proven(
                &listener,
                &secret,
                (Role::Critic, 0),
                Duration::from_secs(3600),
                &events,
            ),
        )
        .await
        .expect("accepted beside the silent connection")
        .expect("accepted");
        let _kept = clients.await.expect("clients");
        assert!(seen.try_recv().is_err(), "nothing refused yet");
    }
}
