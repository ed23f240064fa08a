//! The worker side of `roll-tui worker ROLE`: die with the parent, connect, shake hands, then answer
//! pings and calls until the parent says shutdown or goes away. What a call does is the role's
//! business: [`serve`] hands every call to the role's compute loop (`serve_worker` in the role layer, `src/role.rs`)
//! through a [`CallQueue`] and sends back what it answers.

use tokio::net::{TcpStream, UnixStream};

use super::auth::{SECRET_ENV, Secret};
use super::process::{Connection, Endpoint};
use super::protocol::{
    BUILD_VERSION, Channel, FromWorker, PROTOCOL_VERSION, Payload, ProtocolError, ToWorker,
    answer_challenge, handshake_worker,
};
use super::{Role, WorkerError};

/// The calls a worker receives, in order, and the way back for their replies. The compute loop
/// that owns it runs on its own thread, so pings are answered while a long call computes.
pub struct CallQueue {
    calls: std::sync::mpsc::Receiver<(u64, Payload)>,
    replies: tokio::sync::mpsc::UnboundedSender<FromWorker>,
}

impl CallQueue {
    /// The next call, or `None` once the parent is gone or said shutdown.
    pub fn recv(&self) -> Option<(u64, Payload)> {
        self.calls.recv().ok()
    }

    /// Answer call `id` (an answer after the parent left has nowhere to go and is dropped).
    pub fn reply(&self, id: u64, result: Result<Payload, String>) {
        let _ = self.replies.send(FromWorker::Reply { id, result });
    }
}

/// Arrange to be killed when the parent dies, even by SIGKILL (Linux: `PR_SET_PDEATHSIG`). If the
/// parent is already gone (it died before this ran), exit now rather than run as an orphan.
pub fn die_with_parent(parent: u32) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
            .map_err(std::io::Error::from)?;
    }
    if std::os::unix::process::parent_id() != parent {
        return Err(std::io::Error::other(format!(
            "parent process {parent} is already gone"
        )));
    }
    Ok(())
}

/// How long a worker over TCP waits without a word from its head before it exits: long enough
/// for a run paused from the workbench (its head SIGSTOPped) to be continued, short enough that a
/// worker cut off from its head on a partitioned node frees its devices the same day.
const HEAD_SILENCE_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

/// The secret [`secret_from_stdin`] read.
static STDIN_SECRET: std::sync::OnceLock<Secret> = std::sync::OnceLock::new();

/// Whether this worker keeps a mirror of its role's host area (`--mirror`: its node does not
/// see the head's), and where it is while it lives.
static MIRRORS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static MIRROR_DIR: std::sync::Mutex<Option<std::path::PathBuf>> = std::sync::Mutex::new(None);

