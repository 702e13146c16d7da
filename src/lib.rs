//! `moge`: metric 3D geometry from photos with Microsoft's MoGe-2.
//!
//! The crate is laid out as the data flows:
//! - [`device`]: `--device auto|cpu|cuda[:N]`, and why the GPU is not used where it is not.
//! - [`model`]: the network, one module per upstream module (`moge/model/*.py`), over candle.
//! - [`geometry`]: PyTorch-faithful resizes, the UV plane, the focal/shift solve.
//! - [`infer`]: upstream `MoGeModel.infer` post-processing into a [`Prediction`].
//! - [`loader`]: a model by published name or checkpoint path, on a device, at a precision.
//! - [`image_io`]: reading photos as the upstream CLI reads them (and a camera's field of view
//!   from their EXIF).
//! - [`camera`]: a known camera matrix (fx != fy, an off-centre principal point) brought to the
//!   view the model takes, and per-photo cameras from a table.
//! - [`fit`]: `--fit pad|stretch`, every photo onto one canvas aspect and the outputs back.
//! - [`outputs`]: writing predictions (npz, ...).
//! - [`pipeline`]: decode threads, the device worker (or a server, or a pool of them), encode
//!   threads.
//! - [`predictor`]: a model here or on a server for one image or a list, predictions in memory
//!   (the face of the Python and C++ bindings).
//! - [`protocol`]: the wire format of the HTTP API, shared by the server and the client.
//! - [`server`]: `moge serve`, the model behind HTTP.
//! - [`remote`]: predictions from a MoGe-2 HTTP server instead of a local model (`--server`).
//! - [`colmap`]: a COLMAP reconstruction read, and MoGe's depth per image brought to its scale
//!   (`moge colmap`).
//! - [`compare`]: how far one prediction is from another (`moge compare`).
//! - [`names`]: the names of the choices above (formats, fits, ...), parsed and shown.
//! - [`simd`]: beneath them all, the instruction-set level and the kernels the layers share.
//!
//! The `moge` command line is the binary's (`src/main.rs`, `src/cli/`), over this library.
//!
//! What a program needs is re-exported here: [`load`] a model by name or path ([`LoadOptions`]),
//! [`Model::infer`] an image in memory or [`Model::infer_file`] a photo with [`InferOptions`],
//! and [`run`] the pipeline over a list of photos with a callback per result ([`Record`]),
//! locally ([`Engine::Local`]), on a server ([`Engine::Remote`]) or on a pool of servers
//! ([`Engine::Pool`]).
//!
//! One photo in memory:
//!
//! ```
//! let opts = moge::LoadOptions { device: moge::DeviceRequest::Cpu, ..Default::default() };
//! let model = moge::load("tests/fixtures/tiny_normal.pt", &opts)?;
//! let prediction = model.infer_file("tests/fixtures/images/rgb_64x48.png".as_ref(), &moge::InferOptions::default())?;
//! assert_eq!(prediction.points.len(), 3 * 64 * 48);
//! assert!(prediction.fov_degrees().0 > 0.0 && prediction.metric_scale > 0.0);
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! A list of photos through the pipeline (decode threads, the device worker, encode threads),
//! each photo's npz written under the output folder:
//!
//! ```
//! use std::sync::{atomic::AtomicBool, Arc};
//! let opts = moge::LoadOptions { device: moge::DeviceRequest::Cpu, ..Default::default() };
//! let model = Arc::new(moge::load("tests/fixtures/tiny_normal.pt", &opts)?);
//! let photos = ["tests/fixtures/images/rgb_64x48.png", "tests/fixtures/images/missing.png"];
//! let inputs: Vec<moge::Input> = photos.iter().map(|p| moge::pipeline::inputs::file_input(p.as_ref())).collect();
//! let out = tempfile::tempdir()?;
//! let config = moge::Config::new(out.path());
//! let mut results = Vec::new();
//! let summary = moge::run(moge::Engine::Local(model), inputs, &config, &Arc::new(AtomicBool::new(false)), |record| {
//!     results.push((record.input.clone(), record.status, record.error.clone()));
//! });
//! assert_eq!((summary.done, summary.failed), (1, 1));
//! assert!(out.path().join("rgb_64x48.npz").is_file());
//! assert!(results.iter().any(|(_, status, error)| *status == moge::Status::Failed && error.as_deref().is_some_and(|e| e.contains("missing.png"))));
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod camera;
pub mod colmap;
pub mod compare;
pub mod console;
pub mod device;
pub mod fit;
pub mod geometry;
pub mod hub;
pub mod image_io;
pub mod infer;
pub mod loader;
pub mod memory;
pub mod model;
pub mod names;
pub mod outputs;
pub mod panorama;
pub mod pipeline;
pub mod predictor;
pub mod protocol;
pub mod remote;
pub mod server;
pub mod simd;

/// The unit tests' random numbers: the integration tests' generator, compiled here by path.
#[cfg(test)]
#[allow(dead_code)] // the unit tests draw no bytes from it
#[path = "../tests/it/support/rng.rs"]
pub(crate) mod test_rng;

pub use candle_core::Device;
pub use device::DeviceRequest;
pub use infer::{InferOptions, Prediction};
pub use loader::{load, LoadOptions};
pub use model::{Model, Precision, RawOutput};
pub use pipeline::inputs::Input;
pub use pipeline::plan::Plan;
pub use pipeline::record::{Record, Status};
pub use pipeline::report::Summary;
pub use pipeline::run::{run, Config, Engine};
pub use predictor::{Predictions, Predictor};
