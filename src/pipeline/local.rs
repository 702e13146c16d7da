//! The model in this process as the middle stage: photos are prepared for the network on the
//! decode threads, run one after another on the device worker, and post-processed on the
//! encode threads.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};

use super::backend::{Backend, Finished, Staging};
use super::inputs::Input;
use super::stages::{self, ms, Plan, Staged};
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
pub struct LocalForwarded {
    pub staged: Staged,
    pub raw: RawOutput,
}

impl Backend for LocalBackend {
    type Staged = Staged;
    type Forwarded = LocalForwarded;

    fn lanes(&self) -> usize {
        1
    }

    /// Two photos ready while one is on the device: the worker never waits for a decode.
    fn queue(&self) -> usize {
        2
    }

    fn stage(&self, input: &Input, plan: &Plan, decode: &DecodeOptions) -> Result<Staging<Staged>> {
        let t = Instant::now();
        let crate::image_io::Decoded { image: photo, warning, known_fov } = input.decode(decode)?;
        let decode_ms = ms(t);
        let staged = stages::prepare(self.model(), &photo, &plan.with_known_fov(known_fov.as_ref()))?;
        let prepare_ms = staged.prepare_ms;
        Ok(Staging { photo, warning, known_fov, staged, decode_ms, prepare_ms })
    }

    fn forward(&self, staged: Staged) -> Result<LocalForwarded> {
        let raw = self.runner.forward(&staged.prep).context("forward failed")?;
        Ok(LocalForwarded { staged, raw })
    }

    fn finish(&self, f: LocalForwarded, _photo_size: (usize, usize), plan: &Plan) -> Result<Finished> {
        let LocalForwarded { staged, raw } = f;
        let pred = stages::finish(self.model(), &staged, &raw, plan);
        Ok(Finished {
            pred,
            device: crate::device::name_of(&self.model().device),
            num_tokens: staged.opts.tokens(self.model().config.num_tokens_range),
            grid: staged.prep.grid,
            server: None,
        })
    }

    fn metric_scale(&self, f: &LocalForwarded) -> Option<f32> {
        f.raw.metric_scale.map(f32::exp)
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

    fn sample(&self, staged: &Staged) -> Option<Staged> {
        Some(staged.clone())
    }

    fn forward_only(&self, samples: &[Staged]) -> Option<(f64, usize)> {
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
