//! What model roles in worker processes work on, as one safetensors file each: an [`ActorStep`]
//! for actor_train, a [`CriticStep`] for the critic, the [`Rows`] of a forward pass (reference
//! log-probs, critic values). Ragged token rows are flattened beside their lengths, and scalars
//! travel as f64 / i64 tensors so that the worker computes on exactly the parent's values.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use super::epochs::{ActorStep, CriticStep, EpochRows, PolicyTargets, Targets};
use super::rows::Rows;
use crate::scheduler::host_copy::{HostCopyError, read_tensors, write_tensors};

fn ragged(rows: &[Vec<u32>]) -> candle_core::Result<(Tensor, Tensor)> {
    let flat: Vec<u32> = rows.iter().flatten().copied().collect();
    let lens: Vec<u32> = rows.iter().map(|r| r.len() as u32).collect();
    let n = flat.len();
    Ok((
        Tensor::from_vec(flat, n, &crate::device::host())?,
        Tensor::from_vec(lens, rows.len(), &crate::device::host())?,
    ))
}

fn unragged(flat: &Tensor, lens: &Tensor) -> candle_core::Result<Vec<Vec<u32>>> {
    let flat = flat.to_vec1::<u32>()?;
    let mut rows = vec![];
    let mut at = 0;
    for len in lens.to_vec1::<u32>()? {
        let end = at + len as usize;
        if end > flat.len() {
            candle_core::bail!("row lengths add up to more than the {} tokens", flat.len());
        }
        rows.push(flat[at..end].to_vec());
        at = end;
    }
    Ok(rows)
}

/// What both files hold: the token rows, and scalars (f64 and i64).
fn header(
    prompts: &[Vec<u32>],
    responses: &[Vec<u32>],
    floats: &[f64],
    ints: &[i64],
) -> candle_core::Result<Vec<(String, Tensor)>> {
    let (p, p_lens) = ragged(prompts)?;
    let (r, r_lens) = ragged(responses)?;
    Ok(vec![
        ("prompts".to_string(), p),
        ("prompt_lens".into(), p_lens),
        ("responses".into(), r),
        ("response_lens".into(), r_lens),
        (
            "floats".into(),
            Tensor::new(floats, &crate::device::host())?,
        ),
        ("ints".into(), Tensor::new(ints, &crate::device::host())?),
    ])
}

/// A file being read: its tensors not taken yet, and how errors name it.
struct Opened {
    tensors: HashMap<String, Tensor>,
    origin: String,
}

/// The rows and scalars of a file [`header`] began.
type Header = (Vec<Vec<u32>>, Vec<Vec<u32>>, Vec<f64>, Vec<i64>);

impl Opened {
    fn new(what: &str, path: &Path, device: &Device) -> Result<(Opened, Header), String> {
        let tensors = read_tensors(path, device).map_err(|e| e.to_string())?;
        let origin = format!("{what} '{}'", path.display());
        let at = |e: candle_core::Error| format!("{origin}: {e}");
        let mut f = Opened {
            tensors,
            origin: origin.clone(),
        };
        let prompts = unragged(&f.take("prompts")?, &f.take("prompt_lens")?).map_err(at)?;
        let responses = unragged(&f.take("responses")?, &f.take("response_lens")?).map_err(at)?;
        let floats = f.take("floats")?.to_vec1::<f64>().map_err(at)?;
        let ints = f.take("ints")?.to_vec1::<i64>().map_err(at)?;
        Ok((f, (prompts, responses, floats, ints)))
    }

    fn take(&mut self, name: &str) -> Result<Tensor, String> {
        self.tensors
            .remove(name)
            .ok_or_else(|| format!("{}: tensor '{name}' is missing", self.origin))
    }

    fn bad_scalars(&self, expected: &str) -> String {
        format!("{}: expected {expected}", self.origin)
    }
}

/// The header and loss mask of an epoch file: `rows` and the scalars after its own.
fn epoch_header(
    rows: &EpochRows,
    floats: &[f64],
    more_ints: &[i64],
    path: &Path,
) -> Result<Vec<(String, Tensor)>, HostCopyError> {
    // Seeds use all 64 bits: they travel as their i64 bit pattern.
    let mut ints = vec![rows.group_size as i64, rows.micro as i64, rows.seed as i64];
    ints.extend(more_ints);
    let mut tensors =
        header(&rows.prompts, &rows.responses, floats, &ints).map_err(|source| HostCopyError {
            path: path.to_path_buf(),
            source,
        })?;
    tensors.push(("loss_mask".into(), rows.loss_mask.clone()));
    Ok(tensors)
}

