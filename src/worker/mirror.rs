//! Host areas over TCP, for workers on nodes that do not share the head's filesystem
//! (`cluster:` with a remote launcher and no `shared_dir`). Everything a role exchanges with its
//! worker in bulk — rows, results, offloaded and synced weights, the model's files — is a file
//! in the role's host area on the head; the worker keeps a mirror of that area on its node, and
//! calls name the mirror's paths where they named the area's.
//!
//! The head brings the mirror up to date before each call ([`MirrorLink::push`]: the files that
//! changed since the last exchange, the files removed) and takes back what the call wrote after
//! its reply ([`MirrorLink::collect`]). Each exchange leaves the files it moved, on both sides,
//! with one marker modification time ([`marker`]) that no write can give a file (a write sets the
//! time to now), so a file is "changed" exactly when it is new or its time is not the marker:
//! two writes within one tick of the kernel's clock, which a remembered time cannot tell apart,
//! are both seen. The bytes go over a second TCP
//! connection of the worker's, proven with the run's secret like its control connection, as raw
//! bytes after a small JSON header (the kernel copies file to socket and back); the control
//! connection stays free for heartbeats however long a transfer takes.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

/// One message's header; `Put` and `Changed` are followed by their files' bytes.
#[derive(Debug, Serialize, Deserialize)]
enum Header {
    /// First on the connection: the head's area (the paths calls name), and the files of it the
    /// worker keeps to itself (never collected).
    Root {
        head: PathBuf,
        keep: Vec<PathBuf>,
    },
    Put {
        rel: PathBuf,
        len: u64,
    },
    Delete {
        rel: PathBuf,
    },
    /// After a push: answered with `Done` once every file is in place.
    Flush,
    Done,
    /// After a call: answered with `Changed`, then each changed file's bytes in order.
    Collect,
    Changed {
        files: Vec<(PathBuf, u64)>,
        deleted: Vec<PathBuf>,
    },
}

/// The most a header may take (a list of thousands of files fits many times over).
const MAX_HEADER: u32 = 16 << 20;

fn send(stream: &mut TcpStream, header: &Header) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(header).map_err(std::io::Error::other)?;
    let len = u32::try_from(bytes.len()).map_err(std::io::Error::other)?;
    stream.write_all(&len.to_be_bytes())?;
    stream.write_all(&bytes)
}

fn recv(stream: &mut TcpStream) -> std::io::Result<Header> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len);
    if len > MAX_HEADER {
        return Err(std::io::Error::other(format!(
            "a mirror header of {len} bytes (at most {MAX_HEADER})"
        )));
    }
    let mut bytes = vec![0u8; len as usize];
    stream.read_exact(&mut bytes)?;
    serde_json::from_slice(&bytes).map_err(std::io::Error::other)
}

/// `rel` under `root`, if it is a plain relative path (no `..`, no root): a peer names only
/// files inside the area it mirrors.
fn inside(root: &Path, rel: &Path) -> std::io::Result<PathBuf> {
    if rel.as_os_str().is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(std::io::Error::other(format!(
            "the mirror names '{}', which is not a path inside its area",
            rel.display()
        )));
    }
    Ok(root.join(rel))
}

/// The modification time an exchange leaves on the files it moved: 1970-01-01 00:00:01.
fn marker() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1)
}

/// Every file under `root`, relative to it, with its length and modification time.
fn scan(root: &Path) -> std::io::Result<BTreeMap<PathBuf, (u64, SystemTime)>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                // A file being written under a temporary name (safetensors' rename) is not one
                // yet.
                let meta = entry.metadata()?;
                let rel = entry
                    .path()
                    .strip_prefix(root)
                    .map_err(std::io::Error::other)?
                    .to_path_buf();
                out.insert(rel, (meta.len(), meta.modified()?));
            }
        }
    }
    Ok(out)
}

/// Files changed (with their lengths), and files gone.
type Changes = (Vec<(PathBuf, u64)>, Vec<PathBuf>);

/// The files each side has from the last exchange, with their lengths: the difference from a new
/// scan is what to send.
#[derive(Default)]
struct Ledger {
    seen: BTreeMap<PathBuf, u64>,
}

