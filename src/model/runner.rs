//! A model and the way its forwards run on its device. On a CUDA device the forward of each
//! token grid is captured once as a CUDA graph and replayed (`graph`, built with the `cuda`
//! feature); elsewhere, or where a capture failed, it runs op by op. The model knows nothing of
//! this: the runner wraps it, and the device worker owns a runner.

use std::sync::Arc;

use anyhow::Result;

use super::v2::{Model, Prepared, RawOutput};

pub struct Runner {
    model: Arc<Model>,
    #[cfg(feature = "cuda")]
    graphs: super::graph::Graphs,
}

impl Runner {
    pub fn new(model: Arc<Model>) -> Self {
        Self {
            model,
            #[cfg(feature = "cuda")]
            graphs: super::graph::Graphs::new(),
        }
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The network on one prepared image: replayed where the device has a graph of its grid.
    pub fn forward(&self, prep: &Prepared) -> Result<RawOutput> {
        // MoGe-3's refiner runs on the host between device work: its forwards run op by op.
        #[cfg(feature = "cuda")]
        if !self.model.has_refiner() {
            if let Some(raw) = self.graphs.forward(&self.model, prep)? {
                return Ok(raw);
            }
        }
        self.model.forward(prep)
    }

    /// How forwards run on a CUDA device: graph replay per token grid, or why not (`None`
    /// elsewhere).
    pub fn cuda_graphs(&self) -> Option<String> {
        #[cfg(feature = "cuda")]
        return super::graph::describe(&self.graphs, &self.model.device);
        #[cfg(not(feature = "cuda"))]
        None
    }
}
