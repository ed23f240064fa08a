//! Hand-computed checks of `algo::loss`. Inputs are given as ratios `r`; `old_logp = logp - ln r`.

use super::*;
use candle_core::{Device, Var};

struct Case {
    logp: Var,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
}

fn t(rows: &[&[f32]]) -> Tensor {
    let v: Vec<Vec<f32>> = rows.iter().map(|r| r.to_vec()).collect();
    Tensor::new(v, &Device::Cpu).unwrap()
}

fn case(logp: &[&[f32]], ratio: &[&[f32]], adv: &[&[f32]], mask: &[&[f32]]) -> Case {
    let lp = t(logp);
    let old = (&lp - t(ratio).log().unwrap()).unwrap();
    Case {
        logp: Var::from_tensor(&lp).unwrap(),
        old,
        adv: t(adv),
        mask: t(mask),
    }
}

/// Runs the loss and returns (output, d loss / d logp flattened).
fn run(c: &Case, p: &PolicyLossParams) -> (PolicyLossOutput, Vec<f32>) {
    let out = policy_loss(p, c.logp.as_tensor(), &c.old, &c.adv, &c.mask).unwrap();
    let grads = out.loss.backward().unwrap();
    let g = grads
        .get(c.logp.as_tensor())
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()
        .concat();
    (out, g)
}

fn scalar(x: &Tensor) -> f32 {
    x.to_scalar::<f32>().unwrap()
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
    }
}

fn params(kind: PolicyLossKind) -> PolicyLossParams {
    PolicyLossParams {
        kind,
        ..Default::default()
    }
}

/// logp [[-1, -2], [-0.5, -1]], r [[1.5, 0.5], [1.1, 0.9]], A [[1, -1], [2, -2]], all valid.
fn ppo_case() -> Case {
    case(
        &[&[-1.0, -2.0], &[-0.5, -1.0]],
        &[&[1.5, 0.5], &[1.1, 0.9]],
        &[&[1.0, -1.0], &[2.0, -2.0]],
        &[&[1.0; 2], &[1.0; 2]],
    )
}

#[test]
fn ppo_clip_value_and_gradient() {
    // ε = 0.2. Token loss = -min(r A, clip(r, 0.8, 1.2) A):
    //   (0,0) r 1.5, A 1:  -min(1.5, 1.2) = -1.2   clipped high -> grad 0
    //   (0,1) r 0.5, A -1: -min(-0.5, -0.8) = 0.8  clipped low -> grad 0
    //   (1,0) r 1.1, A 2:  -2.2, unclipped -> d/dlogp = -A r = -2.2
    //   (1,1) r 0.9, A -2: 1.8, unclipped -> d/dlogp = -A r = 1.8
    // token-mean: (-1.2 + 0.8 - 2.2 + 1.8) / 4 = -0.2; grads / 4 = [0, 0, -0.55, 0.45].
    let (out, g) = run(&ppo_case(), &params(PolicyLossKind::Ppo));
    assert!((scalar(&out.loss) + 0.2).abs() < 1e-5);
    close(&g, &[0.0, 0.0, -0.55, 0.45]);
    assert!((out.clip_frac_low - 0.25).abs() < 1e-6);
    assert!((out.clip_frac_high - 0.25).abs() < 1e-6);
    // ratio mean (1.5 + 0.5 + 1.1 + 0.9) / 4 = 1.
    assert!((out.ratio_mean - 1.0).abs() < 1e-5);
    // approx_kl = 0.5 mean(ln r ^2) = 0.5 (0.1644020 + 0.4804530 + 0.0090840 + 0.0111008) / 4 = 0.0831300
    assert!((out.approx_kl - 0.083_13).abs() < 1e-5);
}

