//! GFLOP/s of the f32 3x3 convolution (`moge::model::cpu::conv3x3`) and its int8 route: the direct route at the
//! best level this CPU has beside the im2col + `gemm` route (the portable level's route; the
//! `gemm` crate picks its own SIMD there too), on the shapes of the neck and heads at 640x480,
//! measured interleaved (the machine is shared: compare the ratio); with each, the bf16 route
//! of this level (on AMX: the direct tile route) and the int8 one (on AMX: int8 tiles, the
//! input quantised per band of rows) against the direct one.
//!
//! `cargo run --release --example conv3x3_bench [reps]`

mod common;
use candle_core::{Device, Tensor};
use common::rng::Rng;
use moge::model::cpu::conv3x3::int8::QuantConv;
use moge::model::cpu::conv3x3::{route, Conv3x3Op};
use moge::simd::isa::{self, Isa};
use std::time::Instant;

fn main() -> candle_core::Result<()> {
    let reps: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(5);
    let best = isa::current();
    let Some(direct) = route(best, false) else {
        println!("no direct f32 route at {best}: nothing to compare");
        return Ok(());
    };
    println!("direct {direct} vs im2col + gemm, {} threads, median of {reps}", rayon::current_num_threads());
    let mut rng = Rng::new(0x1234_5678_9abc_def1);
    // (cin, cout, h, w): the stacks' channel widths at the resolutions they run at.
    for (cin, cout, h, w) in [(256, 256, 60, 80), (128, 128, 120, 160), (64, 64, 240, 320), (32, 32, 480, 640)] {
        let wt = Tensor::from_vec(rng.units(cout * cin * 9), (cout, cin, 3, 3), &Device::Cpu)?;
        let bias = rng.units(cout);
        let x = Tensor::from_vec(rng.units(cin * h * w), (cin, h, w), &Device::Cpu)?;
        let op = isa::with_isa(best, || Conv3x3Op::new(wt.clone(), bias.clone(), cin, cout, false))?;
        let winograd = op.winograd();
        let ops = [
            ("direct", isa::with_isa(best, || Conv3x3Op::new_direct(wt.clone(), bias.clone(), cin, cout, false))?),
            ("im2col", isa::with_isa(Isa::Portable, || Conv3x3Op::new(wt.clone(), bias.clone(), cin, cout, false))?),
            ("winograd", op),
        ];
        // The bf16 route at this level (AMX: im2col + the tile GEMM; AVX512-BF16: direct).
        let bf16 = isa::with_isa(best, || Conv3x3Op::new(wt.clone(), bias.clone(), cin, cout, true))?;
        let int8 = QuantConv::new(&wt.flatten_all()?.to_vec1::<f32>()?, bias.clone(), cin, cout, best)?;
        let flop = 2.0 * (cin * 9 * cout * h * w) as f64;
        let mut times = [vec![], vec![], vec![], vec![], vec![]];
        let mut outs = vec![];
        for rep in 0..=reps {
            for (i, (_, op)) in ops.iter().enumerate().filter(|(i, _)| *i < 2 || winograd) {
                let t = Instant::now();
                let y = x.apply_op1_no_bwd(&op.call(true, false))?;
                if rep > 0 {
                    times[i].push(t.elapsed().as_secs_f64());
                } else {
                    outs.push(y.flatten_all()?.to_vec1::<f32>()?);
                }
            }
            let t = Instant::now();
            let y = x.apply_op1_no_bwd(&int8.call(true))?;
            if rep > 0 {
                times[3].push(t.elapsed().as_secs_f64());
            }
            drop(y);
            let t = Instant::now();
            let y = x.apply_op1_no_bwd(&bf16.call(true, false))?;
            if rep > 0 {
                times[4].push(t.elapsed().as_secs_f64());
            }
            drop(y);
        }
        let diff = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(a, b)| (a - b).abs() / (1.0 + b.abs())).fold(0f32, f32::max);
        let err = diff(&outs[0], &outs[1]);
        let med = |t: &mut Vec<f64>| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        };
        let (d, i) = (med(&mut times[0]), med(&mut times[1]));
        let q = med(&mut times[3]);
        let b = med(&mut times[4]);
        println!("{cin:>4}->{cout:<4} {h:>4}x{w:<4}  bf16 {:7.1} GFLOP/s  {:.2}x the direct route", flop / b / 1e9, d / b);
        println!(
            "{cin:>4}->{cout:<4} {h:>4}x{w:<4}  int8 ({}) {:7.1} G(FL)OP/s  {:.2}x the direct route",
            if int8.on_tiles() {
                "amx tiles"
            } else if int8.native() {
                moge::model::cpu::matmul::int8::route(best).name()
            } else {
                "emulated"
            },
            flop / q / 1e9,
            d / q
        );
        if winograd {
            let wg = med(&mut times[2]);
            println!(
                "{cin:>4}->{cout:<4} {h:>4}x{w:<4}  winograd {:7.1} GFLOP/s (direct-equivalent)  {:.2}x the direct route  (max rel diff {:.1e})",
                flop / wg / 1e9,
                d / wg,
                diff(&outs[2], &outs[0])
            );
        }
        println!(
            "{cin:>4}->{cout:<4} {h:>4}x{w:<4}  direct {:7.1} GFLOP/s  im2col {:7.1} GFLOP/s  ratio {:.2}x  (max rel diff {err:.1e})",
            flop / d / 1e9,
            flop / i / 1e9,
            i / d
        );
    }
    Ok(())
}
