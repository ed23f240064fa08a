//! The skinny product against a plain f64 triple loop, for every tile remainder; and each row's
//! result independent of the rows beside it.

use candle_core::{Device, Tensor};

use super::*;

/// Deterministic values in [-1, 1): a multiplicative hash of the index, so no RNG is needed.
pub(crate) fn pseudo(n: usize, salt: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let h = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ salt.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            ((h >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// y[i][j] = sum_t x[i][t] w[j][t], in f64.
pub(crate) fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut y = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            y[i * n + j] = (0..k)
                .map(|t| x[i * k + t] as f64 * w[j * k + t] as f64)
                .sum();
        }
    }
    y
}

#[test]
fn equals_the_plain_product_for_every_remainder_of_the_tiles() {
    // m covers tiles of 4, 3, 2 and 1 rows of x; n tiles of 3, 2 and 1 rows of w; k a whole
    // number of SIMD vectors, a remainder, shorter than one vector, and long enough that tasks
    // split the columns (n * m * k above TASK_FMAS at the last shape).
    let shapes = &[
        (3, 0, 2),
        (0, 5, 4),
        (1, 1, 1),
        (1, 7, 5),
        (2, 8, 2),
        (3, 13, 4),
        (4, 16, 3),
        (5, 33, 7),
        (7, 100, 8),
        (16, 896, 97),
        (9, 64, 2000),
    ];
    assert_product_matches_reference(matmul_t, shapes);
}

#[test]
fn a_row_gets_the_same_bits_whatever_rows_are_beside_it() {
    // k = 99: a SIMD part and a scalar tail.
    let (k, n) = (99, 50);
    let w = pseudo(n * k, 3);
    let x = pseudo(11 * k, 4);
    let all = matmul_t(&x, &w, 11, k, n);
    for i in 0..11 {
        let alone = matmul_t(&x[i * k..(i + 1) * k], &w, 1, k, n);
        assert_eq!(alone, all[i * n..(i + 1) * n], "row {i}");
    }
}

#[test]
fn through_candle_it_matches_matmul_and_names_bad_shapes() {
    let (x, w) =
        assert_op_matches_matmul_and_names_bad_shapes(skinny_matmul, NAME, 6, MIN_DEPTH, 30);
    assert!(applies(&x, &w));
    // At most MAX_ROWS rows of at least MIN_DEPTH columns; beyond, another product.
    let k = MIN_DEPTH;
    let zeros =
        |rows, cols| Tensor::zeros((rows, cols), candle_core::DType::F32, &Device::Cpu).unwrap();
    assert!(applies(&zeros(MAX_ROWS, k), &w));
    assert!(!applies(&zeros(MAX_ROWS + 1, k), &w));
    assert!(!applies(&zeros(6, k - 1), &zeros(30, k - 1)));
}

/// A few-row product (x (m, k), w (n, k) -> y (m, n)) against [`reference`] at each (m, k, n).
pub(crate) fn assert_product_matches_reference(
    product: crate::RowProduct,
    shapes: &[(usize, usize, usize)],
) {
    for &(m, k, n) in shapes {
        let x = pseudo(m * k, 1);
        let w = pseudo(n * k, 2);
        let got = product(&x, &w, m, k, n);
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

/// A few-row product's candle op on x (rows, k) and w (n, k): the values of candle's matmul
/// (1e-5), and a weight of another depth refused with an error naming the kernel. Returns x, w.
pub(crate) fn assert_op_matches_matmul_and_names_bad_shapes(
    op: fn(&Tensor, &Tensor) -> candle_core::Result<Tensor>,
    name: &str,
    rows: usize,
    k: usize,
    n: usize,
) -> (Tensor, Tensor) {
    let dev = Device::Cpu;
    let x = Tensor::from_vec(pseudo(rows * k, 5), (rows, k), &dev).unwrap();
    let w = Tensor::from_vec(pseudo(n * k, 6), (n, k), &dev).unwrap();
    let got: Vec<f32> = op(&x, &w)
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
    let short = Tensor::zeros((n, k - 1), candle_core::DType::F32, &dev).unwrap();
    let err = op(&x, &short).unwrap_err().to_string();
    let says = format!("x has {k} columns, the weight {}", k - 1);
    assert!(err.contains(name) && err.contains(&says), "{err}");
    (x, w)
}
