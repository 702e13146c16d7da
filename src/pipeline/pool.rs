//! A pool of MoGe-2 servers as the middle stage (`--server A --server B ...`): photos decoded
//! and outputs written here as with one server; the pool itself (failover, probing) is
//! [`crate::remote::pool`].

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;

use super::backend::{Backend, Finished, Staged};
use super::inputs::Input;
use super::plan::Plan;
use super::remote;
use crate::fit::FitMode;
use crate::image_io::DecodeOptions;
use crate::infer::InferOptions;
use crate::protocol::PredictOptions;
use crate::remote::pool::{Answer, NoServerLeft, Pool};

/// The pool as the middle stage of a run.
pub struct PoolBackend {
    pool: Arc<Pool>,
    /// The options sent with each photo: the same for every server, since every server of a
    /// pool runs the same model.
    request: PredictOptions,
    infer: InferOptions,
}

impl PoolBackend {
    /// Every photo sent with the options of `infer` and `fit`.
    pub fn new(pool: Arc<Pool>, infer: &InferOptions, fit: FitMode) -> Self {
        let request = remote::remote_request(&pool.first(), infer, fit);
        Self { pool, request, infer: infer.clone() }
    }
}

impl Backend for PoolBackend {
    type Job = remote::Upload;
    type Answer = Answer;

    fn lanes(&self) -> usize {
        self.pool.capacity()
    }

    fn queue(&self) -> usize {
        self.lanes()
    }

    fn stage(&self, input: &Input, plan: &Plan, decode: &DecodeOptions) -> Result<Staged<remote::Upload>> {
        remote::stage(input, decode, plan.fit, plan.canvas)
    }

    fn forward(&self, upload: remote::Upload) -> Result<Answer> {
        let mut a = self.pool.predict(&upload.bytes, &upload.options(&self.request))?;
        a.response = upload.restore(a.response, &self.infer);
        Ok(a)
    }

    fn is_fatal(&self, err: &anyhow::Error) -> bool {
        err.downcast_ref::<NoServerLeft>().is_some()
    }

    fn finish(&self, a: Answer, photo_size: (usize, usize), plan: &Plan) -> Result<Finished> {
        let mut finished = remote::finish(&self.pool.client(a.member), a.response, photo_size, plan)?;
        if let (Some(server), false) = (&mut finished.server, a.resent_from.is_empty()) {
            server["resent_from"] = serde_json::json!(a.resent_from);
        }
        Ok(finished)
    }

    fn metric_scale(&self, a: &Answer) -> Option<f32> {
        Some(a.response.pred.metric_scale)
    }

    fn has_normal(&self) -> bool {
        self.pool.has_normal()
    }

    fn model_id(&self, configured: &str) -> String {
        self.pool.first().model().map_or_else(|| configured.to_owned(), str::to_owned)
    }

    fn weights_digest(&self, _weights: &Path) -> String {
        remote::weights_digest(&self.pool.first())
    }
}
