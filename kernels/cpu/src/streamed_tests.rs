//! The streamed product against a plain f64 triple loop for every edge of its blocks and tiles,
//! each row's bits independent of the rows beside it, and the op through candle.

use candle_core::{Device, Tensor};

use super::*;
use crate::skinny::tests::{
    assert_op_matches_matmul_and_names_bad_shapes, assert_product_matches_reference, pseudo,
};

#[test]
fn equals_the_plain_product_at_every_edge_of_blocks_and_tiles() {
    // m: less than one block of x, exactly one (16 rows with AVX2), one and a bit, several; n:
    // whole tiles of 6 rows of w and remainders of 1-5; k from 1 up, and large enough that tasks
    // split w's rows (n * mp * k above TASK_FMAS at the last shapes).
    let shapes = &[
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
