#!/usr/bin/env python3
"""The tiny forward+backward's matrix products through PyTorch (MKL on x86: what HF transformers
multiplies with), one thread, in cache: the peer's side of
`cargo bench -p roll-cpu-kernels --bench ceiling -- shapes`, same products, same layouts, same
labels, same statistic (the least of 9 timed runs after one to warm up), and the same total: one
lane's step (4 layers x 21 products, 480 rows) at those rates.

Run both back to back (the machine is shared, so compare only figures of one run):
    /tmp/peervenv/bin/python benches/peer_products.py
    cargo bench -p roll-cpu-kernels --bench ceiling -- shapes

`--shape qwen05` does the same at the Qwen2.5-0.5B shape of `engine qwen05-fwd_bwd` (1008 rows,
24 layers), against `ceiling -- qwen05`.
"""
import argparse
import time

import torch

# (rows, hidden, k and v's width, MLP's width, layers), as ceiling.rs's LANE_ROWS/TINY/LAYERS and
# QWEN05_ROWS/QWEN05/QWEN05_LAYERS.
SHAPES = {"tiny": (480, 128, 64, 512, 4), "qwen05": (1008, 896, 128, 4864, 24)}
ROWS, H, KV, FF, LAYERS = SHAPES["tiny"]


def layer_products(rows):
    """(m, k, n, a_t, b_t, add) as kernels/cpu/benches/ceiling.rs lists them, in its order."""
    p = lambda m, k, n, a_t, b_t, add: (m, k, n, a_t, b_t, add)  # noqa: E731
    return [
        p(rows, H, H, False, True, False), p(rows, H, KV, False, True, False),
        p(rows, H, KV, False, True, False), p(rows, H, H, False, True, False),
        p(rows, H, FF, False, True, False), p(rows, H, FF, False, True, False),
        p(rows, FF, H, False, True, False),
        p(H, rows, FF, True, False, False), p(rows, H, FF, False, False, False),
        p(FF, rows, H, True, False, False), p(FF, rows, H, True, False, False),
        p(rows, FF, H, False, False, False), p(rows, FF, H, False, False, True),
        p(H, rows, H, True, False, False), p(rows, H, H, False, False, False),
        p(H, rows, H, True, False, False), p(KV, rows, H, True, False, False),
        p(KV, rows, H, True, False, False), p(rows, H, H, False, False, False),
        p(rows, KV, H, False, False, True), p(rows, KV, H, False, False, True),
    ]


def label(m, k, n, a_t, b_t, add):
    t = lambda yes: "ᵀ" if yes else ""  # noqa: E731
    return f"({m}, {k}){t(a_t)} x ({k}, {n}){t(b_t)}{', summed' if add else ''}"


def least_seconds(f, calls=20):
    f()
    best = float("inf")
    for _ in range(9):
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def main():
    global ROWS, H, KV, FF, LAYERS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    shape_name = ap.parse_args().shape
    ROWS, H, KV, FF, LAYERS = SHAPES[shape_name]
    # A 0.5B product takes ~0.1 s: one call a timing is plenty.
    calls = 20 if shape_name == "tiny" else 1
    torch.set_num_threads(1)
    seconds = {}
    for shape in layer_products(ROWS):
        if shape in seconds:
            continue
        m, k, n, a_t, b_t, add = shape
        a = torch.randn(k, m).t() if a_t else torch.randn(m, k)
        b = torch.randn(n, k).t() if b_t else torch.randn(k, n)
        out = torch.zeros(m, n)
        if add:
            f = lambda: out.addmm_(a, b)  # noqa: E731
        else:
            f = lambda: torch.mm(a, b, out=out)  # noqa: E731
        s = least_seconds(f, calls)
        seconds[shape] = s
        print(f"{label(*shape):36} one thread: {s * 1e6:8.1f} us, {2 * m * k * n / s / 1e9:5.1f} GFLOP/s")
    lane = sum(seconds[p] for p in layer_products(ROWS)) * LAYERS
    flops = sum(2 * m * k * n for (m, k, n, *_) in layer_products(ROWS)) * LAYERS
    what = "one lane's step" if shape_name == "tiny" else f"the {LAYERS} layers ({ROWS} rows, the head not included)"
    print(f"{what} at those rates: {lane * 1e3:.1f} ms, {flops / lane / 1e9:.1f} GFLOP/s "
          f"(torch {torch.__version__}, MKL: {torch.backends.mkl.is_available()})")


if __name__ == "__main__":
    main()
