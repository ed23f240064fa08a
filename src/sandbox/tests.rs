use super::*;

fn args(sandbox: &Sandbox) -> Vec<String> {
    let cmd = sandbox.command(std::path::Path::new("/tmp/p/main.py"), &Limits::default());
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn the_command_drops_root_limits_and_isolates() {
    let root = Sandbox {
        bwrap: PathBuf::from("/usr/bin/bwrap"),
        python: PathBuf::from(PYTHON),
        drop_root: true,
    };
    let a = args(&root);
    assert_eq!(a[..2], ["setpriv", "--reuid=65534"]);
    for flag in [
        "--cpu=3",
        "--as=536870912",
        "--fsize=1048576",
        "--nofile=64",
        "--core=0",
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--remount-ro",
    ] {
        assert!(a.iter().any(|x| x == flag), "{flag} missing from {a:?}");
    }
    // The process limit sits above what `nobody` already runs.
    let nproc: u64 = a
        .iter()
        .find_map(|x| x.strip_prefix("--nproc="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(nproc >= Limits::default().processes);
    // The tmpfs size applies to /tmp, and the program is the last argument, run isolated.
    let size = a.iter().position(|x| x == "--size").unwrap_or(0);
    assert_eq!(a[size + 1..size + 4], ["16777216", "--tmpfs", "/tmp"]);
    assert_eq!(a[a.len() - 3..], [PYTHON, "-I", "/sandbox/main.py"]);
    // Nothing of the host but /usr is bound.
    let binds: Vec<&String> = a
        .iter()
        .zip(a.iter().skip(1))
        .filter(|(flag, _)| flag.as_str() == "--ro-bind" || flag.as_str() == "--bind")
        .map(|(_, src)| src)
        .collect();
    assert_eq!(binds, ["/usr", "/tmp/p/main.py"]);

    let user = Sandbox {
        drop_root: false,
        ..root
    };
    assert_eq!(args(&user)[0], "prlimit");
}

#[test]
fn the_user_task_count_sees_this_process() {
    let me = nix::unistd::getuid().as_raw();
    // This test runs on threads of the test harness: at least one task.
    assert!(run::user_tasks(me) >= 1);
    assert_eq!(run::user_tasks(u32::MAX - 7), 0);
}
