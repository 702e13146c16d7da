//! `moge`: metric 3D geometry from photos with Microsoft's MoGe-2.
//!
//! The crate is laid out as the data flows:
//! - [`device`]: `--device auto|cpu|cuda[:N]`, and why the GPU is not used where it is not.
//! - [`model`]: the network, one module per upstream module (`moge/model/*.py`), over candle.
//! - [`geometry`]: PyTorch-faithful resizes, the UV plane, the focal/shift solve.
//! - [`infer`]: upstream `MoGeModel.infer` post-processing into a [`Prediction`].
//! - [`image_io`]: reading photos as the upstream CLI reads them.
//! - [`outputs`]: writing predictions (npz, ...).
//! - [`pipeline`]: decode threads, the device worker (or a server), encode threads.
//! - [`protocol`]: the wire format of the HTTP API, shared by the server and the client.
//! - [`server`]: `moge serve`, the model behind HTTP.
//! - [`remote`]: predictions from a MoGe-2 HTTP server instead of a local model (`--server`).
//! - [`names`]: the names of the choices above (formats, fits, ...), parsed and shown.
//! - [`simd`]: beneath them all, the instruction-set level and the kernels the layers share.
//!
//! The `moge` command line is the binary's (`src/main.rs`, `src/cli/`), over this library.
//!
//! ```no_run
//! use moge::{Model, InferOptions};
//! let model = Model::load("model.pt".as_ref(), &moge::Device::Cpu)?;
//! let image = moge::image_io::load_rgb("photo.jpg".as_ref(), true)?;
//! let prediction = model.infer(&image, &InferOptions::default())?;
//! println!("{}", prediction.summary());
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod console;
pub mod device;
pub mod geometry;
pub mod hub;
pub mod image_io;
pub mod infer;
pub mod model;
pub mod names;
pub mod outputs;
pub mod pipeline;
pub mod protocol;
pub mod remote;
pub mod server;
pub mod simd;

pub use candle_core::Device;
pub use infer::{InferOptions, Prediction};
pub use model::{Model, RawOutput};