/// Open a file [`epoch_header`] began, expecting `more_ints` integers after its own.
fn open_epoch(
    what: &str,
    path: &Path,
    device: &Device,
    more_ints: usize,
) -> Result<(Opened, EpochRows, Vec<f64>, Vec<i64>), String> {
    let (mut f, (prompts, responses, fl, ints)) = Opened::new(what, path, device)?;
    let (&[group_size, micro, seed], more) = ints.split_at_checked(3).unwrap_or((&[], &[])) else {
        return Err(f.bad_scalars(&format!("{} integers", 3 + more_ints)));
    };
    if more.len() != more_ints {
        return Err(f.bad_scalars(&format!("{} integers", 3 + more_ints)));
    }
    let more = more.to_vec();
    let rows = EpochRows {
        prompts,
        responses,
        group_size: group_size as usize,
        micro: micro as usize,
        loss_mask: f.take("loss_mask")?,
        seed: seed as u64,
    };
    Ok((f, rows, fl, more))
}

/// The kind of an actor step's targets, as its file's last integer says.
const POLICY_TARGETS: i64 = 0;
const LIKELIHOOD_TARGETS: i64 = 1;
const PREFERENCE_TARGETS: i64 = 2;
const DISTILL_TARGETS: i64 = 3;

/// Write `step` to `path`; returns the bytes of tensor data written.
pub fn write_actor(step: &ActorStep, path: &Path) -> Result<u64, HostCopyError> {
    let tensors = match &step.targets {
        Targets::Policy(p) => {
            let floats = [p.temperature, p.kl_coef];
            let mut tensors = epoch_header(&step.rows, &floats, &[POLICY_TARGETS], path)?;
            tensors.extend([
                ("adv".into(), p.adv.clone()),
                ("old_logp".into(), p.old_logp.clone()),
            ]);
            if let Some(r) = &p.ref_logp {
                tensors.push(("ref_logp".into(), r.clone()));
            }
            tensors
        }
        Targets::Likelihood => epoch_header(&step.rows, &[], &[LIKELIHOOD_TARGETS], path)?,
        Targets::Preference {
            ref_logp,
            pair_domains,
        } => {
            let mut tensors = epoch_header(&step.rows, &[], &[PREFERENCE_TARGETS], path)?;
            tensors.push(("ref_logp".into(), ref_logp.clone()));
            // Absent when the pairs have no domains (an empty tensor is no use to anyone).
            if !pair_domains.is_empty() {
                let domains = Tensor::new(pair_domains.as_slice(), &crate::device::host())
                    .map_err(|source| HostCopyError {
                        path: path.to_path_buf(),
                        source,
                    })?;
                tensors.push(("pair_domains".into(), domains));
            }
            tensors
        }
        Targets::Distill {
            topk_ids,
            topk_logp,
            row_domains,
        } => {
            let mut tensors = epoch_header(&step.rows, &[], &[DISTILL_TARGETS], path)?;
            tensors.push(("topk_ids".into(), topk_ids.clone()));
            tensors.push(("topk_logp".into(), topk_logp.clone()));
            if !row_domains.is_empty() {
                let domains = Tensor::new(row_domains.as_slice(), &crate::device::host()).map_err(
                    |source| HostCopyError {
                        path: path.to_path_buf(),
                        source,
                    },
                )?;
                tensors.push(("row_domains".into(), domains));
            }
            tensors
        }
    };
    write_tensors(path, &tensors)
}

/// Read what [`write_actor`] wrote, with the per-token tensors on `device`.
pub fn read_actor(path: &Path, device: &Device) -> Result<ActorStep, String> {
    let (mut f, rows, floats, kind) = open_epoch("actor step", path, device, 1)?;
    let targets = match (kind[0], &floats[..]) {
        (POLICY_TARGETS, &[temperature, kl_coef]) => Targets::Policy(PolicyTargets {
            temperature,
            kl_coef,
            adv: f.take("adv")?,
            old_logp: f.take("old_logp")?,
            ref_logp: f.take("ref_logp").ok(),
        }),
        (LIKELIHOOD_TARGETS, []) => Targets::Likelihood,
        (DISTILL_TARGETS, []) => Targets::Distill {
            topk_ids: f.take("topk_ids")?,
            topk_logp: f.take("topk_logp")?,
            row_domains: match f.take("row_domains") {
                Ok(t) => t
                    .to_vec1::<u32>()
                    .map_err(|e| format!("{}: row_domains: {e}", f.origin))?,
                Err(_) => vec![],
            },
        },
        (PREFERENCE_TARGETS, []) => Targets::Preference {
            ref_logp: f.take("ref_logp")?,
            pair_domains: match f.take("pair_domains") {
                Ok(t) => t
                    .to_vec1::<u32>()
                    .map_err(|e| format!("{}: pair_domains: {e}", f.origin))?,
                Err(_) => vec![],
            },
        },
        (kind, floats) => {
            return Err(f.bad_scalars(&format!(
                "a known kind of targets with its floats, found kind {kind} with {} floats",
                floats.len()
            )));
        }
    };
    Ok(ActorStep { rows, targets })
}

