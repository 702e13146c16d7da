//! Shared helpers for the integration tests (`mod common;`): `synth` regenerates the synthetic test weights.
pub mod rng;
pub mod synth;
pub mod torch_zip;