impl Ledger {
    /// The files changed since the last exchange, and those gone.
    fn changes(&self, root: &Path) -> std::io::Result<Changes> {
        let now = scan(root)?;
        let changed = now
            .iter()
            .filter(|(rel, (len, time))| *time != marker() || self.seen.get(*rel) != Some(len))
            .map(|(rel, (len, _))| (rel.clone(), *len))
            .collect();
        let gone = self
            .seen
            .keys()
            .filter(|rel| !now.contains_key(*rel))
            .cloned()
            .collect();
        Ok((changed, gone))
    }

    /// `rel`, just moved with `len` bytes, is the same on both sides: mark it so.
    fn note(&mut self, root: &Path, rel: &Path, len: u64) -> std::io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .open(root.join(rel))?
            .set_modified(marker())?;
        self.seen.insert(rel.to_path_buf(), len);
        Ok(())
    }
}

/// Send `len` bytes of the file at `path` (which must still hold that many).
fn send_file(stream: &mut TcpStream, path: &Path, len: u64) -> std::io::Result<()> {
    let file = std::fs::File::open(path)?;
    let copied = std::io::copy(&mut file.take(len), stream)?;
    if copied != len {
        return Err(std::io::Error::other(format!(
            "'{}' shrank while it was sent ({copied} of {len} bytes)",
            path.display()
        )));
    }
    Ok(())
}

/// Receive `len` bytes into the file at `path`, over its old bytes where it has that length
/// already (no new pages to fill), else as a new file.
fn recv_file(stream: &mut TcpStream, path: &Path, len: u64) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(path)?;
    if file.metadata()?.len() != len {
        file.set_len(0)?;
    }
    let copied = std::io::copy(&mut (&mut *stream).take(len), &mut file)?;
    if copied != len {
        return Err(std::io::Error::other(format!(
            "the connection ended {copied} bytes into '{}' ({len} expected)",
            path.display()
        )));
    }
    file.set_len(len)
}

/// Files, bytes and seconds one exchange (or several) moved.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Moved {
    pub files: usize,
    pub bytes: u64,
    pub secs: f64,
}

impl Moved {
    pub fn add(&mut self, other: Moved) {
        self.files += other.files;
        self.bytes += other.bytes;
        self.secs += other.secs;
    }
}

/// The head's end of a worker's mirror.
pub struct MirrorLink {
    stream: TcpStream,
    area: PathBuf,
    ledger: Ledger,
}

impl MirrorLink {
    /// Over `stream` (the worker's proven data connection), mirror the host area `area`, but
    /// for the files `keep` names (relative to it), which the worker writes for itself and the
    /// head never needs: a trainer's offloaded state, which dies with its worker anyway.
    pub fn open(
        mut stream: TcpStream,
        area: PathBuf,
        keep: Vec<PathBuf>,
    ) -> std::io::Result<MirrorLink> {
        stream.set_nodelay(true)?;
        send(
            &mut stream,
            &Header::Root {
                head: area.clone(),
                keep,
            },
        )?;
        Ok(MirrorLink {
            stream,
            area,
            ledger: Ledger::default(),
        })
    }

    /// Bring the worker's mirror up to date with the area; returns once the worker has it all.
    pub fn push(&mut self) -> std::io::Result<Moved> {
        let start = Instant::now();
        let (changed, gone) = self.ledger.changes(&self.area)?;
        let mut moved = Moved::default();
        let removed = !gone.is_empty();
        for rel in gone {
            send(&mut self.stream, &Header::Delete { rel: rel.clone() })?;
            self.ledger.seen.remove(&rel);
        }
        for (rel, len) in changed {
            send(
                &mut self.stream,
                &Header::Put {
                    rel: rel.clone(),
                    len,
                },
            )?;
            send_file(&mut self.stream, &self.area.join(&rel), len)?;
            self.ledger.note(&self.area, &rel, len)?;
            moved.files += 1;
            moved.bytes += len;
        }
        // Nothing sent: nothing to wait for (the worker reads the connection in order).
        if moved.files > 0 || removed {
            send(&mut self.stream, &Header::Flush)?;
            match recv(&mut self.stream)? {
                Header::Done => {}
                other => return Err(unexpected("done", &other)),
            }
        }
        moved.secs = start.elapsed().as_secs_f64();
        Ok(moved)
    }

