//! The client side of `--server URL`: predictions from a MoGe-2 HTTP server (`moge serve`, or
//! the Tenstorrent server tt-MoGe whose API it copies) instead of a local model.

mod npz;

pub use npz::read_prediction;
