//! The worker side of `roll-tui worker ROLE`: die with the parent, connect, shake hands, then answer
//! pings and calls until the parent says shutdown or goes away.

use std::path::Path;

use tokio::net::UnixStream;

use super::protocol::{
    BUILD_VERSION, Channel, FromWorker, PROTOCOL_VERSION, ProtocolError, Reply, Request, ToWorker,
    handshake_worker,
};
use super::{Role, WorkerError};
use crate::reward;

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

/// Serve one parent over the socket at `socket` until shutdown or disconnect.
pub async fn serve(role: Role, index: usize, socket: &Path) -> Result<(), WorkerError> {
    if !role.runs_out_of_process() {
        return Err(WorkerError::Unsupported(role));
    }
    let proto = |source| WorkerError::Protocol {
        role,
        index,
        source,
    };
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|e| proto(ProtocolError::Io(e)))?;
    let mut ch = Channel::new(stream);
    let (assigned, assigned_index) = handshake_worker(&mut ch, PROTOCOL_VERSION, BUILD_VERSION)
        .await
        .map_err(proto)?;
    if (assigned, assigned_index) != (role, index) {
        return Err(proto(ProtocolError::Unexpected {
            expected: "a hello for this worker's role and index",
            got: format!("{assigned} {assigned_index}"),
        }));
    }
    // Calls run on their own thread, so pings are answered while a long call computes.
    let (calls_tx, calls_rx) = std::sync::mpsc::channel::<(u64, Request)>();
    let (replies_tx, mut replies) = tokio::sync::mpsc::unbounded_channel();
    let compute = std::thread::Builder::new()
        .name(format!("roll-{role}-{index}"))
        .spawn(move || {
            let reply = |id, result| {
                let _ = replies_tx.send(FromWorker::Reply { id, result });
            };
            match role {
                Role::ActorInfer => super::infer::serve(&calls_rx, &reply),
                Role::ActorTrain | Role::Critic => super::train::serve(role, &calls_rx, &reply),
                Role::Reference => super::reference::serve(&calls_rx, &reply),
                _ => {
                    while let Ok((id, request)) = calls_rx.recv() {
                        reply(id, handle(role, request));
                    }
                }
            }
        })
        .map_err(|e| proto(ProtocolError::Io(e)))?;
    let result = loop {
        tokio::select! {
            msg = ch.recv::<ToWorker>("parent") => match msg.map_err(proto)? {
                // The parent closed the socket or said shutdown: nothing left to do.
                None | Some(ToWorker::Shutdown) => break Ok(()),
                Some(ToWorker::Ping { seq }) => {
                    ch.send(&FromWorker::Pong { seq }).await.map_err(proto)?;
                }
                Some(ToWorker::Call { id, request }) => {
                    if calls_tx.send((id, request)).is_err() {
                        break Err(proto(ProtocolError::Closed));
                    }
                }
                Some(ToWorker::Hello { .. }) => {
                    break Err(proto(ProtocolError::Unexpected {
                        expected: "a ping, call or shutdown",
                        got: "a second hello".into(),
                    }));
                }
            },
            Some(reply) = replies.recv() => ch.send(&reply).await.map_err(proto)?,
        }
    };
    // Let the call in progress finish (its reply has nowhere to go) before exiting.
    drop(calls_tx);
    let _ = compute.join();
    result
}

fn handle(role: Role, request: Request) -> Result<Reply, String> {
    match (role, request) {
        (Role::Reward, Request::Score { items }) => Ok(Reply::Scores(
            items
                .iter()
                .map(|i| reward::score(i.kind, &i.response, &i.ground_truth))
                .collect(),
        )),
        (role, request) => Err(format!(
            "the {role} role does not serve '{}' requests",
            request.phase()
        )),
    }
}