/// Write a critic's step to `path`; returns the bytes of tensor data written.
pub fn write_critic(step: &CriticStep, path: &Path) -> Result<u64, HostCopyError> {
    let mut tensors = epoch_header(&step.rows, &[], &[], path)?;
    tensors.extend([
        ("returns".into(), step.returns.clone()),
        ("old_values".into(), step.old_values.clone()),
    ]);
    write_tensors(path, &tensors)
}

/// Read what [`write_critic`] wrote, with the per-token tensors on `device`.
pub fn read_critic(path: &Path, device: &Device) -> Result<CriticStep, String> {
    let (mut f, rows, _, _) = open_epoch("critic step", path, device, 0)?;
    Ok(CriticStep {
        rows,
        returns: f.take("returns")?,
        old_values: f.take("old_values")?,
    })
}

/// Write `rows` and the sampling temperature to `path` (a reference log-prob request).
pub fn write_rows(rows: &Rows<'_>, temperature: f64, path: &Path) -> Result<u64, HostCopyError> {
    let ints = [rows.micro as i64, rows.width as i64];
    let tensors =
        header(rows.prompts, rows.responses, &[temperature], &ints).map_err(|source| {
            HostCopyError {
                path: path.to_path_buf(),
                source,
            }
        })?;
    write_tensors(path, &tensors)
}

/// The rows [`write_rows`] wrote: (prompts, responses, micro, width, temperature).
pub type RowsFile = (Vec<Vec<u32>>, Vec<Vec<u32>>, usize, usize, f64);

pub fn read_rows(path: &Path) -> Result<RowsFile, String> {
    let (f, (prompts, responses, floats, ints)) =
        Opened::new("rows", path, &crate::device::host())?;
    let (&[temperature], &[micro, width]) = (&floats[..], &ints[..]) else {
        return Err(f.bad_scalars("1 float and 2 integers"));
    };
    Ok((
        prompts,
        responses,
        micro as usize,
        width as usize,
        temperature,
    ))
}

