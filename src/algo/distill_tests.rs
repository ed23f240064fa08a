//! Each divergence against a direct computation in f64 written here from the definitions in the
//! module's documentation (ROLL's `various_divergence.py`), on two positions of a top-4 support,
//! and its gradient in the student's logits against central differences of that computation.

use candle_core::{Device, Tensor, Var};

use super::*;

/// Two positions: the teacher's logits at its top 4 (renormalised below) and the student's
/// logits at the same ids.
const TEACHER: [[f64; 4]; 2] = [[2.0, 1.0, 0.5, -1.0], [0.1, 0.0, -0.2, -3.0]];
const STUDENT: [[f64; 4]; 2] = [[0.3, 1.2, -0.4, 0.8], [1.5, -0.5, 0.2, 0.0]];

fn log_softmax(x: &[f64]) -> Vec<f64> {
    let max = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + x.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
    x.iter().map(|v| v - lse).collect()
}

/// adaptive_kl's (head, tail) weights: the teacher's probabilities ascending, the prefix of
/// cumulative mass ≤ α is the tail.
fn adaptive(p: &[f64], q: &[f64], alpha: f64) -> (f64, f64) {
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[a].partial_cmp(&p[b]).expect("finite"));
    let (mut cum, mut head, mut tail) = (0.0, 0.0, 0.0);
    for i in order {
        cum += p[i];
        if cum <= alpha {
            tail += (p[i] - q[i]).abs();
        } else {
            head += (p[i] - q[i]).abs();
        }
    }
    (head / (head + tail), tail / (head + tail))
}

/// The divergence at one position, straight from the definitions; `weights` fixes adaptive_kl's
/// (head, tail) weights (ROLL does not differentiate them), else they are computed here.
fn direct(params: &KdParams, z: &[f64], teacher: &[f64], weights: Option<(f64, f64)>) -> f64 {
    let lp = log_softmax(teacher);
    let p: Vec<f64> = lp.iter().map(|v| v.exp()).collect();
    let zt: Vec<f64> = z.iter().map(|v| v / params.kd_temperature).collect();
    let lq = log_softmax(&zt);
    let q: Vec<f64> = lq.iter().map(|v| v.exp()).collect();
    let k = z.len();
    let fkl: f64 = (0..k).map(|i| p[i] * (lp[i] - lq[i])).sum();
    let rkl: f64 = (0..k).map(|i| q[i] * (lq[i] - lp[i])).sum();
    let l = params.skew_lambda;
    match params.objective {
        KdObjective::ForwardKl => fkl,
        KdObjective::ReverseKl => rkl,
        KdObjective::AdaptiveKl => {
            let (h, t) = weights.unwrap_or_else(|| adaptive(&p, &q, params.adaptive_kl_alpha));
            h * fkl + t * rkl
        }
        KdObjective::SkewedForwardKl => (0..k)
            .map(|i| p[i] * (lp[i] - (l * p[i] + (1.0 - l) * q[i]).ln()))
            .sum(),
        KdObjective::SkewedReverseKl => (0..k)
            .map(|i| q[i] * (lq[i] - ((1.0 - l) * p[i] + l * q[i]).ln()))
            .sum(),
        KdObjective::JsDivergence => {
            let e = 1e-9;
            (0..k)
                .map(|i| {
                    let lm = ((p[i] + q[i]) / 2.0 + e).ln();
                    (p[i] * ((p[i] + e).ln() - lm) + q[i] * ((q[i] + e).ln() - lm)) / 2.0
                })
                .sum()
        }
    }
}

fn tensor(rows: &[[f64; 4]]) -> Tensor {
    let v: Vec<f32> = rows.iter().flatten().map(|x| *x as f32).collect();
    Tensor::from_vec(v, (rows.len(), 4), &Device::Cpu).expect("tensor")
}

fn teacher_logp() -> Tensor {
    let rows: Vec<[f64; 4]> = TEACHER
        .iter()
        .map(|t| {
            let l = log_softmax(t);
            [l[0], l[1], l[2], l[3]]
        })
        .collect();
    tensor(&rows)
}

const ALL: [KdObjective; 6] = [
    KdObjective::ForwardKl,
    KdObjective::ReverseKl,
    KdObjective::AdaptiveKl,
    KdObjective::SkewedForwardKl,
    KdObjective::SkewedReverseKl,
    KdObjective::JsDivergence,
];

fn params(objective: KdObjective) -> KdParams {
    KdParams {
        objective,
        kd_temperature: 2.0,
        // Position 0's teacher probabilities ascending are 0.041, 0.112, 0.184, 0.664: α 0.3
        // makes the two smallest the tail, so both weights are neither 0 nor 1.
        adaptive_kl_alpha: 0.3,
        skew_lambda: 0.1,
    }
}

