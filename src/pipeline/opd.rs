//! On-policy distillation's teachers in an RL stage (`rl.opd`, ROLL's `use_opd` and
//! `is_pure_opd`): each teacher scores the sampled tokens of the rows routed to it (its `tags`,
//! or every row), and the per-token KL of the student to it — `rl.opd.estimator` (k1 by default)
//! over the sampling log-probs and the teacher's, as ROLL's `compute_approx_kl` — weighed by its `coef`,
//! is summed over the teachers. `rl_update` subtracts the sum from the RL advantage before the
//! advantage is whitened and clipped, or with `pure` makes it the whole advantage (`-Σ c KL`).
//!
//! The teachers are the run's teacher role: resident in the `train` phase, in which they score,
//! and offloaded together when a colocated phase needs their devices.

use candle_core::{Device, Tensor};

use super::{RunError, TensorContext};
use crate::algo::kl::{KlEstimator, kl_penalty};
use crate::config::{OpdConfig, OpdTeacher, RunConfig};
use crate::metrics::Metrics;
use crate::model::LoadedModel;
use crate::role::epochs::mean_of;
use crate::role::rows::Rows;
use crate::role::teacher::Teacher;
use crate::role::{HostCopy, ResidentRole, WorkerNote};

use super::rl_update::RlBatch;

/// One teacher's log-probs (width each) of the rows it scored, by batch row.
pub struct TeacherScores {
    pub name: String,
    pub rows: Vec<u32>,
    pub logp: Vec<Vec<f32>>,
}

/// The stage's teachers, started where `workers.teacher` places them.
pub struct OpdTeachers {
    pub pure: bool,
    estimator: KlEstimator,
    teachers: Vec<(OpdTeacher, Teacher)>,
}

impl OpdTeachers {
    pub fn start(
        run: &RunConfig,
        cfg: &OpdConfig,
        student: &LoadedModel,
    ) -> Result<OpdTeachers, RunError> {
        let mut teachers = vec![];
        for (i, t) in cfg.teachers.iter().enumerate() {
            let what = format!("rl.opd.teachers[{i}] ('{}')", t.name);
            let teacher = Teacher::start(run, &what, &t.path, student)?;
            teachers.push((t.clone(), teacher));
        }
        Ok(OpdTeachers {
            pure: cfg.pure,
            estimator: cfg.estimator,
            teachers,
        })
    }

    /// Σ over the teachers of `coef` times the KL of the student to the teacher on each sampled
    /// token, (n, width), 0 on the rows a teacher does not score, and each teacher's log-probs of
    /// the rows it scored; `opd/kl/<name>` the mean KL over each teacher's tokens.
    #[allow(clippy::too_many_arguments)] // the update's pieces, as it holds them
    pub fn penalty(
        &mut self,
        batch: &RlBatch,
        rows: &Rows<'_>,
        old_logp: &Tensor,
        resp_mask: &Tensor,
        temperature: f64,
        dev: &Device,
        m: &mut Metrics,
    ) -> Result<(Tensor, Vec<TeacherScores>), RunError> {
        let n = rows.prompts.len();
        let mut scores = vec![];
        let mut total =
            Tensor::zeros((n, rows.width), candle_core::DType::F32, dev).during("opd penalty")?;
        for (spec, teacher) in &mut self.teachers {
            let routed: Vec<u32> = (0..n)
                .filter(|&i| spec.scores(batch.tags.get(i).map_or("", String::as_str)))
                .map(|i| i as u32)
                .collect();
            if routed.is_empty() {
                continue;
            }
            let (prompts, responses): (Vec<Vec<u32>>, Vec<Vec<u32>>) = routed
                .iter()
                .map(|&i| {
                    (
                        rows.prompts[i as usize].clone(),
                        rows.responses[i as usize].clone(),
                    )
                })
                .unzip();
            let sub = Rows {
                prompts: &prompts,
                responses: &responses,
                micro: rows.micro,
                width: rows.width,
            };
            let idx = Tensor::new(routed.as_slice(), dev).during("opd routing")?;
            let teacher_logp = teacher.logprobs(&sub, temperature, dev)?;
            let student = old_logp.index_select(&idx, 0).during("opd routing")?;
            let mask = resp_mask.index_select(&idx, 0).during("opd routing")?;
            let kl = (kl_penalty(self.estimator, &student, &teacher_logp).during("opd kl")?
                * &mask)
                .during("opd kl")?;
            m.insert(format!("opd/kl/{}", spec.name), mean_of(&kl, &mask)?);
            let weighted = (kl * spec.coef).during("opd kl")?;
            total = total.index_add(&idx, &weighted, 0).during("opd kl")?;
            scores.push(TeacherScores {
                name: spec.name.clone(),
                logp: teacher_logp.to_vec2().during("opd log-probs")?,
                rows: routed,
            });
        }
        Ok((total, scores))
    }
}

/// The host copy of the `i`-th teacher, in the run's area (its own area in a worker).
fn copy_name(i: usize) -> String {
    format!("teacher_{i}")
}

/// Every teacher together is the run's teacher role.
impl ResidentRole for OpdTeachers {
    fn role(&self) -> crate::config::Role {
        crate::config::Role::Teacher
    }

    fn offload(&mut self, host: &HostCopy<'_>) -> Result<u64, RunError> {
        let mut bytes = 0;
        for (i, (_, t)) in self.teachers.iter_mut().enumerate() {
            bytes += t.offload_to(host.area, &copy_name(i))?;
        }
        Ok(bytes)
    }

    fn reload(&mut self, host: &HostCopy<'_>) -> Result<u64, RunError> {
        let mut bytes = 0;
        for (i, (_, t)) in self.teachers.iter_mut().enumerate() {
            bytes += t.reload_from(host.area, &copy_name(i))?;
        }
        Ok(bytes)
    }

    fn in_worker_process(&self) -> bool {
        self.teachers.iter().any(|(_, t)| t.in_worker_process())
    }

    fn drain_events(&mut self) -> Vec<WorkerNote> {
        self.teachers
            .iter_mut()
            .flat_map(|(_, t)| t.drain_events())
            .collect()
    }

    fn restarts(&self) -> usize {
        self.teachers.iter().map(|(_, t)| t.restarts()).sum()
    }

    fn shutdown(&mut self) -> Vec<WorkerNote> {
        self.teachers
            .iter_mut()
            .flat_map(|(_, t)| t.shutdown())
            .collect()
    }
}
