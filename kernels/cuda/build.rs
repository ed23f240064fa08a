//! Compiles each kernel of `src/*.cu` to PTX for sm_80 and sm_90 with the toolkit's nvcc, and
//! assembles each PTX with ptxas for its architecture: PTX that would not load on a GPU fails the
//! build here, on any machine, instead of a run on a GPU. The toolkit: `toolkit.sh` beside this
//! file (`source .cuda-toolkit/env.sh`), or any CUDA 13.0 install on PATH or in CUDA_HOME.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The kernel sources, one module each (`src/NAME.cu` -> `NAME.ARCH.ptx` in OUT_DIR).
const KERNELS: &[&str] = &["logprobs", "adamw", "decode_attention"];
/// Ampere (A100) and Hopper (H100/H200); newer GPUs JIT the sm_90 PTX.
const ARCHS: &[&str] = &["sm_80", "sm_90"];

fn tool(name: &str) -> PathBuf {
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            let p = Path::new(&home).join("bin").join(name);
            if p.exists() {
                return p;
            }
        }
    }
    PathBuf::from(name)
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "{what}: cannot run {:?} ({e}); install the CUDA 13.0 toolkit with \
             kernels/cuda/toolkit.sh and `source .cuda-toolkit/env.sh`",
            cmd.get_program()
        )
    });
    if !out.status.success() {
        panic!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=CUDA_PATH");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let (nvcc, ptxas) = (tool("nvcc"), tool("ptxas"));
    for kernel in KERNELS {
        let src = format!("src/{kernel}.cu");
        println!("cargo:rerun-if-changed={src}");
        for arch in ARCHS {
            let ptx = out.join(format!("{kernel}.{arch}.ptx"));
            run(
                Command::new(&nvcc)
                    .args(["--ptx", "-O3", "-std=c++17"])
                    .arg(format!("-arch={arch}"))
                    .arg(&src)
                    .arg("-o")
                    .arg(&ptx),
                &format!("nvcc {src} for {arch}"),
            );
            run(
                Command::new(&ptxas)
                    .arg(format!("-arch={arch}"))
                    .arg(&ptx)
                    .arg("-o")
                    .arg(out.join(format!("{kernel}.{arch}.cubin"))),
                &format!("ptxas {kernel}.{arch}.ptx"),
            );
        }
    }
}
