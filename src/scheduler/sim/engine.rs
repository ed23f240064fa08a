//! The event loop: virtual devices, the trainer, and the driver that talks to the real
//! [`SampleScheduler`] the way the pipeline does.

use std::cmp::Ordering;
use std::collections::{BTreeSet, BinaryHeap};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::device::{Request, VirtualDevice};
use super::{ResponseLengths, SimConfig, SimError, SimPlacement, SimReport};
use crate::scheduler::SampleScheduler;

#[derive(Debug)]
enum Event {
    StepEnd(usize),
    Scored(Request),
    /// A paused device may step again.
    Resume(usize),
    TrainEnd,
    SyncEnd,
}

/// An event at a virtual time; ties are broken by scheduling order, so runs are deterministic.
#[derive(Debug)]
struct Scheduled {
    at: f64,
    order: u64,
    event: Event,
}

impl Ord for Scheduled {
    // Reversed: `BinaryHeap` is a max-heap and the earliest event must come out first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at
            .total_cmp(&self.at)
            .then(other.order.cmp(&self.order))
    }
}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Scheduled {}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Trainer {
    Idle,
    /// Colocated: a batch is taken; waiting for the devices to finish their decode steps before
    /// the phase (swaps + training) of `phase_ms` starts.
    Draining {
        phase_ms: f64,
    },
    Training,
    Syncing,
}

pub(super) struct Engine<'a> {
    cfg: &'a SimConfig,
    rng: StdRng,
    now: f64,
    next_order: u64,
    events: BinaryHeap<Scheduled>,
    devices: Vec<VirtualDevice>,
    /// Devices whose queue, pause or step changed: they may start a step.
    touched: BTreeSet<usize>,
    stepping_devices: usize,
    /// Colocated training stops generation.
    generation_on: bool,
    scheduler: SampleScheduler<(), usize>,
    trainer: Trainer,
    train_devices: usize,
    version: usize,
    steps_started: usize,
    step_ends: Vec<f64>,
    samples_drawn: usize,
    tokens_generated: u64,
    tokens_finished: u64,
    tokens_unfinished: u64,
    tokens_trained: u64,
    samples_trained: usize,
    samples_refused: usize,
}