/// `--mirror`: keep a mirror of the role's host area, kept up to date by the head over a second
/// connection ([`super::mirror`]).
pub fn keep_mirror() {
    MIRRORS.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Remove the mirror (it can hold a model's weights): at the worker's end, whichever way it
/// ends but SIGKILL.
fn remove_mirror() {
    if let Some(dir) = MIRROR_DIR.lock().ok().and_then(|mut d| d.take()) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A worker started over ssh: read the run's secret from the first line of stdin (where
/// [`serve`] finds it), then exit the moment stdin ends — the head
/// is gone (its pipe closed) or its ssh session is — so no worker outlives its head on any node.
pub fn secret_from_stdin() -> std::io::Result<()> {
    use std::io::BufRead;
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    if stdin.read_line(&mut line)? == 0 || line.trim().is_empty() {
        return Err(std::io::Error::other(
            "--secret-stdin: stdin ended before the run's secret",
        ));
    }
    let _ = STDIN_SECRET.set(Secret::from_text(&line));
    std::thread::Builder::new()
        .name("roll-stdin-watch".into())
        .spawn(|| {
            let mut rest = Vec::new();
            // Whatever arrives is ignored; the end of it is the head's death.
            let _ = std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut rest);
            remove_mirror();
            std::process::exit(0);
        })?;
    Ok(())
}

/// Serve one parent at `at` until shutdown or disconnect, with `compute` answering the calls on
/// a thread of its own. Over TCP the worker first proves it holds the run's secret, which its
/// environment carries (`ROLL_CLUSTER_SECRET`).
pub async fn serve(
    role: Role,
    index: usize,
    at: &Endpoint,
    compute: impl FnOnce(CallQueue) + Send + 'static,
) -> Result<(), WorkerError> {
    let proto = |source| WorkerError::Protocol {
        role,
        index,
        source,
    };
    let io = |e| proto(ProtocolError::Io(e));
    let mut ch: Channel<Box<dyn Connection>> = match at {
        Endpoint::Unix(path) => {
            Channel::new(Box::new(UnixStream::connect(path).await.map_err(io)?))
        }
        Endpoint::Tcp(addr) => {
            let secret = match STDIN_SECRET.get() {
                Some(s) => s.clone(),
                None => Secret::from_text(&std::env::var(SECRET_ENV).map_err(|_| {
                    io(std::io::Error::other(format!(
                        "{SECRET_ENV} is not set: a worker connecting over TCP needs the run's \
                         secret in its environment (or --secret-stdin)"
                    )))
                })?),
            };
            let stream = TcpStream::connect(addr).await.map_err(io)?;
            // Calls and pings are small frames: send each at once.
            stream.set_nodelay(true).map_err(io)?;
            let mut ch: Channel<Box<dyn Connection>> = Channel::new(Box::new(stream));
            answer_challenge(&mut ch, &secret, role, index)
                .await
                .map_err(proto)?;
            ch
        }
    };
    let (assigned, assigned_index) = handshake_worker(&mut ch, PROTOCOL_VERSION, BUILD_VERSION)
        .await
        .map_err(proto)?;
    if (assigned, assigned_index) != (role, index) {
        return Err(proto(ProtocolError::Unexpected {
            expected: "a hello for this worker's role and index",
            got: format!("{assigned} {assigned_index}"),
        }));
    }
    // (The head's area and this worker's mirror of it: calls name the first, the role reads
    // and writes the second.)
    let mirror = match at {
        Endpoint::Tcp(addr) if MIRRORS.load(std::sync::atomic::Ordering::SeqCst) => {
            Some(open_mirror(*addr, role, index).await.map_err(proto)?)
        }
        _ => None,
    };
    let result = serve_calls(role, index, at, ch, compute, mirror.as_ref()).await;
    remove_mirror();
    result
}

/// Connect to the head a second time, prove the secret again, and serve the mirror of the role's
/// host area on that connection from a thread of its own: the head's area and the mirror.
async fn open_mirror(
    addr: std::net::SocketAddr,
    role: Role,
    index: usize,
) -> Result<(std::path::PathBuf, std::path::PathBuf), ProtocolError> {
    let secret = STDIN_SECRET
        .get()
        .cloned()
        .ok_or_else(|| ProtocolError::Io(std::io::Error::other("--mirror needs --secret-stdin")))?;
    let stream = TcpStream::connect(addr).await?;
    let mut ch = Channel::new(stream);
    answer_challenge(&mut ch, &secret, role, index).await?;
    let stream = ch.into_inner().into_inner().into_std()?;
    stream.set_nonblocking(false)?;
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let dir = tempfile::Builder::new()
        .prefix("roll-tui-mirror-")
        .tempdir_in(base)?
        .keep();
    if let Ok(mut d) = MIRROR_DIR.lock() {
        *d = Some(dir.clone());
    }
    let (head, _serving) = tokio::task::spawn_blocking({
        let dir = dir.clone();
        move || super::mirror::serve_mirror(stream, dir)
    })
    .await
    .map_err(std::io::Error::other)??;
    Ok((head, dir))
}

/// The call loop of [`serve`], on the control channel `ch`; with `mirror` (the head's area, this
/// worker's mirror) each call's paths into the area are made paths into the mirror, and each
/// reply's back.
async fn serve_calls(
    role: Role,
    index: usize,
    at: &Endpoint,
    mut ch: Channel<Box<dyn Connection>>,
    compute: impl FnOnce(CallQueue) + Send + 'static,
    mirror: Option<&(std::path::PathBuf, std::path::PathBuf)>,
) -> Result<(), WorkerError> {
    let proto = |source| WorkerError::Protocol {
        role,
        index,
        source,
    };
    // Calls run on their own thread, so pings are answered while a long call computes.
    let (calls_tx, calls) = std::sync::mpsc::channel::<(u64, Payload)>();
    let (replies_tx, mut replies) = tokio::sync::mpsc::unbounded_channel();
    let queue = CallQueue {
        calls,
        replies: replies_tx,
    };
    let compute = std::thread::Builder::new()
        .name(format!("roll-{role}-{index}"))
        .spawn(move || compute(queue))
        .map_err(|e| proto(ProtocolError::Io(e)))?;
    // Over TCP the head pings every second; a worker that hears nothing for HEAD_SILENCE_LIMIT
    // has lost its head (a partitioned node never sees the connection close) and exits, freeing
    // its devices. On a Unix socket the parent's death kills it instead.
    let deaf_limit = matches!(at, Endpoint::Tcp(_)).then_some(HEAD_SILENCE_LIMIT);
    let mut heard = tokio::time::Instant::now();
    let result = loop {
        // (Without a limit the branch is off; a day keeps the sum far from overflowing.)
        let deaf_at = heard + deaf_limit.unwrap_or(std::time::Duration::from_secs(86_400));
        tokio::select! {
            _ = tokio::time::sleep_until(deaf_at), if deaf_limit.is_some() => {
                break Err(proto(ProtocolError::Io(std::io::Error::other(format!(
                    "nothing from the head for {} s: it is gone or unreachable",
                    HEAD_SILENCE_LIMIT.as_secs()
                )))));
            }
            msg = ch.recv::<ToWorker>("parent") => {
                heard = tokio::time::Instant::now();
                match msg.map_err(proto)? {
                    // The parent closed the socket or said shutdown: nothing left to do.
                    None | Some(ToWorker::Shutdown) => break Ok(()),
                    Some(ToWorker::Ping { seq }) => {
                        ch.send(&FromWorker::Pong { seq }).await.map_err(proto)?;
                    }
                    Some(ToWorker::Call { id, mut request }) => {
                        if let Some((head, mine)) = mirror {
                            super::mirror::translate(&mut request, head, mine);
                        }
                        if calls_tx.send((id, request)).is_err() {
                            break Err(proto(ProtocolError::Closed));
                        }
                    }
                    Some(ToWorker::Hello { .. } | ToWorker::Challenge { .. }) => {
                        break Err(proto(ProtocolError::Unexpected {
                            expected: "a ping, call or shutdown",
                            got: "a second hello or challenge".into(),
                        }));
                    }
                }
            }
            Some(mut reply) = replies.recv() => {
                if let (Some((head, mine)), FromWorker::Reply { result: Ok(payload), .. }) =
                    (mirror, &mut reply)
                {
                    super::mirror::translate(payload, mine, head);
                }
                ch.send(&reply).await.map_err(proto)?
            }
        }
    };
    // Let the call in progress finish (its reply has nowhere to go) before exiting.
    drop(calls_tx);
    let _ = compute.join();
    result
}

/// A compute loop driven without a socket or a process: the tests of each role's worker side.
#[cfg(test)]
pub(crate) struct InMemory {
    calls: Option<std::sync::mpsc::Sender<(u64, Payload)>>,
    replies: tokio::sync::mpsc::UnboundedReceiver<FromWorker>,
    rt: tokio::runtime::Runtime,
    next_id: u64,
    compute: Option<std::thread::JoinHandle<()>>,
}

#[cfg(test)]
impl InMemory {
    /// Run `compute` on a thread of its own, as [`serve`] does.
    pub(crate) fn start(compute: impl FnOnce(CallQueue) + Send + 'static) -> InMemory {
        let (calls_tx, calls) = std::sync::mpsc::channel();
        let (replies_tx, replies) = tokio::sync::mpsc::unbounded_channel();
        let queue = CallQueue {
            calls,
            replies: replies_tx,
        };
        InMemory {
            calls: Some(calls_tx),
            replies,
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("runtime"),
            next_id: 0,
            compute: Some(std::thread::spawn(move || compute(queue))),
        }
    }

    /// Send one call and wait (at most a minute) for its reply.
    pub(crate) fn call<Req: serde::Serialize, Rep: serde::de::DeserializeOwned>(
        &mut self,
        request: &Req,
    ) -> Result<Rep, String> {
        self.next_id += 1;
        let id = self.next_id;
        let payload = serde_json::to_value(request).expect("encode the call");
        let calls = self.calls.as_ref().expect("running");
        calls.send((id, payload)).expect("the compute loop is gone");
        let deadline = std::time::Duration::from_secs(60);
        let replies = &mut self.replies;
        let reply = self
            .rt
            .block_on(async { tokio::time::timeout(deadline, replies.recv()).await })
            .expect("no reply within a minute")
            .expect("the compute loop is gone");
        match reply {
            FromWorker::Reply { id: got, result } => {
                assert_eq!(got, id, "a reply to another call");
                result.map(|r| serde_json::from_value(r).expect("decode the reply"))
            }
            other => panic!("expected a reply, got {other:?}"),
        }
    }
}

#[cfg(test)]
impl Drop for InMemory {
    fn drop(&mut self) {
        // The parent is gone: the loop returns, and its thread with it.
        drop(self.calls.take());
        if let Some(compute) = self.compute.take() {
            let _ = compute.join();
        }
    }
}
