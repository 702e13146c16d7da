//! `moge bench --host-only`: the host stages alone, the device's part taken out.

use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};

use super::backend::Backend;
use super::config::Config;
use super::inputs::Input;
use super::local::{LocalAnswer, LocalBackend};
use super::run::{decode, encode, InFlight};
use crate::model::v2::Model;
use crate::outputs::json::Timings;

/// The host stages alone, on one photo: one forward first, whose output is then reused, so
/// that `warmup + runs` rounds of decode, prepare, postprocess and write measure what a device
/// faster than this CPU would leave to the host (`moge bench --host-only`). Returns the timings
/// of the timed rounds.
pub fn host_only(model: Arc<Model>, cfg: &Config, input: &Input, warmup: usize, runs: usize) -> Result<Vec<Timings>> {
    let backend = LocalBackend::new(model);
    let plan = cfg.effective_plan();
    let first = decode(&backend, cfg, &plan, input)?;
    let raw = backend.forward(first.work)?.raw;
    let sha = OnceLock::new();
    let mut out = Vec::with_capacity(runs);
    for round in 0..warmup + runs {
        // Each round writes into a folder of its own, removed after it is timed, as a batch
        // writes each photo's outputs under new names: replacing the last round's files would
        // time their removal too, and on ext4 the flush to disk that a rename over an existing
        // file starts (`auto_da_alloc`; ~45 ms of a 60 MB npz, PERFORMANCE.md "Host stages").
        let cfg = Config { output: cfg.output.join(format!("round-{round}")), ..cfg.clone() };
        let InFlight { photo, work: placed } = decode(&backend, &cfg, &plan, input)?;
        let item = InFlight { photo, work: LocalAnswer { placed, raw: raw.clone() } };
        let rec = encode(&backend, &cfg, &plan, None, &sha, item)?;
        std::fs::remove_dir_all(&cfg.output).with_context(|| format!("{}: cannot remove", cfg.output.display()))?;
        if round >= warmup {
            out.push(rec.timings);
        }
    }
    Ok(out)
}
