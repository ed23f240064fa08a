//! The device seam holds: outside `src/device.rs` and tests, no code names candle's CPU device, so
//! every tensor is made either on the device a role was placed on or explicitly in host memory
//! (`roll::device::host`). A new `Device::Cpu` in the engine would pin a GPU run's tensors to the
//! CPU without a word; this test names the file and line instead.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The lines of `text` outside unit tests: everything before the first `#[cfg(test)]` (our files
/// keep their test modules at the end), with comments dropped.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .take_while(|(_, l)| l.trim() != "#[cfg(test)]")
        .map(|(i, l)| (i + 1, l.split("//").next().unwrap_or("")))
}

fn offenders(src: &Path) -> Vec<String> {
    let mut files = vec![];
    rust_files(src, &mut files);
    files.sort();
    let mut found = vec![];
    for file in files {
        let rel = file
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let name = file.file_name().unwrap().to_string_lossy();
        // The seam itself, and files that hold only tests.
        if rel == "device.rs" || name.ends_with("_tests.rs") || name == "tests.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in code_lines(&text) {
            if line.contains("Device::Cpu") {
                found.push(format!("src/{rel}:{n}: {}", line.trim()));
            }
        }
    }
    found
}

#[test]
fn only_the_device_seam_names_the_cpu_device() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = offenders(&src);
    assert!(
        found.is_empty(),
        "these lines name Device::Cpu outside src/device.rs: use roll::device::host() for host \
         memory or the role's device (roll::device::open) for compute:\n  {}",
        found.join("\n  ")
    );
}

/// The scan finds a `Device::Cpu` where one is, and skips comments and unit tests.
#[test]
fn the_scan_sees_a_cpu_device_in_code() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("model")).unwrap();
    std::fs::write(
        dir.path().join("model/x.rs"),
        "// Device::Cpu in a comment\nfn f() { let d = Device::Cpu; }\n#[cfg(test)]\nmod tests { \
         fn g() { Device::Cpu; } }\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("device.rs"), "fn h() { Device::Cpu; }\n").unwrap();
    std::fs::write(dir.path().join("a_tests.rs"), "fn t() { Device::Cpu; }\n").unwrap();
    assert_eq!(
        offenders(dir.path()),
        ["src/model/x.rs:2: fn f() { let d = Device::Cpu; }"]
    );
}
