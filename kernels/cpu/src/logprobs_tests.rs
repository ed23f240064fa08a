use candle_core::{D, DType, Device, Var};

use super::*;

/// The same quantities from candle's differentiable ops (what the loss used before); also the
/// reference of the fused head's tests.
pub(crate) fn reference(logits: &Tensor, targets: &Tensor) -> (Tensor, Tensor) {
    let logp = candle_nn::ops::log_softmax(logits, D::Minus1).unwrap();
    let lp = logp
        .gather(&targets.unsqueeze(2).unwrap().contiguous().unwrap(), 2)
        .unwrap()
        .squeeze(2)
        .unwrap();
    let h = (logp.exp().unwrap() * &logp)
        .unwrap()
        .sum(D::Minus1)
        .unwrap()
        .neg()
        .unwrap();
    (lp, h)
}

fn close(a: &Tensor, b: &Tensor, tol: f32) {
    let a: Vec<f32> = a.flatten_all().unwrap().to_vec1().unwrap();
    let b: Vec<f32> = b.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "element {i}: {x} vs {y}"
        );
    }
}

#[test]
fn values_and_gradients_equal_candles_ops() {
    let dev = Device::Cpu;
    let (b, s, v) = (3, 5, 37);
    // Logits spread over a wide range (a peaked and a flat row among them).
    let logits = Tensor::randn(0f32, 4.0, (b, s, v), &dev).unwrap();
    let targets = Tensor::from_vec(
        (0..(b * s) as u32).map(|i| (i * 7) % v as u32).collect(),
        (b, s),
        &dev,
    )
    .unwrap();
    // Weights of each output in a stand-in loss, so both gradient paths are exercised.
    let w_lp = Tensor::randn(0f32, 1.0, (b, s), &dev).unwrap();
    let w_h = Tensor::randn(0f32, 1.0, (b, s), &dev).unwrap();

    let ours = Var::from_tensor(&logits).unwrap();
    let (lp, h) = logprobs_and_entropy(ours.as_tensor(), &targets, true).unwrap();
    let theirs = Var::from_tensor(&logits).unwrap();
    let (lp_ref, h_ref) = reference(theirs.as_tensor(), &targets);
    close(&lp, &lp_ref, 1e-5);
    close(&h, &h_ref, 1e-5);

    let loss = |lp: &Tensor, h: &Tensor| {
        ((lp * &w_lp).unwrap().sum_all().unwrap() + (h * &w_h).unwrap().sum_all().unwrap()).unwrap()
    };
    let g = loss(&lp, &h).backward().unwrap();
    let g_ref = loss(&lp_ref, &h_ref).backward().unwrap();
    close(
        g.get(ours.as_tensor()).unwrap(),
        g_ref.get(theirs.as_tensor()).unwrap(),
        1e-4,
    );

    // Without the entropy: the same log-probs and their gradient alone.
    let only = Var::from_tensor(&logits).unwrap();
    let (lp2, h2) = logprobs_and_entropy(only.as_tensor(), &targets, false).unwrap();
    close(&lp2, &lp_ref, 1e-5);
    assert_eq!(
        h2.abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap(),
        0.0
    );
    let g2 = (&lp2 * &w_lp)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let g2_ref = (&lp_ref * &w_lp)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    close(
        g2.get(only.as_tensor()).unwrap(),
        g2_ref.get(theirs.as_tensor()).unwrap(),
        1e-4,
    );
}

#[test]
fn a_target_outside_the_vocabulary_is_an_error_not_a_panic() {
    let dev = Device::Cpu;
    let logits = Tensor::zeros((1, 2, 4), DType::F32, &dev).unwrap();
    let targets = Tensor::from_vec(vec![1u32, 4], (1, 2), &dev).unwrap();
    let err = logprobs_and_entropy(&logits, &targets, true).unwrap_err();
    assert!(
        err.to_string()
            .contains("target 4 is outside the vocabulary of 4"),
        "{err}"
    );
    let empty = Tensor::zeros((1, 2, 0), DType::F32, &dev).unwrap();
    let err = logprobs_and_entropy(&empty, &targets, true).unwrap_err();
    assert!(err.to_string().contains("the vocabulary is empty"), "{err}");
    // A uniform row: log-prob -ln 4, entropy ln 4.
    let ok = Tensor::from_vec(vec![1u32, 3], (1, 2), &dev).unwrap();
    let (lp, h) = logprobs_and_entropy(&logits, &ok, true).unwrap();
    let ln4 = 4f32.ln();
    close(&lp, &Tensor::new(&[[-ln4, -ln4]], &dev).unwrap(), 1e-6);
    close(&h, &Tensor::new(&[[ln4, ln4]], &dev).unwrap(), 1e-6);
}
