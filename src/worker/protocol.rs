//! The control protocol between the parent and a worker: serde enums, one JSON document per
//! length-delimited frame over a local socket.
//!
//! Over TCP a session starts with the parent's [`ToWorker::Challenge`], which the worker answers
//! with its [`FromWorker::Proof`] of the run's secret ([`super::auth`]); a Unix socket, private to
//! its directory, needs none. Then the parent's [`ToWorker::Hello`] and the worker's
//! [`FromWorker::Hello`]; both
//! carry [`PROTOCOL_VERSION`] and the crate version, and either side ends the session on a mismatch.
//! Then the parent sends pings (answered with pongs: the heartbeat) and calls (answered with replies
//! carrying the call id). Calls and replies are each role's own types, as JSON ([`Payload`]).
//! Messages stay small: bulk tensors go through shared-memory files.

use futures_util::{SinkExt, StreamExt};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use super::Role;

/// A call or a reply as it travels: the JSON of one role's own request or reply type. The role
/// layer (`src/role/`) gives each role typed enums and converts at both ends, so this module
/// carries calls for any role without knowing one.
pub type Payload = serde_json::Value;

/// Bumped whenever a message changes shape.
pub const PROTOCOL_VERSION: u32 = 6;
/// The crate version; parent and worker must be the same build.
pub const BUILD_VERSION: &str = env!("CARGO_PKG_VERSION");
/// Control messages larger than this are a bug (bulk data does not travel here).
pub const MAX_FRAME_BYTES: usize = 64 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToWorker {
    /// Prove you hold the run's secret (TCP connections, before the hello).
    Challenge {
        nonce: String,
    },
    Hello {
        protocol: u32,
        build: String,
        role: Role,
        index: usize,
    },
    Ping {
        seq: u64,
    },
    Call {
        id: u64,
        request: Payload,
    },
    /// Finish the current call, then exit.
    Shutdown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FromWorker {
    /// The answer to a [`ToWorker::Challenge`]: [`super::auth::Secret::prove`].
    Proof {
        proof: String,
    },
    Hello {
        protocol: u32,
        build: String,
        pid: u32,
    },
    Pong {
        seq: u64,
    },
    Reply {
        id: u64,
        result: Result<Payload, String>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("control socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed {what} message: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("the other side closed the control socket")]
    Closed,
    #[error(
        "version mismatch: parent speaks protocol {parent_protocol} (roll-tui {parent_build}), worker \
         protocol {worker_protocol} (roll-tui {worker_build})"
    )]
    Version {
        parent_protocol: u32,
        parent_build: String,
        worker_protocol: u32,
        worker_build: String,
    },
    #[error("expected {expected}, got {got}")]
    Unexpected { expected: &'static str, got: String },
}

/// A framed control connection over any byte stream (a Unix socket; an in-memory pipe in tests).
pub struct Channel<S> {
    framed: Framed<S, LengthDelimitedCodec>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Channel<S> {
    pub fn new(stream: S) -> Self {
        let codec = LengthDelimitedCodec::builder()
            .max_frame_length(MAX_FRAME_BYTES)
            .new_codec();
        Channel {
            framed: Framed::new(stream, codec),
        }
    }

    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), ProtocolError> {
        let bytes = serde_json::to_vec(msg).map_err(|source| ProtocolError::Decode {
            what: "outgoing",
            source,
        })?;
        self.framed
            .send(tokio_util::bytes::Bytes::from(bytes))
            .await?;
        Ok(())
    }

    /// The next message, or `None` when the other side closed the connection cleanly.
    pub async fn recv<T: DeserializeOwned>(
        &mut self,
        what: &'static str,
    ) -> Result<Option<T>, ProtocolError> {
        match self.framed.next().await {
            None => Ok(None),
            Some(frame) => {
                let frame = frame?;
                serde_json::from_slice(&frame)
                    .map(Some)
                    .map_err(|source| ProtocolError::Decode { what, source })
            }
        }
    }

    /// Split into a sink half and a stream half for concurrent reading and writing.
    pub fn into_inner(self) -> Framed<S, LengthDelimitedCodec> {
        self.framed
    }
}

/// Parent side, first on a TCP connection: challenge the peer to prove it holds `secret` as
/// worker `index` of `role`. Returns why it is refused, if it is.
pub async fn challenge<S: AsyncRead + AsyncWrite + Unpin>(
    ch: &mut Channel<S>,
    secret: &super::auth::Secret,
    role: Role,
    index: usize,
) -> Result<(), String> {
    let nonce = super::auth::nonce();
    ch.send(&ToWorker::Challenge {
        nonce: nonce.clone(),
    })
    .await
    .map_err(|e| e.to_string())?;
    match ch.recv::<FromWorker>("proof").await {
        Ok(Some(FromWorker::Proof { proof })) if secret.verify(&nonce, role, index, &proof) => {
            Ok(())
        }
        Ok(Some(FromWorker::Proof { .. })) => Err("a wrong proof of the run's secret".into()),
        Ok(Some(_)) => Err("no proof of the run's secret".into()),
        Ok(None) => Err("it closed the connection without a proof".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Worker side of [`challenge`]: answer the parent's nonce with `secret`.
pub async fn answer_challenge<S: AsyncRead + AsyncWrite + Unpin>(
    ch: &mut Channel<S>,
    secret: &super::auth::Secret,
    role: Role,
    index: usize,
) -> Result<(), ProtocolError> {
    match ch.recv::<ToWorker>("parent challenge").await? {
        Some(ToWorker::Challenge { nonce }) => {
            ch.send(&FromWorker::Proof {
                proof: secret.prove(&nonce, role, index),
            })
            .await
        }
        Some(other) => Err(ProtocolError::Unexpected {
            expected: "the parent's challenge",
            got: format!("{other:?}"),
        }),
        None => Err(ProtocolError::Closed),
    }
}

/// Parent side of the handshake: send our hello, check the worker's. Returns the worker's pid.
pub async fn handshake_parent<S: AsyncRead + AsyncWrite + Unpin>(
    ch: &mut Channel<S>,
    role: Role,
    index: usize,
) -> Result<u32, ProtocolError> {
    ch.send(&ToWorker::Hello {
        protocol: PROTOCOL_VERSION,
        build: BUILD_VERSION.into(),
        role,
        index,
    })
    .await?;
    match ch.recv::<FromWorker>("worker hello").await? {
        Some(FromWorker::Hello {
            protocol,
            build,
            pid,
        }) => {
            if protocol != PROTOCOL_VERSION || build != BUILD_VERSION {
                return Err(ProtocolError::Version {
                    parent_protocol: PROTOCOL_VERSION,
                    parent_build: BUILD_VERSION.into(),
                    worker_protocol: protocol,
                    worker_build: build,
                });
            }
            Ok(pid)
        }
        Some(other) => Err(ProtocolError::Unexpected {
            expected: "the worker's hello",
            got: format!("{other:?}"),
        }),
        None => Err(ProtocolError::Closed),
    }
}

/// Worker side of the handshake: read the parent's hello, answer with ours, and refuse a mismatch
/// (after answering, so the parent can report both versions). Returns the role and index assigned.
pub async fn handshake_worker<S: AsyncRead + AsyncWrite + Unpin>(
    ch: &mut Channel<S>,
    protocol: u32,
    build: &str,
) -> Result<(Role, usize), ProtocolError> {
    let (parent_protocol, parent_build, role, index) = match ch.recv("parent hello").await? {
        Some(ToWorker::Hello {
            protocol,
            build,
            role,
            index,
        }) => (protocol, build, role, index),
        Some(other) => {
            return Err(ProtocolError::Unexpected {
                expected: "the parent's hello",
                got: format!("{other:?}"),
            });
        }
        None => return Err(ProtocolError::Closed),
    };
    ch.send(&FromWorker::Hello {
        protocol,
        build: build.into(),
        pid: std::process::id(),
    })
    .await?;
    if parent_protocol != protocol || parent_build != build {
        return Err(ProtocolError::Version {
            parent_protocol,
            parent_build,
            worker_protocol: protocol,
            worker_build: build.into(),
        });
    }
    Ok((role, index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn handshake_agrees_on_the_same_build() {
        let (a, b) = tokio::io::duplex(1024);
        let (mut parent, mut worker) = (Channel::new(a), Channel::new(b));
        let w = tokio::spawn(async move {
            handshake_worker(&mut worker, PROTOCOL_VERSION, BUILD_VERSION).await
        });
        let pid = handshake_parent(&mut parent, Role::Reward, 3)
            .await
            .unwrap();
        assert_eq!(pid, std::process::id());
        assert_eq!(w.await.unwrap().unwrap(), (Role::Reward, 3));
    }

    #[tokio::test]
    async fn a_version_mismatch_is_refused_on_both_sides_with_both_versions() {
        let (a, b) = tokio::io::duplex(1024);
        let (mut parent, mut worker) = (Channel::new(a), Channel::new(b));
        let w = tokio::spawn(async move { handshake_worker(&mut worker, 99, "0.0.1").await });
        let err = handshake_parent(&mut parent, Role::Reward, 0)
            .await
            .unwrap_err()
            .to_string();
        let expected = format!(
            "version mismatch: parent speaks protocol {PROTOCOL_VERSION} (roll-tui {BUILD_VERSION}), \
             worker protocol 99 (roll-tui 0.0.1)"
        );
        assert_eq!(err, expected);
        assert_eq!(w.await.unwrap().unwrap_err().to_string(), expected);
    }

    #[tokio::test]
    async fn garbage_frames_are_a_decode_error_not_a_panic() {
        let (a, b) = tokio::io::duplex(1024);
        let mut raw = Channel::new(a);
        let mut worker = Channel::new(b);
        raw.send(&serde_json::json!({"Hello": {"protocol": "one"}}))
            .await
            .unwrap();
        let err = handshake_worker(&mut worker, PROTOCOL_VERSION, BUILD_VERSION)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("malformed parent hello message:"), "{err}");
    }
}
