//! GMAC/s of MoGe-3's submanifold 3x3x3 convolution (`moge::model::cpu::sparse_conv`) per level
//! of the refiner at ViT-L's 1800 tokens (head maps 560x832), in f32, bf16 and int8, beside the dense
//! product of the same shape on the same kernels (the voxels' rows times one tap's weight: what
//! the sparse convolution would reach with nothing gathered or scattered), measured interleaved
//! (the machine is shared: compare the ratio). The voxels are those of a synthetic scene: a
//! floor receding to a wall, and bumps (surfaces, 6-18 active neighbours per voxel); with
//! `noise`, each pixel's log-depth moved by up to ± noise (0.01 is 2.5 depth bins: a rough
//! surface, as the synthetic checkpoints' random networks make).
//!
//! `cargo run --release --example sparse_conv_bench [reps] [noise]`

mod common;
use common::rng::Rng;
use moge::model::cpu::matmul::bf16::{gemm_bf16, PackedB};
use moge::model::cpu::matmul::gemm::{Gemm, Strided};
use moge::model::cpu::matmul::int8::{product_quantised, quantise_activations, QuantB};
use moge::model::cpu::sparse_conv::{Products, SubmConv3d, TAPS};
use moge::model::voxels::Voxels;
use moge::simd::{Mat, MatMut};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    common::keep_freed_memory();
    let reps: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(3);
    let noise: f32 = std::env::args().nth(2).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let (h, w) = (560, 832);
    let mut jitter = Rng::new(0x5eed_0004);
    let logz: Vec<f32> = (0..h * w)
        .map(|p| {
            let (i, j) = ((p / w) as f32 / h as f32, (p % w) as f32 / w as f32);
            // Depth from 1 m at the bottom to 6 m at the wall above 40 % of the height.
            let d = if i < 0.4 { 6.0 } else { 1.0 + 5.0 * ((1.0 - i) / 0.6).powi(2) };
            (d + 0.05 * (20.0 * j).sin() * (14.0 * i).cos()).ln() + noise * jitter.unit()
        })
        .collect();
    let bins = moge::model::v3::depth_bins(&logz, 256.0)?;
    let mut vox = Voxels::one_per_pixel(h, w, bins)?;
    let mut rng = Rng::new(0x5eed_0003);
    println!("{} threads, median of {reps}; GMAC/s (multiply-adds per second)", rayon::current_num_threads());
    println!(
        "{:>6} {:>8} {:>6} {:>10} {:>10} {:>6} {:>11} {:>10} {:>6} {:>11} {:>10} {:>6}",
        "level", "voxels", "nbrs", "f32 sparse", "f32 dense", "ratio", "bf16 sparse", "bf16 dense", "ratio", "int8 sparse", "int8 dense", "ratio"
    );
    for (level, c) in [32usize, 64, 128, 256, 512].into_iter().enumerate() {
        let nb = vox.neighbours();
        let m = vox.len();
        let x = rng.units(m * c);
        let wt = rng.units(c * TAPS * c);
        let bias = rng.units(c);
        let convs = [Products::F32, Products::Bf16, Products::Int8].map(|p| SubmConv3d::new(&wt, bias.clone(), c, c, p));
        let macs = convs[0].macs(&nb) as f64;
        // The dense product of the same work: (pairs / 27 per tap) rows, 27 taps.
        let rows = nb.pairs().div_ceil(TAPS);
        let tap: Vec<f32> = wt[..c * c].to_vec();
        let packed = PackedB::from_f32_kn(&tap, c, c);
        // int8's dense product on rows quantised once, as the sparse convolution quantises its
        // inputs once a call.
        let quant = QuantB::from_f32_nk(&tap, c, c, moge::simd::isa::current());
        let zeros = vec![0f32; c];
        let xq = quantise_activations(&rng.units(rows * c), rows, c, quant.route());
        let xd = rng.units(rows * c);
        let mut y = vec![0f32; rows * c];
        let threads = rayon::current_num_threads();
        let mut t = [vec![], vec![], vec![], vec![], vec![], vec![]];
        for _ in 0..reps {
            for (k, conv) in convs.iter().enumerate() {
                let s = Instant::now();
                std::hint::black_box(conv.forward(&x, &nb));
                t[2 * k].push(s.elapsed().as_secs_f64());
            }
            let s = Instant::now();
            for _ in 0..TAPS {
                // SAFETY: y holds rows × c, xd rows × c, tap c × c.
                unsafe {
                    Gemm::new(rows, c, c).on_rayon(threads).run(Strided::rows(y.as_mut_ptr(), c), Strided::rows(xd.as_ptr(), c), Strided::rows(tap.as_ptr(), c))
                };
            }
            t[1].push(s.elapsed().as_secs_f64());
            let s = Instant::now();
            for _ in 0..TAPS {
                gemm_bf16(Mat::from_slice(&xd, rows, c, c), &packed, Mat::from_slice_mut(&mut y, rows, c, c), false, threads);
            }
            t[3].push(s.elapsed().as_secs_f64());
            let s = Instant::now();
            for _ in 0..TAPS {
                // SAFETY: y holds rows × c, written by this product alone.
                unsafe { product_quantised(&xq, &quant, &zeros, MatMut::from_mut_ptr(y.as_mut_ptr(), rows, c, c), false, true) };
            }
            t[5].push(s.elapsed().as_secs_f64());
        }
        let dense_macs = (TAPS * rows * c * c) as f64;
        let mut rate = |k: usize, n: f64| n / common::median(&mut t[k]) / 1e9;
        let (fs, fd, bs, bd, is, id) = (rate(0, macs), rate(1, dense_macs), rate(2, macs), rate(3, dense_macs), rate(4, macs), rate(5, dense_macs));
        println!(
            "{level:>6} {m:>8} {:>6.1} {fs:>10.1} {fd:>10.1} {:>6.2} {bs:>11.1} {bd:>10.1} {:>6.2} {is:>11.1} {id:>10.1} {:>6.2}",
            nb.pairs() as f64 / m as f64,
            fs / fd,
            bs / bd,
            is / id
        );
        vox = vox.pooled().0;
    }
    Ok(())
}