#[test]
fn ppo_clip_higher_is_asymmetric() {
    // r 1.25, A 1: ε_high 0.2 clips to 1.2 (loss -1.2, grad 0); ε_high 0.28 leaves it (loss -1.25,
    // grad -A r = -1.25). r 0.75, A -1 stays clipped low at 0.8 either way (loss 0.8, grad 0).
    let c = case(
        &[&[-1.0, -1.0]],
        &[&[1.25, 0.75]],
        &[&[1.0, -1.0]],
        &[&[1.0, 1.0]],
    );
    let (out, g) = run(&c, &params(PolicyLossKind::Ppo));
    assert!((scalar(&out.loss) - (-1.2 + 0.8) / 2.0).abs() < 1e-5);
    close(&g, &[0.0, 0.0]);
    let p = PolicyLossParams {
        clip_high: 0.28,
        ..params(PolicyLossKind::Ppo)
    };
    let (out, g) = run(&c, &p);
    assert!((scalar(&out.loss) - (-1.25 + 0.8) / 2.0).abs() < 1e-5);
    close(&g, &[-0.625, 0.0]);
    assert_eq!((out.clip_frac_low, out.clip_frac_high), (0.5, 0.0));
}

#[test]
fn ppo_dual_clip_caps_negative_advantages() {
    // c = 3. r [5, 2, 5], A [-1, -1, 1]:
    //   t0: ppo -min(-5, -0.8) = 5 -> min(5, -c A = 3) = 3 (grad 0)
    //   t1: ppo 2 -> min(2, 3) = 2 (grad -A r = 2)
    //   t2: A > 0 untouched: -min(5, 1.2) = -1.2 (grad 0)
    // mean (3 + 2 - 1.2) / 3 = 1.2666667; without dual clip (5 + 2 - 1.2) / 3 = 1.9333333.
    let c = case(
        &[&[-1.0, -1.0, -1.0]],
        &[&[5.0, 2.0, 5.0]],
        &[&[-1.0, -1.0, 1.0]],
        &[&[1.0; 3]],
    );
    let p = PolicyLossParams {
        dual_clip: Some(3.0),
        ..params(PolicyLossKind::Ppo)
    };
    let (out, g) = run(&c, &p);
    assert!((scalar(&out.loss) - 3.8 / 3.0).abs() < 1e-5);
    close(&g, &[0.0, 2.0 / 3.0, 0.0]);
    assert!((out.clip_frac_high - 1.0).abs() < 1e-6);
    let (out, _) = run(&c, &params(PolicyLossKind::Ppo));
    assert!((scalar(&out.loss) - 5.8 / 3.0).abs() < 1e-5);
    let bad = PolicyLossParams {
        dual_clip: Some(0.5),
        ..params(PolicyLossKind::Ppo)
    };
    assert!(policy_loss(&bad, c.logp.as_tensor(), &c.old, &c.adv, &c.mask).is_err());
}

#[test]
fn cispo_clips_weight_but_keeps_gradient() {
    // w = clip(r, 0.8, 1.2).detach() = [1.2, 0.8, 1.1, 0.9]; token loss -w A logp:
    //   -(1.2 * 1 * -1) = 1.2, -(0.8 * -1 * -2) = -1.6, -(1.1 * 2 * -0.5) = 1.1, -(0.9 * -2 * -1) = -1.8
    // mean -1.1 / 4 = -0.275; grad -w A / 4 = [-0.3, 0.2, -0.55, 0.45] (clipped tokens too).
    let (out, g) = run(&ppo_case(), &params(PolicyLossKind::Cispo));
    assert!((scalar(&out.loss) + 0.275).abs() < 1e-5);
    close(&g, &[-0.3, 0.2, -0.55, 0.45]);
    assert_eq!((out.clip_frac_low, out.clip_frac_high), (0.25, 0.25));
}

