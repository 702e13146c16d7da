//! MoGe-3's refiner alone, one call: the released ViT-L architecture (channels 32..512) with the
//! tests' synthetic weights, on the voxels of a synthetic floor-and-wall scene at head size H x W
//! (16x the token grid), in f32, bf16 and int8 (or the precisions named).
//! `scripts/bench_mlx_refiner.py` runs the MLX port's refiner on the same scene, to be compared
//! in one sitting.
//!
//! `cargo run --release --example refiner_bench -- [H W reps] [f32|bf16|int8 ...]`  (default 560 832 3: 1800 tokens at 4:3)

mod common;
#[path = "../tests/it/support/synth.rs"]
mod synth;

use std::collections::HashMap;
use std::time::Instant;

use candle_core::{Device, Tensor};
use moge::model::config::RefinerConfig;
use moge::model::sparse_unet::Sparse3DUNet;
use moge::model::voxels::Voxels;
use moge::model::weights::Weights;
use moge::model::{BuildOptions, Precision};

/// The scene of `examples/sparse_conv_bench.rs` and `scripts/bench_mlx_refiner.py`: depth 1 m at
/// the bottom to 6 m at a wall above 40 % of the height, with bumps, as log z.
pub fn scene(h: usize, w: usize) -> Vec<f32> {
    (0..h * w)
        .map(|p| {
            let (i, j) = ((p / w) as f32 / h as f32, (p % w) as f32 / w as f32);
            let d = if i < 0.4 { 6.0 } else { 1.0 + 5.0 * ((1.0 - i) / 0.6).powi(2) };
            (d + 0.05 * (20.0 * j).sin() * (14.0 * i).cos()).ln()
        })
        .collect()
}

fn main() -> anyhow::Result<()> {
    common::keep_freed_memory();
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let mut precisions: Vec<Precision> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    if precisions.is_empty() {
        precisions = vec![Precision::F32, Precision::Bf16, Precision::Int8];
    }
    let (h, w, reps) = (args.first().copied().unwrap_or(560), args.get(1).copied().unwrap_or(832), args.get(2).copied().unwrap_or(3));
    anyhow::ensure!(h % 16 == 0 && w % 16 == 0, "H and W are multiples of 16 (the encoder map is H/16 x W/16)");
    let cfg: RefinerConfig = serde_json::from_value(serde_json::json!({
        "in_channels": 3, "out_channels": 1, "encoder_channels": 1026, "model_channels": [32, 64, 128, 256, 512],
        "encoder_blocks_per_level": 1, "decoder_blocks_per_level": 1, "bottleneck_blocks": 1,
        "downsample_factors": [2, 2, 2, 2], "encoder_downsample": 16
    }))?;
    let logz = scene(h, w);
    let voxels = Voxels::one_per_pixel(h, w, moge::model::v3::depth_bins(&logz, 256.0)?)?;
    let feats: Vec<f32> = (0..h * w).flat_map(|p| [(p % w) as f32 / w as f32 - 0.5, (p / w) as f32 / h as f32 - 0.5, logz[p]]).collect();
    let (gh, gw) = (h / 16, w / 16);
    let mut rng = common::rng::Rng::new(7);
    let enc = rng.units(1026 * gh * gw);
    println!("refiner, {h}x{w} ({} voxels), {} threads, median of {reps}", voxels.len(), rayon::current_num_threads());
    for precision in precisions {
        let opts = BuildOptions::new(&Device::Cpu, precision).map_err(anyhow::Error::msg)?;
        // The keys the refiner asks for, then the tests' synthetic values under them.
        let mut probe = Weights::new(HashMap::new(), &opts);
        Sparse3DUNet::load(&mut probe, "refiner", &cfg, precision.into())?;
        let sd = synth::synth_state_dict(probe.requested(), 7, false);
        let tensors = sd.into_iter().map(|(k, (shape, v))| Ok((k, Tensor::from_vec(v, shape, &Device::Cpu)?))).collect::<anyhow::Result<HashMap<_, _>>>()?;
        let mut w8 = Weights::new(tensors, &opts);
        let unet = Sparse3DUNet::load(&mut w8, "refiner", &cfg, precision.into())?;
        let mut times = vec![];
        let mut last = None;
        for _ in 0..reps {
            let t = Instant::now();
            let (_, stats) = unet.forward(&feats, &voxels, &enc, (gh, gw))?;
            times.push(t.elapsed().as_secs_f64());
            last = Some(stats);
        }
        let s = last.expect("reps >= 1");
        println!(
            "{precision:?}: median {:.3} s a call (last: residual blocks {:.3} s, voxel sets {:.3} s); voxels per level {:?}, {:.1} GMAC ({:.1} in sparse convolutions)",
            common::median(&mut times),
            s.convolutions.as_secs_f64(),
            s.structure.as_secs_f64(),
            s.voxels,
            s.macs as f64 / 1e9,
            s.conv_macs as f64 / 1e9
        );
    }
    Ok(())
}
