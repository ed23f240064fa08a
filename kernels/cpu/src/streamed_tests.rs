//! The streamed product against a plain f64 triple loop for every edge of its blocks and tiles,
//! each row's bits independent of the rows beside it, and the op through candle.

use candle_core::{Device, Tensor};

use super::*;
use crate::skinny::tests::{
    assert_op_matches_matmul_and_names_bad_shapes, assert_product_matches_reference, pseudo,
};

#[test]
fn equals_the_plain_product_at_every_edge_of_blocks_and_tiles() {
    // m: at most one vector of rows (blocks of one vector: 1-8 rows with AVX2, 1-16 with
    // AVX-512), less than one block of two, exactly one (16 rows with AVX2), one and a bit,
    // several; n: whole tiles of 6 or 12 rows of w and remainders of 1-11; k from 1 up, and large
    // enough that tasks split w's rows (n * mp * k above TASK_FMAS at the shapes with n >= 1000).
    let shapes = &[
        (3, 0, 2),
        (0, 5, 4),
        (1, 1, 1),
        (1, 7, 5),
        (2, 8, 6),
        (5, 13, 7),
        (8, 40, 25),
        (9, 21, 36),
        (16, 16, 12),
        (16, 64, 37),
        (8, 300, 1000),
        (16, 96, 1211),
        (17, 33, 13),
        (32, 128, 64),
        (40, 100, 2000),
        (64, 512, 130),
    ];
    assert_product_matches_reference(matmul_t, shapes);
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
    let (x, w) = assert_op_matches_matmul_and_names_bad_shapes(streamed_matmul, NAME, 32, 128, 40);
    assert!(applies(&x, &w));
    // At most MAX_ROWS rows; beyond, the general GEMM.
    let zeros =
        |rows, cols| Tensor::zeros((rows, cols), candle_core::DType::F32, &Device::Cpu).unwrap();
    assert!(applies(&zeros(MAX_ROWS, 128), &w));
    assert!(!applies(&zeros(MAX_ROWS + 1, 128), &w));
}

#[test]
fn a_product_run_while_this_threads_scratch_is_lent_gets_buffers_of_its_own() {
    // Rayon may run a stolen job on a thread that is waiting inside a product, that is while
    // the thread's scratch is borrowed: the inner product must neither panic on the borrow nor
    // write into the outer one's buffers. The same product outside, then inside a borrow of
    // this thread's scratch (filled with NaN, which would poison any output that read it).
    let (m, k, n) = (20, 40, 30);
    let w = pseudo(n * k, 5);
    let x = pseudo(m * k, 6);
    let outside = matmul_t(&x, &w, m, k, n);
    let inside = with_scratch(64 * k, 64 * n, |xp, yt| {
        xp.fill(f32::NAN);
        yt.fill(f32::NAN);
        let inner = matmul_t(&x, &w, m, k, n);
        assert!(
            xp.iter().chain(yt.iter()).all(|v| v.is_nan()),
            "the lent buffers were written"
        );
        inner
    });
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&inside), bits(&outside));
}

#[test]
fn kept_scratch_from_a_larger_product_does_not_reach_a_smaller_one() {
    // A large product leaves its values in this thread's scratch; a smaller one with a partial
    // block of rows (padding) must still equal its own plain product.
    let (k, n) = (33, 25);
    let big = matmul_t(&pseudo(64 * k, 7), &pseudo(n * k, 8), 64, k, n);
    assert_eq!(big.len(), 64 * n);
    assert_product_matches_reference(matmul_t, &[(5, k, n), (19, k, 7)]);
}

#[test]
fn a_bf16_weight_gives_the_bits_of_its_widened_f32_copy() {
    // Tiles of 6 and remainders, one block and several, tasks splitting w's rows (the last).
    for &(m, k, n) in &[
        (1, 7, 5),
        (8, 40, 25),
        (16, 96, 1211),
        (17, 33, 13),
        (32, 128, 64),
        (64, 512, 130),
    ] {
        let w16: Vec<bf16> = pseudo(n * k, 7).into_iter().map(bf16::from_f32).collect();
        let wide: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
        let x = pseudo(m * k, 8);
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(
            bits(matmul_t(&x, &w16, m, k, n)),
            bits(matmul_t(&x, &wide, m, k, n)),
            "{m} x {k} x {n}"
        );
    }
    // Through candle: a bf16 weight is taken (and read in place), an f16 one is not.
    let x = Tensor::from_vec(pseudo(8 * 24, 9), (8, 24), &Device::Cpu).unwrap();
    let w = Tensor::from_vec(pseudo(10 * 24, 10), (10, 24), &Device::Cpu).unwrap();
    let w16 = w.to_dtype(candle_core::DType::BF16).unwrap();
    assert!(applies(&x, &w16));
    assert!(!applies(&x, &w.to_dtype(candle_core::DType::F16).unwrap()));
    let via = |w: &Tensor| {
        streamed_matmul(&x, w)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    assert_eq!(
        via(&w16),
        via(&w16.to_dtype(candle_core::DType::F32).unwrap())
    );
}
