//! Milliseconds per call of the decoder's 1x1 and 2x2-transposed convolutions
//! (`moge::model::cpu::conv1x1`) in f32, on the shapes of the neck and heads at 640x480 (1800
//! tokens): the AVX2 direct kernel ([`Pointwise`]) beside the `gemm` crate's route, measured
//! interleaved in one process (the machine is shared: compare the ratio). With the allocator
//! settings of the `moge` binary, so freed buffers are reused as in a forward. On a CPU with
//! AMX, then the transposed convolutions in bf16: the tile GEMM into a (4·cout, h·w) buffer and
//! a pass to interleave it, against the one-tap tiles whose epilogue interleaves
//! (`TileConv::new_transposed`), with the largest difference between their outputs; and the
//! 1x1 convolutions with the residual in bf16: the tile GEMM against one-tap tiles
//! (`TileConv::new_pointwise`), and beside them the int8 op (`QuantConv::new_pointwise`: on
//! AMX the int8 one-tap tiles, quantised per pixel).
//!
//! `cargo run --release --example planes_bench [reps]`

mod common;
use candle_core::{Device, Tensor};
use common::rng::Rng;
use common::{keep_freed_memory, median};
use moge::model::cpu::conv1x1::{Conv1x1Op, ConvTranspose2x2Op};
use moge::model::cpu::conv3x3::int8::QuantConv;
use moge::model::cpu::conv3x3::tiles::{Kind, TileConv};
use moge::model::cpu::matmul::bf16::PackedA;
use moge::model::cpu::matmul::pointwise::Pointwise;
use moge::simd::isa::{self, Isa};
use std::time::Instant;

