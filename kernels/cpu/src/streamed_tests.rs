//! The streamed product against a plain f64 triple loop for every edge of its blocks and tiles,
//! each row's bits independent of the rows beside it, and the op through candle.

use candle_core::{Device, Tensor};

use super::*;
use crate::skinny::tests::{pseudo, reference};

#[test]
fn equals_the_plain_product_at_every_edge_of_blocks_and_tiles() {
    // m: less than one block of x, exactly one (16 rows with AVX2), one and a bit, several; n:
    // whole tiles of 6 rows of w and remainders of 1-5; k from 1 up, and large enough that tasks
    // split w's rows (n * mp * k above TASK_FMAS at the last shapes).
    for &(m, k, n) in &[
        (3, 0, 2),
        (0, 5, 4),
        (1, 1, 1),
        (1, 7, 5),
        (2, 8, 6),
        (5, 13, 7),
        (16, 16, 12),
        (17, 33, 13),
        (32, 128, 64),
        (40, 100, 2000),
        (64, 512, 130),
    ] {
        let x = pseudo(m * k, 1);
        let w = pseudo(n * k, 2);
        let got = matmul_t(&x, &w, m, k, n);
        let want = reference(&x, &w, m, k, n);
        assert_eq!(got.len(), m * n);
        for (idx, (g, r)) in got.iter().zip(&want).enumerate() {
            // f32 sums of k products of magnitude <= 1: error grows like sqrt(k) ulps.
            let tol = 1e-6 * (k as f64).sqrt() * (1.0 + r.abs());
            assert!(
                (*g as f64 - r).abs() <= tol,
                "m {m} k {k} n {n}: y[{}][{}] = {g}, want {r}",
                idx / n,
                idx % n
            );
        }
    }
}

#[test]
fn a_row_gets_the_same_bits_whatever_rows_are_beside_it() {
    // 37 rows: two full blocks and a partial one; 50 rows of w: tiles of 6 and a remainder of 2.
    let (k, n) = (99, 50);
    let w = pseudo(n * k, 3);
    let x = pseudo(37 * k, 4);
    let all = matmul_t(&x, &w, 37, k, n);
    for i in 0..37 {
        let alone = matmul_t(&x[i * k..(i + 1) * k], &w, 1, k, n);
        assert_eq!(alone, all[i * n..(i + 1) * n], "row {i}");
    }
}

#[test]
fn through_candle_it_matches_matmul_and_names_bad_shapes() {
    let dev = Device::Cpu;
    let k = 128;
    let x = Tensor::from_vec(pseudo(32 * k, 5), (32, k), &dev).unwrap();
    let w = Tensor::from_vec(pseudo(40 * k, 6), (40, k), &dev).unwrap();
    assert!(applies(&x, &w));
    let got: Vec<f32> = streamed_matmul(&x, &w)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let want: Vec<f32> = x
        .matmul(&w.t().unwrap())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    for (g, r) in got.iter().zip(&want) {
        assert!((g - r).abs() <= 1e-5 * (1.0 + r.abs()), "{g} vs {r}");
    }
    let short = Tensor::zeros((40, k - 1), candle_core::DType::F32, &dev).unwrap();
    let err = streamed_matmul(&x, &short).unwrap_err().to_string();
    let says = format!("x has {k} columns, the weight {}", k - 1);
    assert!(
        err.contains("streamed matmul") && err.contains(&says),
        "{err}"
    );
    // At most MAX_ROWS rows; beyond, the general GEMM.
    let zeros = |rows, cols| Tensor::zeros((rows, cols), candle_core::DType::F32, &dev).unwrap();
    assert!(applies(&zeros(MAX_ROWS, k), &w));
    assert!(!applies(&zeros(MAX_ROWS + 1, k), &w));
}