impl<'a> Engine<'a> {
    pub fn new(cfg: &'a SimConfig) -> Engine<'a> {
        let (infer_devices, train_devices) = match cfg.placement {
            SimPlacement::Colocated { devices } => (devices, devices),
            SimPlacement::Separate {
                infer_devices,
                train_devices,
            } => (infer_devices, train_devices),
        };
        Engine {
            cfg,
            rng: StdRng::seed_from_u64(cfg.seed),
            now: 0.0,
            next_order: 0,
            events: BinaryHeap::new(),
            devices: (0..infer_devices)
                .map(|_| VirtualDevice::default())
                .collect(),
            touched: BTreeSet::new(),
            stepping_devices: 0,
            generation_on: true,
            scheduler: SampleScheduler::new(cfg.policy.clone(), 0),
            trainer: Trainer::Idle,
            train_devices,
            version: 0,
            steps_started: 0,
            step_ends: vec![],
            samples_drawn: 0,
            tokens_generated: 0,
            tokens_finished: 0,
            tokens_unfinished: 0,
            tokens_trained: 0,
            samples_trained: 0,
            samples_refused: 0,
        }
    }

    pub fn run(mut self) -> Result<SimReport, SimError> {
        while self.step_ends.len() < self.cfg.steps {
            self.drive();
            self.start_touched_devices();
            self.start_colocated_phase_when_drained();
            let Some(next) = self.events.pop() else {
                return Err(SimError::Stalled {
                    completed_steps: self.step_ends.len(),
                    steps: self.cfg.steps,
                    at_s: self.now / 1000.0,
                });
            };
            self.now = next.at;
            self.handle(next.event);
        }
        Ok(self.report())
    }

    fn schedule(&mut self, after_ms: f64, event: Event) {
        self.events.push(Scheduled {
            at: self.now + after_ms,
            order: self.next_order,
            event,
        });
        self.next_order += 1;
    }

    fn handle(&mut self, event: Event) {
        let cost = &self.cfg.cost;
        match event {
            Event::StepEnd(d) => {
                self.stepping_devices -= 1;
                let device = &mut self.devices[d];
                let (finished, decoded) = device.end_step();
                self.tokens_generated += decoded;
                if device.pause_after_step_ms > 0.0 {
                    device.paused_until = self.now + device.pause_after_step_ms;
                    let pause = device.pause_after_step_ms;
                    device.pause_after_step_ms = 0.0;
                    self.schedule(pause, Event::Resume(d));
                }
                for request in finished {
                    self.tokens_finished += request.tokens as u64;
                    if cost.reward_ms > 0.0 {
                        self.schedule(cost.reward_ms, Event::Scored(request));
                    } else {
                        // Scored before the device starts its next step (the loop drives the
                        // pipeline first), so an early stop cancels what that step would decode.
                        self.deliver(request);
                    }
                }
                self.touched.insert(d);
            }
            Event::Scored(request) => self.deliver(request),
            Event::Resume(d) => {
                self.touched.insert(d);
            }
            Event::TrainEnd => {
                self.version += 1;
                let dead = self.scheduler.set_version(self.version);
                self.cancel(&dead);
                self.trainer = Trainer::Syncing;
                if matches!(self.cfg.placement, SimPlacement::Separate { .. }) {
                    self.pause_for_sync();
                }
                self.schedule(cost.sync_ms, Event::SyncEnd);
            }
            Event::SyncEnd => {
                self.step_ends.push(self.now);
                self.trainer = Trainer::Idle;
                if !self.generation_on {
                    self.generation_on = true;
                    self.touched.extend(0..self.devices.len());
                }
            }
        }
    }

    fn deliver(&mut self, r: Request) {
        if !self.scheduler.finish(r.group, r.index, r.tokens, r.reward) {
            self.samples_refused += 1;
        }
    }

    /// Each inference device loads the new weights once its current decode step ends.
    fn pause_for_sync(&mut self) {
        let sync_ms = self.cfg.cost.sync_ms;
        if sync_ms <= 0.0 {
            return;
        }
        for d in 0..self.devices.len() {
            if self.devices[d].stepping {
                self.devices[d].pause_after_step_ms = sync_ms;
            } else {
                self.devices[d].paused_until = self.now + sync_ms;
                self.schedule(sync_ms, Event::Resume(d));
            }
        }
    }

    /// The pipeline's side of the protocol: train when a batch is ready, dispatch what is wanted.
    fn drive(&mut self) {
        let steps = self.cfg.steps;
        let synchronous = self.cfg.policy.async_ratio == 0;
        if self.trainer == Trainer::Idle
            && self.steps_started < steps
            && let Some(batch) = self.scheduler.take_batch()
        {
            self.steps_started += 1;
            let samples: usize = batch.iter().map(|g| g.samples.len()).sum();
            let response_tokens: u64 = batch
                .iter()
                .flat_map(|g| g.samples.iter())
                .map(|&t| t as u64)
                .sum();
            self.samples_trained += samples;
            self.tokens_trained += response_tokens;
            let cost = &self.cfg.cost;
            let train_tokens = response_tokens + (samples * self.cfg.workload.prompt_tokens) as u64;
            let train_ms =
                cost.train_ms_per_token * train_tokens as f64 / self.train_devices as f64;
            if synchronous {
                let in_flight = self.scheduler.abort_in_flight();
                self.cancel(&in_flight);
            }
            match self.cfg.placement {
                SimPlacement::Separate { .. } => {
                    self.trainer = Trainer::Training;
                    self.schedule(train_ms, Event::TrainEnd);
                }
                SimPlacement::Colocated { .. } => {
                    self.generation_on = false;
                    self.trainer = Trainer::Draining {
                        phase_ms: cost.swap_ms + train_ms + cost.swap_ms,
                    };
                }
            }
        }
        // With α = 0 rollout waits for the new weights: nothing goes out while a step trains.
        let may_dispatch =
            self.steps_started < steps && (!synchronous || self.trainer == Trainer::Idle);
        if may_dispatch {
            for _ in 0..self.scheduler.prompts_wanted() {
                self.dispatch_group();
            }
        }
    }

    fn dispatch_group(&mut self) {
        let group = self.scheduler.dispatch(());
        let solve_rate: f64 = self.rng.random();
        for index in 0..self.cfg.policy.group_size {
            let tokens = self.draw_length();
            let reward = if self.rng.random::<f64>() < solve_rate {
                1.0
            } else {
                0.0
            };
            let d = (0..self.devices.len())
                .min_by_key(|&d| (self.devices[d].load(), d))
                .unwrap_or(0);
            self.devices[d].submit(Request {
                group,
                index,
                tokens,
                reward,
            });
            self.touched.insert(d);
        }
    }

    fn draw_length(&mut self) -> usize {
        let n = self.samples_drawn;
        self.samples_drawn += 1;
        match &self.cfg.workload.lengths {
            ResponseLengths::HeavyTail {
                p_long,
                long_tokens,
                short_min,
                short_max,
            } => {
                if self.rng.random::<f64>() < *p_long {
                    *long_tokens
                } else {
                    self.rng.random_range(*short_min..=*short_max)
                }
            }
            ResponseLengths::Trace(lengths) => lengths[n % lengths.len()],
        }
    }

    fn cancel(&mut self, groups: &[u64]) {
        if groups.is_empty() {
            return;
        }
        let groups: BTreeSet<u64> = groups.iter().copied().collect();
        for device in &mut self.devices {
            self.tokens_unfinished += device.cancel(&groups);
        }
    }

    fn start_touched_devices(&mut self) {
        if !self.generation_on {
            return;
        }
        let batching = self.cfg.batching;
        for d in std::mem::take(&mut self.touched) {
            let device = &mut self.devices[d];
            if device.stepping || device.pause_after_step_ms > 0.0 || self.now < device.paused_until
            {
                continue;
            }
            if let Some(ms) = device.begin_step(batching, &self.cfg.cost) {
                self.stepping_devices += 1;
                self.schedule(ms, Event::StepEnd(d));
            }
        }
    }

    fn start_colocated_phase_when_drained(&mut self) {
        if let Trainer::Draining { phase_ms } = self.trainer
            && self.stepping_devices == 0
        {
            self.trainer = Trainer::Training;
            self.schedule(phase_ms, Event::TrainEnd);
        }
    }

    fn report(mut self) -> SimReport {
        let stats = self.scheduler.take_stats();
        let wall_ms = self.step_ends.last().copied().unwrap_or(0.0);
        let step_s = self
            .step_ends
            .iter()
            .scan(0.0, |previous, &end| {
                let step = (end - *previous) / 1000.0;
                *previous = end;
                Some(step)
            })
            .collect();
        let n = self.devices.len() as f64;
        let per_device_wall = |ms: f64| if wall_ms > 0.0 { ms / wall_ms / n } else { 0.0 };
        let busy: f64 = self.devices.iter().map(|d| d.busy_ms).sum();
        let sequence_ms: f64 = self.devices.iter().map(|d| d.sequence_ms).sum();
        let in_flight: u64 = self.devices.iter().map(|d| d.decoded_in_flight()).sum();
        SimReport {
            wall_s: wall_ms / 1000.0,
            step_s,
            tokens_generated: self.tokens_generated,
            tokens_finished: self.tokens_finished,
            tokens_unfinished: self.tokens_unfinished + in_flight,
            tokens_trained: self.tokens_trained,
            samples_trained: self.samples_trained,
            samples_refused: self.samples_refused,
            prompts_dispatched: stats.dispatched_prompts,
            samples_aborted: stats.aborted_samples,
            groups_filtered: stats.filtered_groups,
            samples_dropped_stale: stats.dropped_stale,
            staleness_mean: stats.staleness_mean(),
            staleness_max: stats.staleness_max,
            infer_utilisation: per_device_wall(busy),
            slot_occupancy: per_device_wall(sequence_ms) / self.cfg.cost.max_batch as f64,
        }
    }
}