/// A worker's answer to a rows file: `score` the rows [`write_rows`] wrote at `rows` (given
/// their temperature) and write the named tensors it gives to `out`. Returns bytes written.
pub fn answer_rows(
    rows: &Path,
    out: &Path,
    score: impl FnOnce(&Rows<'_>, f64) -> Result<Vec<(String, Tensor)>, String>,
) -> Result<u64, String> {
    let (prompts, responses, micro, width, temperature) = read_rows(rows)?;
    let rows = Rows {
        prompts: &prompts,
        responses: &responses,
        micro,
        width,
    };
    let tensors = score(&rows, temperature)?;
    write_tensors(out, &tensors).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element's bit pattern: equal tensors, NaN and -0 included.
    fn bits(x: &Tensor) -> Vec<u32> {
        x.flatten_all()
            .and_then(|x| x.to_vec1::<f32>())
            .expect("v")
            .iter()
            .map(|f| f.to_bits())
            .collect()
    }

    #[test]
    fn a_step_round_trips_exactly() {
        let dev = Device::Cpu;
        let t = |v: &[f32]| Tensor::from_vec(v.to_vec(), (2, 2), &dev).expect("t");
        let step = ActorStep {
            rows: EpochRows {
                prompts: vec![vec![1, 2, 3], vec![4]],
                responses: vec![vec![5], vec![6, 7]],
                group_size: 2,
                micro: 1,
                loss_mask: t(&[1., 0., 1., 1.]),
                seed: u64::MAX - 3,
            },
            targets: Targets::Policy(PolicyTargets {
                temperature: 0.7,
                kl_coef: 1.0 / 3.0,
                adv: t(&[0.1, 0.0, -0.2, f32::MIN_POSITIVE]),
                old_logp: t(&[-1.0, 0.0, -2.5, -0.125]),
                ref_logp: None,
            }),
        };
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("step.safetensors");
        write_actor(&step, &path).expect("write");
        let back = read_actor(&path, &dev).expect("read");
        assert_eq!(back.rows.prompts, step.rows.prompts);
        assert_eq!(back.rows.responses, step.rows.responses);
        assert_eq!(
            (back.rows.group_size, back.rows.micro, back.rows.seed),
            (2, 1, u64::MAX - 3)
        );
        let (Targets::Policy(back_t), Targets::Policy(sent)) = (&back.targets, &step.targets)
        else {
            panic!("an RL step reads back as an RL step");
        };
        assert_eq!(back_t.temperature.to_bits(), 0.7f64.to_bits());
        assert_eq!(back_t.kl_coef.to_bits(), (1.0f64 / 3.0).to_bits());
        assert_eq!(bits(&back_t.adv), bits(&sent.adv));
        assert_eq!(bits(&back_t.old_logp), bits(&sent.old_logp));
        assert_eq!(bits(&back.rows.loss_mask), bits(&step.rows.loss_mask));
        assert!(back_t.ref_logp.is_none());

        // An SFT batch is its rows alone, and reads back as one.
        let sft = ActorStep {
            rows: back.rows,
            targets: Targets::Likelihood,
        };
        write_actor(&sft, &path).expect("write");
        let back = read_actor(&path, &dev).expect("read");
        assert!(matches!(back.targets, Targets::Likelihood));
        assert_eq!(back.rows.responses, step.rows.responses);
        assert_eq!(bits(&back.rows.loss_mask), bits(&step.rows.loss_mask));

        // Preference pairs carry the reference's per-token log-probs.
        let pairs = ActorStep {
            targets: Targets::Preference {
                ref_logp: t(&[-0.5, 0.0, -1.25, f32::MIN_POSITIVE]),
                pair_domains: vec![3],
            },
            rows: back.rows,
        };
        write_actor(&pairs, &path).expect("write");
        let back = read_actor(&path, &dev).expect("read");
        let Targets::Preference {
            ref_logp,
            pair_domains,
        } = &back.targets
        else {
            panic!("preference pairs read back as preference pairs");
        };
        assert_eq!(pair_domains, &[3]);
        assert_eq!(
            bits(ref_logp),
            bits(&t(&[-0.5, 0.0, -1.25, f32::MIN_POSITIVE]))
        );
    }

    #[test]
    fn a_critic_step_round_trips_exactly_and_is_not_an_actor_step() {
        let dev = Device::Cpu;
        let t = |v: &[f32]| Tensor::from_vec(v.to_vec(), (2, 2), &dev).expect("t");
        let step = CriticStep {
            rows: EpochRows {
                prompts: vec![vec![1], vec![2, 3]],
                responses: vec![vec![4, 5], vec![6]],
                group_size: 1,
                micro: 2,
                loss_mask: t(&[1., 1., 1., 0.]),
                seed: 7,
            },
            returns: t(&[0.5, 1.0 / 3.0, -2.0, 0.0]),
            old_values: t(&[0.25, -0.125, 1e-30, 0.0]),
        };
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("critic.safetensors");
        write_critic(&step, &path).expect("write");
        let back = read_critic(&path, &dev).expect("read");
        assert_eq!(back.rows.prompts, step.rows.prompts);
        assert_eq!(back.rows.responses, step.rows.responses);
        assert_eq!(
            (back.rows.group_size, back.rows.micro, back.rows.seed),
            (1, 2, 7)
        );
        assert_eq!(bits(&back.returns), bits(&step.returns));
        assert_eq!(bits(&back.old_values), bits(&step.old_values));
        assert_eq!(bits(&back.rows.loss_mask), bits(&step.rows.loss_mask));
        let e = read_actor(&path, &dev)
            .err()
            .expect("a critic step is no actor step");
        assert!(e.contains("expected 4 integers"), "{e}");
    }

    #[test]
    fn a_truncated_row_table_is_an_error() {
        let dev = Device::Cpu;
        let flat = Tensor::new(&[1u32, 2], &dev).expect("t");
        let lens = Tensor::new(&[1u32, 5], &dev).expect("t");
        let e = unragged(&flat, &lens).expect_err("too long");
        assert!(e.to_string().contains("more than the 2 tokens"), "{e}");
    }

    #[test]
    fn rows_round_trip_exactly() {
        let (prompts, responses) = (vec![vec![1, 2], vec![3]], vec![vec![4, 5, 6], vec![7]]);
        let rows = Rows {
            prompts: &prompts,
            responses: &responses,
            micro: 3,
            width: 3,
        };
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("rows.safetensors");
        write_rows(&rows, 0.6, &path).expect("write");
        let back = read_rows(&path).expect("read");
        assert_eq!(back, (prompts.clone(), responses.clone(), 3, 3, 0.6));
    }
}
