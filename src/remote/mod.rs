//! The client side of `--server URL`: predictions from a MoGe-2 HTTP server (`moge serve`, or
//! the Tenstorrent MoGe-2 server (tt-MoGe), whose API it copies) instead of a local model.
//!
//! The API: `GET /health`, `GET /info` (JSON), and `POST /predict` with a JSON body holding the
//! image file in base64 and the options. The answer is the npz itself with its metadata in the
//! `X-MoGe-Meta` header (`output_format: "npz_binary"`), or, from servers that do not know that
//! format, JSON with the npz in base64 (`"npz"`). A server whose `/info` lists
//! `"output_formats"` is asked in the best one it has; otherwise the client asks for
//! `npz_binary`, and when that is refused (400 or 422) asks again for `npz`, and keeps to `npz`
//! once that succeeded.
//!
//! ```no_run
//! use moge::protocol::PredictOptions;
//! use moge::remote::{Client, ClientOptions};
//! let client = Client::connect("127.0.0.1:20000", ClientOptions::default())?;
//! let bytes = std::fs::read("photo.jpg")?;
//! let answer = client.predict(&bytes, &PredictOptions::default())?;
//! println!("{}", answer.pred.summary());
//! # Ok::<(), anyhow::Error>(())
//! ```

//!
//! - `client`: one server's connection, retries and answers; `error`: why a request failed;
//! - `upload`: what is sent for a photo; `answer`: a prediction's answer read back, its npz by
//!   `npz`; `slots`: how many requests a client has open at once;
//! - [`pool`]: several servers, one per device, with failover and probing.

mod answer;
mod client;
mod error;
mod npz;
pub mod pool;
mod slots;
mod upload;

pub use client::{Client, ClientOptions, Response};
pub use error::RemoteError;
pub use npz::read_prediction;
pub use upload::{image_for_server, png_for_server};