    /// Take back what the worker's last call wrote (and removed) in its mirror.
    pub fn collect(&mut self) -> std::io::Result<Moved> {
        let start = Instant::now();
        send(&mut self.stream, &Header::Collect)?;
        let (files, deleted) = match recv(&mut self.stream)? {
            Header::Changed { files, deleted } => (files, deleted),
            other => return Err(unexpected("changed", &other)),
        };
        let mut moved = Moved::default();
        for (rel, len) in files {
            let path = inside(&self.area, &rel)?;
            recv_file(&mut self.stream, &path, len)?;
            self.ledger.note(&self.area, &rel, len)?;
            moved.files += 1;
            moved.bytes += len;
        }
        for rel in deleted {
            let _ = std::fs::remove_file(inside(&self.area, &rel)?);
            self.ledger.seen.remove(&rel);
        }
        moved.secs = start.elapsed().as_secs_f64();
        Ok(moved)
    }
}

fn unexpected(expected: &str, got: &Header) -> std::io::Error {
    std::io::Error::other(format!("the mirror expected '{expected}', got {got:?}"))
}

/// The worker's end: read the head's area path from `stream`, then keep `mirror` like it until
/// the connection ends. Returns the head's area path and the thread serving the connection.
pub fn serve_mirror(
    mut stream: TcpStream,
    mirror: PathBuf,
) -> std::io::Result<(PathBuf, std::thread::JoinHandle<std::io::Result<()>>)> {
    stream.set_nodelay(true)?;
    let (head, kept) = match recv(&mut stream)? {
        Header::Root { head, keep } => (head, keep),
        other => return Err(unexpected("root", &other)),
    };
    let thread = std::thread::Builder::new()
        .name("roll-mirror".into())
        .spawn(move || {
            let served = keep(&mut stream, &mirror, &kept);
            if let Err(e) = &served {
                // The worker's stderr reaches the head's events.
                eprintln!("the mirror of the host area failed: {e}");
            }
            served
        })?;
    Ok((head, thread))
}

/// Serve the head's pushes and collects on `stream` into `mirror` until the head closes it;
/// the files `kept` names stay here.
fn keep(stream: &mut TcpStream, mirror: &Path, kept: &[PathBuf]) -> std::io::Result<()> {
    let mut ledger = Ledger::default();
    loop {
        let header = match recv(stream) {
            Ok(h) => h,
            // The head closed the connection: the worker is done.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        match header {
            Header::Put { rel, len } => {
                recv_file(stream, &inside(mirror, &rel)?, len)?;
                ledger.note(mirror, &rel, len)?;
            }
            Header::Delete { rel } => {
                let _ = std::fs::remove_file(inside(mirror, &rel)?);
                ledger.seen.remove(&rel);
            }
            Header::Flush => send(stream, &Header::Done)?,
            Header::Collect => {
                let (mut files, deleted) = ledger.changes(mirror)?;
                files.retain(|(rel, _)| !kept.contains(rel));
                for rel in &deleted {
                    ledger.seen.remove(rel);
                }
                send(
                    stream,
                    &Header::Changed {
                        files: files.clone(),
                        deleted,
                    },
                )?;
                for (rel, len) in files {
                    send_file(stream, &mirror.join(&rel), len)?;
                    ledger.note(mirror, &rel, len)?;
                }
            }
            other => return Err(unexpected("put, delete, flush or collect", &other)),
        }
    }
}

