//! What the test modules share.

pub mod cli;
pub mod hub_server;
pub mod mock;
pub mod npz;
pub mod own_process;
pub mod paths;
pub mod png;
pub mod reference;
pub mod rng;
pub mod serve;
pub mod stand_in;
pub mod synth;
pub mod tiny_model;
pub mod torch_zip;
pub mod two_step;