#[test]
fn gspo_sequence_ratio_token_gradient() {
    // mask [[1, 1], [1, 0]], log r [[0.2, 0], [0.4, (5 masked)]], A [[1, 1], [2, 2]], seq_mean_token_mean.
    // s0 = exp((0.2 + 0) / 2) = 1.1051709 (inside [0.8, 1.2]); s1 = exp(0.4) = 1.4918247 (> 1.2).
    // row0 tokens: -1.1051709 each; row1 token: -min(2.9836494, 2.4) = -2.4.
    // loss = (-1.1051709 - 2.4) / 2 = -1.7525855.
    // grads: row0 d/dlogp_t = -A s0 / (2 rows * 2 tokens) = -0.2762927; row1 clipped -> 0.
    let r = [0.2f32.exp(), 1.0, 0.4f32.exp(), 5.0f32.exp()];
    let c = case(
        &[&[-1.0, -2.0], &[-0.5, -1.0]],
        &[&r[..2], &r[2..]],
        &[&[1.0, 1.0], &[2.0, 2.0]],
        &[&[1.0, 1.0], &[1.0, 0.0]],
    );
    let p = PolicyLossParams {
        agg: LossAgg::SeqMeanTokenMean,
        ..params(PolicyLossKind::Gspo)
    };
    let (out, g) = run(&c, &p);
    assert!((scalar(&out.loss) + 1.752_585_5).abs() < 1e-5);
    close(&g, &[-0.276_292_7, -0.276_292_7, 0.0, 0.0]);
    assert!((out.clip_frac_high - 1.0 / 3.0).abs() < 1e-6);
    assert_eq!(out.clip_frac_low, 0.0);
    // ratio_mean = (2 * 1.1051709 + 1.4918247) / 3 = 1.2340555
    assert!((out.ratio_mean - 1.234_055_5).abs() < 1e-5);
    // approx_kl = 0.5 (0.04 + 0 + 0.16) / 3 = 0.0333333
    assert!((out.approx_kl - 0.033_333_3).abs() < 1e-5);
}

#[test]
fn tis_truncates_detached_weight() {
    // cap 2: r [3, 0.5] -> w [2, 0.5]; A [1, -1], logp [-1, -2]:
    // -(2 * 1 * -1) = 2, -(0.5 * -1 * -2) = -1 -> mean 0.5; grad -w A / 2 = [-1, 0.25].
    let c = case(
        &[&[-1.0, -2.0]],
        &[&[3.0, 0.5]],
        &[&[1.0, -1.0]],
        &[&[1.0, 1.0]],
    );
    let (out, g) = run(&c, &params(PolicyLossKind::Tis));
    assert!((scalar(&out.loss) - 0.5).abs() < 1e-5);
    close(&g, &[-1.0, 0.25]);
    assert_eq!((out.clip_frac_low, out.clip_frac_high), (0.0, 0.5));
    assert!((out.ratio_mean - 1.75).abs() < 1e-5);
}

#[test]
fn topr_weights_negative_samples_only() {
    // r [[3, 0.5], [1.5, 2]], A [[1, -1], [-2, 0]], logp [[-1, -2], [-0.5, -1]].
    // w: A >= 0 -> 1; A < 0 -> clamp(r, 0, 1): [[1, 0.5], [1, 1]].
    // loss tokens -w A logp: -(1*1*-1) = 1, -(0.5*-1*-2) = -1, -(1*-2*-0.5) = -1, 0 -> mean -0.25.
    // grad -w A / 4 = [-0.25, 0.125, 0.5, 0]; clip_frac_high: A < 0 and r > 1 at (1,0) -> 1/4.
    let c = case(
        &[&[-1.0, -2.0], &[-0.5, -1.0]],
        &[&[3.0, 0.5], &[1.5, 2.0]],
        &[&[1.0, -1.0], &[-2.0, 0.0]],
        &[&[1.0; 2], &[1.0; 2]],
    );
    let (out, g) = run(&c, &params(PolicyLossKind::Topr));
    assert!((scalar(&out.loss) + 0.25).abs() < 1e-5);
    close(&g, &[-0.25, 0.125, 0.5, 0.0]);
    assert_eq!((out.clip_frac_low, out.clip_frac_high), (0.0, 0.25));
}

#[test]
fn raft_pp_keeps_positive_samples() {
    // Row1 has A < 0 and is dropped. Row0: r [1.5, 1.1], A 1: -1.2 (clipped) and -1.1 -> mean over
    // the 2 kept tokens -1.15; grad [0, -r A / 2 = -0.55, 0, 0]; clip_frac_high 1/2; ratio_mean 1.3.
    let c = case(
        &[&[-1.0, -2.0], &[-0.5, -1.0]],
        &[&[1.5, 1.1], &[0.9, 1.0]],
        &[&[1.0, 1.0], &[-1.0, -1.0]],
        &[&[1.0; 2], &[1.0; 2]],
    );
    let (out, g) = run(&c, &params(PolicyLossKind::RaftPp));
    assert!((scalar(&out.loss) + 1.15).abs() < 1e-5);
    close(&g, &[0.0, -0.55, 0.0, 0.0]);
    assert_eq!(out.clip_frac_high, 0.5);
    assert!((out.ratio_mean - 1.3).abs() < 1e-5);
}