/// Every string in `value` that is a path under `from` made the same path under `to`: a call's
/// paths into the head's area become paths into the worker's mirror, and back for replies.
pub fn translate(value: &mut serde_json::Value, from: &Path, to: &Path) {
    use serde_json::Value;
    match value {
        Value::String(s) => {
            if let Ok(rest) = Path::new(s.as_str()).strip_prefix(from) {
                let moved = if rest.as_os_str().is_empty() {
                    to.to_path_buf()
                } else {
                    to.join(rest)
                };
                *s = moved.display().to_string();
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| translate(v, from, to)),
        Value::Object(map) => map.values_mut().for_each(|v| translate(v, from, to)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head's link and a worker's mirror thread over loopback, each with its own directory.
    fn pair() -> (
        MirrorLink,
        tempfile::TempDir,
        tempfile::TempDir,
        std::thread::JoinHandle<std::io::Result<()>>,
    ) {
        let (area, mirror) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let to = mirror.path().to_path_buf();
        let worker = std::thread::spawn(move || {
            let stream = TcpStream::connect(addr).unwrap();
            serve_mirror(stream, to)
        });
        let (stream, _) = listener.accept().unwrap();
        let link =
            MirrorLink::open(stream, area.path().to_path_buf(), vec!["kept.bin".into()]).unwrap();
        let (head, thread) = worker.join().unwrap().unwrap();
        assert_eq!(head, area.path());
        (link, area, mirror, thread)
    }

    fn read(dir: &Path, rel: &str) -> Vec<u8> {
        std::fs::read(dir.join(rel)).unwrap_or_default()
    }

    #[test]
    fn a_push_sends_what_changed_and_a_collect_brings_back_what_the_call_wrote() {
        let (mut link, area, mirror, thread) = pair();
        let (a, m) = (area.path(), mirror.path());
        std::fs::write(a.join("weights.safetensors"), [1u8; 1000]).unwrap();
        std::fs::create_dir(a.join("model")).unwrap();
        std::fs::write(a.join("model/config.json"), b"{}").unwrap();
        let moved = link.push().unwrap();
        assert_eq!((moved.files, moved.bytes), (2, 1002));
        assert_eq!(read(m, "weights.safetensors"), [1u8; 1000]);
        assert_eq!(read(m, "model/config.json"), b"{}");
        // Nothing changed: nothing moves.
        assert_eq!(link.push().unwrap().files, 0);
        // Two rewrites in place of the same length, back to back (within one tick of the
        // kernel's clock): the second is seen as surely as the first.
        for fill in [2u8, 3] {
            std::fs::write(a.join("weights.safetensors"), [fill; 1000]).unwrap();
            assert_eq!(link.push().unwrap().files, 1);
            assert_eq!(read(m, "weights.safetensors"), [fill; 1000]);
        }
        // The call writes a result and rewrites the weights; the head takes both back, and
        // nothing else.
        std::fs::write(m.join("out.safetensors"), b"result").unwrap();
        std::fs::write(m.join("weights.safetensors"), [4u8; 10]).unwrap();
        let moved = link.collect().unwrap();
        assert_eq!((moved.files, moved.bytes), (2, 16));
        assert_eq!(read(a, "out.safetensors"), b"result");
        assert_eq!(read(a, "weights.safetensors"), [4u8; 10]);
        assert_eq!(link.collect().unwrap().files, 0);
        assert_eq!(
            link.push().unwrap().files,
            0,
            "what came back is not sent again"
        );
        // What the worker keeps to itself never comes back.
        std::fs::write(m.join("kept.bin"), b"offloaded state").unwrap();
        assert_eq!(link.collect().unwrap().files, 0);
        assert!(!a.join("kept.bin").exists());
        // Removed on the head, removed in the mirror; removed by the worker, removed on the head.
        std::fs::remove_file(a.join("model/config.json")).unwrap();
        link.push().unwrap();
        assert!(!m.join("model/config.json").exists());
        std::fs::remove_file(m.join("out.safetensors")).unwrap();
        link.collect().unwrap();
        assert!(!a.join("out.safetensors").exists());
        drop(link);
        thread.join().unwrap().unwrap();
    }

    /// A peer that names a path outside the area (`..`, an absolute path) is refused, and
    /// nothing is written there.
    #[test]
    fn a_path_outside_the_area_is_refused() {
        let root = Path::new("/tmp/area");
        for bad in ["../x", "/etc/passwd", "a/../../x", ""] {
            let e = inside(root, Path::new(bad)).expect_err(bad);
            assert!(e.to_string().contains("not a path inside its area"), "{e}");
        }
        assert_eq!(inside(root, Path::new("a/b")).unwrap(), root.join("a/b"));
    }

    #[test]
    fn a_calls_paths_into_the_area_become_paths_into_the_mirror() {
        let mut call = serde_json::json!({
            "Reload": {"path": "/dev/shm/roll-tui-host-ab/actor_infer.safetensors",
                       "adapter": null, "dirs": ["/dev/shm/roll-tui-host-ab", "/dev/shm/roll-tui-host-abc/x"],
                       "n": 3}
        });
        translate(
            &mut call,
            Path::new("/dev/shm/roll-tui-host-ab"),
            Path::new("/tmp/m"),
        );
        assert_eq!(
            call,
            serde_json::json!({
                "Reload": {"path": "/tmp/m/actor_infer.safetensors", "adapter": null,
                           "dirs": ["/tmp/m", "/dev/shm/roll-tui-host-abc/x"], "n": 3}
            })
        );
    }
}