#[test]
fn each_objective_equals_its_definition_and_its_gradient_central_differences() {
    for objective in ALL {
        let params = params(objective);
        let z = Var::from_tensor(&tensor(&STUDENT)).expect("z");
        let div = divergence(&params, z.as_tensor(), &teacher_logp()).expect("divergence");
        let got = div.to_vec1::<f32>().expect("values");
        let grads = div.sum_all().and_then(|s| s.backward()).expect("backward");
        let grad = grads
            .get(&z)
            .expect("gradient")
            .to_vec2::<f32>()
            .expect("grad");
        for (row, (zr, tr)) in STUDENT.iter().zip(&TEACHER).enumerate() {
            let want = direct(&params, zr, tr, None);
            assert!(
                (got[row] as f64 - want).abs() < 1e-6 * (1.0 + want.abs()),
                "{objective:?} position {row}: {} vs {want}",
                got[row]
            );
            assert!(want > 0.0, "{objective:?} position {row}: {want}");
            // adaptive_kl's weights stay as they are at z: ROLL takes no gradient of them.
            let lp = log_softmax(tr);
            let p: Vec<f64> = lp.iter().map(|v| v.exp()).collect();
            let zt: Vec<f64> = zr.iter().map(|v| v / params.kd_temperature).collect();
            let q: Vec<f64> = log_softmax(&zt).iter().map(|v| v.exp()).collect();
            let weights = Some(adaptive(&p, &q, params.adaptive_kl_alpha));
            for i in 0..4 {
                let h = 1e-4;
                let (mut up, mut down) = (*zr, *zr);
                up[i] += h;
                down[i] -= h;
                let fd = (direct(&params, &up, tr, weights) - direct(&params, &down, tr, weights))
                    / (2.0 * h);
                let g = grad[row][i] as f64;
                assert!(
                    (g - fd).abs() < 1e-4 * (1.0 + fd.abs()),
                    "{objective:?} d/dz[{row}][{i}]: {g} vs {fd}"
                );
            }
        }
    }
}

#[test]
fn every_divergence_is_zero_where_the_student_matches_the_teacher() {
    // The student's logits equal to the teacher's log-probs times the temperature: q = p.
    let lp = teacher_logp();
    for objective in ALL {
        let params = params(objective);
        let z = (&lp * params.kd_temperature).expect("z");
        let d = divergence(&params, &z, &lp).expect("divergence");
        for v in d.to_vec1::<f32>().expect("values") {
            // js_divergence's ε leaves ~1e-9.
            assert!(v.abs() < 1e-6, "{objective:?}: {v}");
        }
    }
}

#[test]
fn the_students_logits_are_gathered_at_the_teachers_ids_only() {
    let dev = Device::Cpu;
    let hidden = Tensor::new(&[[1.0f32, 2.0], [0.5, -1.0]], &dev).expect("hidden");
    // A vocabulary of 5, hidden 2.
    let head = Tensor::new(
        &[
            [1.0f32, 0.0],
            [0.0, 1.0],
            [1.0, 1.0],
            [2.0, -1.0],
            [-1.0, 3.0],
        ],
        &dev,
    )
    .expect("head");
    let ids = Tensor::new(&[[4u32, 0], [3, 2]], &dev).expect("ids");
    let got = gather_logits(&hidden, &head, &ids)
        .and_then(|t| t.to_vec2::<f32>())
        .expect("gathered");
    // Row 0: h = (1, 2): id 4 → -1 + 6 = 5, id 0 → 1. Row 1: h = (0.5, -1): id 3 → 1 + 1 = 2,
    // id 2 → 0.5 - 1 = -0.5.
    assert_eq!(got, [[5.0, 1.0], [2.0, -0.5]]);
}

#[test]
fn the_loss_weighs_ce_and_kd_over_the_batchs_tokens_and_w_0_is_sft() {
    let dev = Device::Cpu;
    let ce_sum = Tensor::new(6.0f32, &dev).expect("ce");
    let kd = Tensor::new(&[0.5f32, 1.5, 9.0], &dev).expect("kd");
    // The third position is padding.
    let mask = Tensor::new(&[1.0f32, 1.0, 0.0], &dev).expect("mask");
    let scalar = |t: &Tensor| t.to_scalar::<f32>().expect("scalar");
    let (loss, ce, kd_part) = distill_loss(&ce_sum, &kd, &mask, 4.0, 0.25).expect("loss");
    // CE 6 / 4 = 1.5, KD (0.5 + 1.5) / 4 = 0.5: 0.75 · 1.5 + 0.25 · 0.5 = 1.25.
    assert_eq!((scalar(&ce), scalar(&kd_part)), (1.5, 0.5));
    assert_eq!(scalar(&loss), 1.25);
    let (sft, ..) = distill_loss(&ce_sum, &kd, &mask, 4.0, 0.0).expect("w 0");
    assert_eq!(scalar(&sft), 1.5, "w = 0 is SFT's token-mean NLL");
}
