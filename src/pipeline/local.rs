//! The model in this process as the middle stage: photos are prepared for the network on the
//! decode threads, run one after another on the device worker, and post-processed on the
//! encode threads.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};

use super::backend::{Backend, Finished, Staged};
use super::inputs::Input;
use super::plan::{self, ms, Placed, Plan};
use crate::image_io::DecodeOptions;
use crate::model::v2::Model;
use crate::model::{Prepared, RawOutput, Runner};

pub struct LocalBackend {
    runner: Runner,
}

impl LocalBackend {
    pub fn new(model: Arc<Model>) -> Self {
        Self { runner: Runner::new(model) }
    }

    fn model(&self) -> &Model {
        self.runner.model()
    }
}

/// A prepared photo and the network's outputs on it.
#[derive(Clone)]
pub struct LocalAnswer {
    pub placed: Placed,
    pub raw: RawOutput,
}

impl Backend for LocalBackend {
    type Job = Placed;
    type Answer = LocalAnswer;

    fn lanes(&self) -> usize {
        1
    }

    /// Two photos ready while one is on the device: the worker never waits for a decode.
    fn queue(&self) -> usize {
        2
    }

    fn stage(&self, input: &Input, plan: &Plan, decode: &DecodeOptions) -> Result<Staged<Placed>> {
        let t = Instant::now();
        let crate::image_io::Decoded { image: photo, warning, known_fov, exif_unreadable } = input.decode(decode)?;
        let decode_ms = ms(t);
        let job = plan::prepare(self.model(), &photo, &plan.with_known_fov(known_fov.as_ref()))?;
        let prepare_ms = job.prepare_ms;
        Ok(Staged { photo, warning, known_fov, exif_unreadable, job, decode_ms, prepare_ms })
    }

    fn forward(&self, placed: Placed) -> Result<LocalAnswer> {
        let raw = self.runner.forward(&placed.prep).context("forward failed")?;
        Ok(LocalAnswer { placed, raw })
    }

    fn finish(&self, answer: LocalAnswer, _photo_size: (usize, usize), plan: &Plan) -> Result<Finished> {
        let LocalAnswer { placed, raw } = answer;
        let pred = plan::finish(self.model(), &placed, &raw, plan);
        Ok(Finished {
            pred,
            device: crate::device::name_of(&self.model().device),
            num_tokens: placed.opts.tokens(self.model().config.num_tokens_range),
            grid: placed.prep.grid,
            server: None,
        })
    }

    fn finish_again(&self, answer: &LocalAnswer, _photo_size: (usize, usize), plan: &Plan, fov_x: Option<f32>) -> Option<Result<Finished>> {
        let placed = &answer.placed;
        let pred = plan::finish_with_fov(self.model(), placed, &answer.raw, plan, fov_x);
        Some(Ok(Finished {
            pred,
            device: crate::device::name_of(&self.model().device),
            num_tokens: placed.opts.tokens(self.model().config.num_tokens_range),
            grid: placed.prep.grid,
            server: None,
        }))
    }

    fn metric_scale(&self, answer: &LocalAnswer) -> Option<f32> {
        answer.raw.metric_scale.map(f32::exp)
    }

    fn has_normal(&self) -> bool {
        self.model().has_normal()
    }

    fn model_id(&self, configured: &str) -> String {
        configured.to_owned()
    }

    fn weights_digest(&self, weights: &Path) -> String {
        crate::hub::digest_or_reason(weights)
    }

    fn shares_cpu(&self) -> bool {
        self.model().device.is_cpu()
    }

    fn sample(&self, placed: &Placed) -> Option<Placed> {
        Some(placed.clone())
    }

    fn forward_only(&self, samples: &[Placed]) -> Option<(f64, usize)> {
        let preps: Vec<&Prepared> = samples.iter().map(|s| &s.prep).collect();
        let first = preps.first()?;
        self.runner.forward(first).ok()?;
        let t = Instant::now();
        for p in &preps {
            self.runner.forward(p).ok()?;
        }
        Some((t.elapsed().as_secs_f64() / preps.len() as f64, preps.len()))
    }
}
