//! `moge serve`: the model resident behind the HTTP API of the Tenstorrent MoGe-2 server
//! (tt-MoGe): `POST /predict`, `GET /health`, `GET /info`.
//!
//! A request goes through the stages of `moge batch`: decode and prepare on a host thread,
//! the forward on the one device worker ([`crate::pipeline::worker`]), post-process and encode
//! on a host thread, so that with several clients the device never waits for host work.
//! Admission is bounded: past `queue` requests in progress the answer is 503 with
//! `Retry-After`, never more memory.
//!
//! For a cluster: the server listens while the model loads, so that `GET /health/live`
//! (liveness) answers at once, while `GET /health` (readiness) answers 503 until the model is
//! loaded and, if asked, warmed up by one forward ([`Service::warm_up`]), and again once it is
//! stopping; `GET /metrics` is in the Prometheus text format ([`metrics`]).

//!
//! `GET /` is a web page (`page`), upstream's `moge app` without Python: its files are in the
//! binary and it calls `/predict` like any client.
//!
//! - `service`: the server's state and phases; `routes`: the API's handlers; `page`: the page;
//!   `listen`: binding and stopping;
//! - [`request`] and [`response`]: a prediction's way in and out; `error`: what a refused
//!   request says; [`metrics`]: `GET /metrics`.

mod error;
mod listen;
pub mod metrics;
mod page;
pub mod request;
pub mod response;
mod routes;
mod service;

pub use error::ApiError;
pub use listen::{bind, serve};
pub use routes::app;
pub use service::{Config, Phase, Service, Shared};
