//! How fast a worker's mirror of its host area fills (`src/worker/mirror.rs`: files over TCP to
//! a worker on a node that does not share the head's filesystem), against plain TCP on loopback
//! minutes apart. Each figure is the best of `ROUNDS` pushes of a changed file of `MB`
//! megabytes into a worker process's mirror in `/dev/shm`.
//!
//! `cargo bench --bench mirror` measures loopback only; `sudo bash benches/mirror_bandwidth.sh`
//! also runs the worker in a network namespace behind a veth pair and a bridge (the two nodes
//! of `.ci/nodes.sh`), with `ROLL_BENCH_NODE=roll-a ROLL_BENCH_LISTEN=10.77.0.1`.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::time::Instant;

use roll::worker::mirror::{MirrorLink, serve_mirror};

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    // The worker's side, in its own process (and namespace): mirror into /dev/shm until the
    // head closes the connection.
    if args.get(1).map(String::as_str) == Some("worker") {
        let addr = args
            .get(2)
            .ok_or_else(|| std::io::Error::other("worker ADDR"))?;
        let mirror = tempfile::Builder::new()
            .prefix("roll-bench-mirror-")
            .tempdir_in("/dev/shm")?;
        let (_, thread) = serve_mirror(TcpStream::connect(addr)?, mirror.path().to_path_buf())?;
        return thread
            .join()
            .map_err(|_| std::io::Error::other("mirror thread"))?;
    }
    let mb: usize = env_or("MB", 512);
    let rounds: usize = env_or("ROUNDS", 5);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    println!("{cpu}; {mb} MB per transfer, best of {rounds}");
    let raw = raw_loopback(mb << 20, rounds)?;
    println!("plain TCP, loopback:            {raw:6.2} GB/s");
    let lo = mirror_push(
        "127.0.0.1".parse().map_err(std::io::Error::other)?,
        None,
        mb,
        rounds,
    )?;
    println!(
        "mirror push, loopback:          {lo:6.2} GB/s  ({:.2} of plain TCP)",
        lo / raw
    );
    if let Ok(node) = std::env::var("ROLL_BENCH_NODE") {
        let listen: IpAddr = std::env::var("ROLL_BENCH_LISTEN")
            .map_err(|_| std::io::Error::other("ROLL_BENCH_LISTEN"))?
            .parse()
            .map_err(std::io::Error::other)?;
        let ns = mirror_push(listen, Some(&node), mb, rounds)?;
        println!(
            "mirror push, two namespaces:    {ns:6.2} GB/s  ({:.2} of plain TCP on loopback)",
            ns / raw
        );
    }
    Ok(())
}

/// GB/s of `bytes` from memory through a loopback TCP connection into memory.
fn raw_loopback(bytes: usize, rounds: usize) -> std::io::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let reader = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        while s.read(&mut buf)? > 0 {}
        Ok(())
    });
    let mut s = TcpStream::connect(addr)?;
    let data = vec![7u8; bytes];
    let mut best = 0f64;
    for _ in 0..rounds {
        let start = Instant::now();
        s.write_all(&data)?;
        s.flush()?;
        best = best.max(bytes as f64 / 1e9 / start.elapsed().as_secs_f64());
    }
    drop(s);
    reader
        .join()
        .map_err(|_| std::io::Error::other("reader"))??;
    Ok(best)
}

/// GB/s of pushes of a changed `mb` MB file into a worker process's mirror; the worker runs in
/// network namespace `node` when given (`ip netns exec`).
fn mirror_push(
    listen: IpAddr,
    node: Option<&str>,
    mb: usize,
    rounds: usize,
) -> std::io::Result<f64> {
    let area = tempfile::Builder::new()
        .prefix("roll-bench-area-")
        .tempdir_in("/dev/shm")?;
    let listener = TcpListener::bind((listen, 0))?;
    let addr = listener.local_addr()?.to_string();
    let me = std::env::current_exe()?;
    let mut worker = match node {
        Some(ns) => {
            let mut c = std::process::Command::new("ip");
            c.args(["netns", "exec", ns]).arg(&me);
            c
        }
        None => std::process::Command::new(&me),
    };
    let mut child = worker.args(["worker", &addr]).spawn()?;
    let (stream, _) = listener.accept()?;
    let mut link = MirrorLink::open(stream, area.path().to_path_buf(), vec![])?;
    let file = area.path().join("weights.safetensors");
    let mut best = 0f64;
    for round in 0..=rounds {
        // A rewrite in place, as a weight sync does; round 0 (a new file in the mirror) warms up.
        std::fs::write(&file, vec![round as u8; mb << 20])?;
        let moved = link.push()?;
        if round > 0 {
            best = best.max(moved.bytes as f64 / 1e9 / moved.secs);
        }
    }
    drop(link);
    child.wait()?;
    Ok(best)
}