fn main() -> candle_core::Result<()> {
    keep_freed_memory();
    let reps: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(7);
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    if isa::current() == Isa::Amx {
        transposed_bf16(reps, &mut rng)?;
        pointwise_bf16(reps, &mut rng)?;
    }
    if Pointwise::new(&[0.0], 1, 1).is_none() {
        println!("no AVX2 direct route at this level: nothing to compare");
        return Ok(());
    }
    println!("pointwise (AVX2 direct kernel) vs gemm crate, {} threads, median of {reps}, ms per call", rayon::current_num_threads());
    // (kind, cin, cout, h, w): kind 0 = 1x1, 1 = 1x1 + residual, 2 = transposed 2x2.
    let shapes = [
        (2, 384, 256, 37, 49),
        (2, 256, 128, 74, 98),
        (2, 128, 64, 148, 196),
        (1, 256, 256, 74, 98),
        (1, 128, 128, 148, 196),
        (1, 64, 64, 296, 392),
        (1, 32, 32, 592, 784),
        (1, 2, 32, 592, 784),
        (0, 32, 3, 592, 784),
    ];
    let (mut sum_pw, mut sum_gemm) = (0.0, 0.0);
    for (kind, cin, cout, h, w) in shapes {
        let rows = if kind == 2 { 4 * cout } else { cout };
        let wt = rng.units(rows * cin);
        let bias = rng.units(cout);
        let x = Tensor::from_vec(rng.units(cin * h * w), (cin, h, w), &Device::Cpu)?;
        let res = Tensor::from_vec(rng.units(cout * h * w), (cout, h, w), &Device::Cpu)?;
        let weight = Tensor::from_vec(wt.clone(), (rows, cin), &Device::Cpu)?;
        let mut t = [vec![], vec![]];
        for rep in 0..=reps {
            for (i, t) in t.iter_mut().enumerate() {
                let y = if kind == 2 {
                    let pointwise = if i == 0 { ConvTranspose2x2Op::pointwise(&wt, cin, cout, &bias) } else { None };
                    let op = ConvTranspose2x2Op { weight: weight.clone(), bias: bias.clone(), cin, cout, packed: None, pointwise, tiles: None };
                    let s = Instant::now();
                    let y = x.apply_op1_no_bwd(&op)?;
                    (y, s)
                } else {
                    let pw = if i == 0 { Pointwise::new(&wt, rows, cin) } else { None };
                    let op = Conv1x1Op { weight: weight.clone(), bias: bias.clone(), cin, cout, packed: None, pointwise: pw, tiles: None };
                    let s = Instant::now();
                    let y = if kind == 1 { x.apply_op2_no_bwd(&res, &op)? } else { x.apply_op1_no_bwd(&op)? };
                    (y, s)
                };
                if rep > 0 {
                    t.push(y.1.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        let (p, g) = (median(&mut t[0]), median(&mut t[1]));
        let name = ["1x1", "1x1+res", "transposed"][kind];
        sum_pw += p;
        sum_gemm += g;
        println!("{name:>10} {cin:>4}->{cout:<4} {h:>4}x{w:<4}  pointwise {p:7.2}  gemm {g:7.2}  ratio {:.2}x", g / p);
    }
    println!("{:>33}  pointwise {sum_pw:7.2}  gemm {sum_gemm:7.2}  ratio {:.2}x", "sum", sum_gemm / sum_pw);
    Ok(())
}

/// The bf16 1x1 convolutions with the residual (a level's input block) on AMX: the tile GEMM
/// against the one-tap tiles, interleaved in one process.
fn pointwise_bf16(reps: usize, rng: &mut Rng) -> candle_core::Result<()> {
    println!("bf16 1x1 + residual on AMX: tile GEMM vs one-tap tiles, and int8, {} threads, median of {reps}, ms per call", rayon::current_num_threads());
    // ViT-L's neck at its first level, ViT-S's heads' input blocks and the neck's UV inputs at
    // 600x400, 1800 tokens.
    for (cin, cout, h, w) in [(1024, 1024, 35, 52), (256, 256, 70, 104), (128, 128, 140, 208), (64, 64, 280, 416), (2, 64, 280, 416)] {
        let wt = rng.units(cout * cin);
        let bias = rng.units(cout);
        let x = Tensor::from_vec(rng.units(cin * h * w), (cin, h, w), &Device::Cpu)?;
        let res = Tensor::from_vec(rng.units(cout * h * w), (cout, h, w), &Device::Cpu)?;
        let weight = Tensor::from_vec(wt.clone(), (cout, cin), &Device::Cpu)?;
        let op = |tiles: bool| Conv1x1Op {
            weight: weight.clone(),
            bias: bias.clone(),
            cin,
            cout,
            packed: (!tiles).then(|| PackedA::from_f32(&wt, cout, cin)),
            pointwise: None,
            tiles: tiles.then(|| TileConv::new_pointwise(&wt, cin, cout, Kind::Bf16, false)),
        };
        let (gemm, tiles) = (op(false), op(true));
        let int8 = QuantConv::new_pointwise(&wt, bias.clone(), cin, cout, Isa::Amx)?;
        let mut t = [vec![], vec![], vec![]];
        let mut outs = vec![];
        for rep in 0..=reps {
            for (i, op) in [&gemm, &tiles].into_iter().enumerate() {
                let s = Instant::now();
                let y = x.apply_op2_no_bwd(&res, op)?;
                if rep > 0 {
                    t[i].push(s.elapsed().as_secs_f64() * 1e3);
                } else {
                    outs.push(y);
                }
            }
            let s = Instant::now();
            let y = x.apply_op2_no_bwd(&res, &int8.call(false))?;
            if rep > 0 {
                t[2].push(s.elapsed().as_secs_f64() * 1e3);
            }
            drop(y);
        }
        let diff = (&outs[0] - &outs[1])?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        let (g, p, q) = (median(&mut t[0]), median(&mut t[1]), median(&mut t[2]));
        let route = if int8.on_tiles() { "tiles" } else { "vnni" };
        println!("1x1+res {cin:>4}->{cout:<4} {h:>4}x{w:<4}  gemm {g:7.2}  tiles {p:7.2}  ratio {:.2}x  max diff {diff:e}  int8 ({route}) {q:7.2}", g / p);
    }
    Ok(())
}

/// The bf16 transposed convolutions on AMX: the tile GEMM then the interleave, against the
/// one-tap tiles, interleaved in one process.
fn transposed_bf16(reps: usize, rng: &mut Rng) -> candle_core::Result<()> {
    println!("bf16 transposed 2x2 on AMX: tile GEMM + interleave vs one-tap tiles, {} threads, median of {reps}, ms per call", rayon::current_num_threads());
    // ViT-S's neck and heads at 600x400, 1800 tokens (35x52 tokens).
    for (cin, cout, h, w) in [(384, 256, 35, 52), (256, 128, 70, 104), (128, 64, 140, 208)] {
        let wt = rng.units(4 * cout * cin);
        let bias = rng.units(cout);
        let x = Tensor::from_vec(rng.units(cin * h * w), (cin, h, w), &Device::Cpu)?;
        let weight = Tensor::from_vec(wt.clone(), (4 * cout, cin), &Device::Cpu)?;
        let gemm = ConvTranspose2x2Op {
            weight: weight.clone(),
            bias: bias.clone(),
            cin,
            cout,
            packed: Some(PackedA::from_f32(&wt, 4 * cout, cin)),
            pointwise: None,
            tiles: None,
        };
        let tiles = ConvTranspose2x2Op {
            weight,
            bias,
            cin,
            cout,
            packed: None,
            pointwise: None,
            tiles: Some(TileConv::new_transposed(&wt, cin, cout, Kind::Bf16, false)),
        };
        let mut t = [vec![], vec![]];
        let mut outs = vec![];
        for rep in 0..=reps {
            for (i, op) in [&gemm, &tiles].into_iter().enumerate() {
                let s = Instant::now();
                let y = x.apply_op1_no_bwd(op)?;
                if rep > 0 {
                    t[i].push(s.elapsed().as_secs_f64() * 1e3);
                } else {
                    outs.push(y);
                }
            }
        }
        let diff = (&outs[0] - &outs[1])?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        let (g, p) = (median(&mut t[0]), median(&mut t[1]));
        println!("transposed {cin:>4}->{cout:<4} {h:>4}x{w:<4}  gemm + interleave {g:7.2}  tiles {p:7.2}  ratio {:.2}x  max diff {diff:e}", g / p);
    }
    Ok(())
}