#[test]
fn vanilla_policy_gradient() {
    // -A logp: -(1 * -1) = 1, -(-1 * -2) = -2 -> mean -0.5; grad -A / 2 = [-0.5, 0.5].
    // The third token is masked: no loss, no gradient.
    let c = case(
        &[&[-1.0, -2.0, -3.0]],
        &[&[2.0, 0.5, 1.0]],
        &[&[1.0, -1.0, 7.0]],
        &[&[1.0, 1.0, 0.0]],
    );
    let (out, g) = run(&c, &params(PolicyLossKind::Vanilla));
    assert!((scalar(&out.loss) + 0.5).abs() < 1e-5);
    close(&g, &[-0.5, 0.5, 0.0]);
    assert_eq!((out.clip_frac_low, out.clip_frac_high), (0.0, 0.0));
}

#[test]
fn empty_mask_is_finite() {
    let c = case(&[&[-1.0]], &[&[1.0]], &[&[1.0]], &[&[0.0]]);
    let (out, g) = run(&c, &params(PolicyLossKind::Ppo));
    assert_eq!(scalar(&out.loss), 0.0);
    assert_eq!(g, vec![0.0]);
    assert_eq!(out.ratio_mean, 1.0);
}

#[test]
fn entropy_bonus_aggregates() {
    // token_mean of valid {1, 3, 4} = 8/3.
    let e = t(&[&[1.0, 2.0], &[3.0, 4.0]]);
    let m = t(&[&[1.0, 0.0], &[1.0, 1.0]]);
    let b = entropy_bonus(&e, &m, LossAgg::TokenMean).unwrap();
    assert!((scalar(&b) - 8.0 / 3.0).abs() < 1e-5);
}

#[test]
fn value_loss_clipped_by_hand() {
    // v [1, 2], old [0.5, 2], R [2, 0], clip 0.2:
    //   t0: v - old = 0.5 -> 0.2, v_clip 0.7; max((1-2)^2 = 1, (0.7-2)^2 = 1.69) = 1.69 -> 0.845
    //   t1: v_clip = 2; (2-0)^2 = 4 -> 2
    // mean (0.845 + 2) / 2 = 1.4225; unclipped (0.5 + 2) / 2 = 1.25.
    // grads (clipped): t0 uses the clipped branch (constant) -> 0; t1 (v - R) / 2 = 1.
    let v = Var::from_tensor(&t(&[&[1.0, 2.0]])).unwrap();
    let old = t(&[&[0.5, 2.0]]);
    let ret = t(&[&[2.0, 0.0]]);
    let m = t(&[&[1.0, 1.0]]);
    let l = value_loss(v.as_tensor(), &old, &ret, &m, Some(0.2), LossAgg::TokenMean).unwrap();
    assert!((scalar(&l) - 1.4225).abs() < 1e-5);
    let g = l
        .backward()
        .unwrap()
        .get(v.as_tensor())
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()
        .concat();
    close(&g, &[0.0, 1.0]);
    let l = value_loss(v.as_tensor(), &old, &ret, &m, None, LossAgg::TokenMean).unwrap();
    assert!((scalar(&l) - 1.25).abs() < 1e-5);
}

#[test]
fn serde_names_and_defaults() {
    let names = [
        (PolicyLossKind::Ppo, "ppo"),
        (PolicyLossKind::Gspo, "gspo"),
        (PolicyLossKind::Tis, "tis"),
        (PolicyLossKind::Topr, "topr"),
        (PolicyLossKind::Cispo, "cispo"),
        (PolicyLossKind::RaftPp, "raft_pp"),
        (PolicyLossKind::Vanilla, "vanilla"),
    ];
    for (k, s) in names {
        assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{s}\""));
    }
    let p: PolicyLossParams =
        serde_json::from_str(r#"{"kind": "cispo", "clip_high": 0.28}"#).unwrap();
    assert_eq!(p.kind, PolicyLossKind::Cispo);
    assert_eq!(
        (p.clip_low, p.clip_high, p.tis_cap, p.dual_clip),
        (0.2, 0.28, 2.0, None)
    );
    assert_eq!(PolicyLossParams::default().kind, PolicyLossKind::Ppo);
}
