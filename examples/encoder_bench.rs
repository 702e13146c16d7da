//! Milliseconds per call of one ViT block's products in f32, int8 and bf16 at 1800 tokens
//! (`moge::model::cpu` linear and attention ops, epilogues included), for ViT-S and ViT-L widths,
//! GFLOP/s counting a multiply-add as two: each linear through the `gemm` crate, through
//! `sgemm`'s panels (the level's one-tap kernel, AVX2 or AVX-512F), in int8 and in bf16 (on AMX
//! tiles where the CPU has them), interleaved in one process (the machine is shared: compare the
//! ratio); attention in f32 and in bf16, by the routes of this machine's level; then int8's two
//! parts apart (quantising the activations, the product of the quantised rows), and attn.proj
//! and fc2 in bf16 with LayerScale and the residual add apart and in the product's epilogue.
//!
//! `cargo run --release --example encoder_bench [reps] [s|l][a]` (`a`: attention only)

mod common;
use candle_core::{Device, Tensor};
use common::rng::Rng;
use common::{keep_freed_memory, median};
use moge::model::cpu::attention::AttentionOp;
use moge::model::cpu::linear::{Epilogue, F32Weight, LinearOp, LinearResidual, Packed, ScaledResidualOp};
use moge::model::cpu::matmul::bf16::PackedB;
use moge::model::cpu::matmul::int8::{product_quantised, quantise_activations, QuantB};
use moge::simd::isa;
use moge::simd::sgemm::Panels;
use moge::simd::MatMut;
use std::sync::Arc;
use std::time::Instant;

/// Ways of running each linear (see `ways` below).
const W: usize = 4;

fn main() -> candle_core::Result<()> {
    keep_freed_memory();
    let reps: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(5);
    let which = std::env::args().nth(2).unwrap_or_else(|| "sl".into());
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let n = 1800;
    for (name, d, heads) in [("vits", 384usize, 6usize), ("vitl", 1024, 16)] {
        if !which.contains(&name[3..4]) {
            continue;
        }
        // Each linear twice: through the `gemm` crate and, where the level has a one-tap kernel,
        // through `sgemm`'s panels.
        let panels = Panels::available(isa::current());
        let lin = |d_in: usize, d_out: usize, epilogue, rng: &mut Rng| -> candle_core::Result<[LinearOp; W]> {
            let wv: Vec<f32> = rng.units(d_in * d_out).iter().map(|v| v * 0.05).collect();
            let bias = rng.units(d_out);
            let tensor = F32Weight::Tensor(Tensor::from_vec(wv.clone(), (d_out, d_in), &Device::Cpu)?);
            let packed = if panels { F32Weight::Panels(Arc::new(Panels::new(&wv, d_in, d_out, 1, d_in))) } else { tensor.clone() };
            let op = |weight, packed| LinearOp { weight, bias: bias.clone(), d_in, d_out, epilogue, packed, isa: isa::current() };
            let int8 = Packed::Int8(Arc::new(QuantB::from_f32_nk(&wv, d_out, d_in, isa::current())));
            let bf16 = Packed::Bf16(Arc::new(PackedB::from_f32_nk(&wv, d_out, d_in)));
            Ok([op(tensor.clone(), None), op(packed, None), op(tensor.clone(), Some(int8)), op(F32Weight::InPacked, Some(bf16))])
        };
        let ops = [
            ("qkv", lin(d, 3 * d, Epilogue::Bias, &mut rng)?),
            ("proj", lin(d, d, Epilogue::Bias, &mut rng)?),
            ("fc1", lin(d, 4 * d, Epilogue::BiasGelu, &mut rng)?),
            ("fc2", lin(4 * d, d, Epilogue::Bias, &mut rng)?),
        ];
        let inputs: Vec<Tensor> =
            ops.iter().map(|(_, op)| Tensor::from_vec(rng.units(n * op[0].d_in), (n, op[0].d_in), &Device::Cpu)).collect::<candle_core::Result<_>>()?;
        let qkv = rng.units(n * 3 * d);
        let att = [false, true].map(|bf16| AttentionOp { num_heads: heads, bf16, isa: isa::current() });
        let mut times = vec![Vec::new(); W * ops.len() + 2];
        let only_attention = which.contains('a');
        for _ in 0..reps {
            for (i, (_, op)) in ops.iter().enumerate().filter(|_| !only_attention) {
                for (j, op) in op.iter().enumerate() {
                    let t = Instant::now();
                    let y = inputs[i].apply_op1_no_bwd(op)?;
                    times[W * i + j].push(t.elapsed().as_secs_f64());
                    drop(y);
                }
            }
            for (j, att) in att.iter().enumerate() {
                let t = Instant::now();
                let o = att.run(&qkv, n, d);
                times[W * ops.len() + j].push(t.elapsed().as_secs_f64());
                drop(o);
            }
        }
        // int8's two parts apart: quantising the activations (per row, on every call) and the
        // product of the quantised rows (with its epilogue).
        let mut parts = vec![(Vec::new(), Vec::new()); ops.len()];
        // The inputs' values and the outputs, made once for every rep.
        let mut host: Vec<(Vec<f32>, Vec<f32>)> = match only_attention {
            true => Vec::new(),
            false => inputs
                .iter()
                .zip(&ops)
                .map(|(x, (_, op))| Ok((x.flatten_all()?.to_vec1::<f32>()?, vec![0f32; n * op[2].d_out])))
                .collect::<candle_core::Result<_>>()?,
        };
        for _ in 0..reps {
            for (i, (_, op)) in ops.iter().enumerate().filter(|_| !only_attention) {
                let Some(Packed::Int8(b)) = &op[2].packed else { continue };
                let ((x, y), (k, dn)) = (&mut host[i], (op[2].d_in, op[2].d_out));
                let t = Instant::now();
                let a = quantise_activations(x, n, k, b.route());
                parts[i].0.push(t.elapsed().as_secs_f64());
                let t = Instant::now();
                // SAFETY: `y` holds n × dn floats, written only here.
                unsafe { product_quantised(&a, b, &op[2].bias, MatMut::from_mut_ptr(y.as_mut_ptr(), n, dn, dn), op[2].epilogue == Epilogue::BiasGelu, true) };
                parts[i].1.push(t.elapsed().as_secs_f64());
            }
        }
        // Per way of computing the linears (the gemm crate, panels, int8, bf16), the block's
        // total with the attention (f32's, bf16's for the bf16 linears).
        let ways = ["gemm crate", "panels", "int8", "bf16"];
        let mut totals = [0.0; W];
        for (i, t) in times.iter_mut().enumerate() {
            let (label, flops) = match ops.get(i / W) {
                Some((l, op)) => (format!("{l} {}", ways[i % W]), 2.0 * (n * op[0].d_in * op[0].d_out) as f64),
                None if i == W * ops.len() => ("attention".to_owned(), 4.0 * (n * n * d) as f64),
                None => ("attention bf16".to_owned(), 4.0 * (n * n * d) as f64),
            };
            if t.is_empty() {
                continue;
            }
            let s = median(t);
            match ops.get(i / W) {
                Some(_) => totals[i % W] += s,
                None if i == W * ops.len() => totals[..W - 1].iter_mut().for_each(|t| *t += s),
                None => totals[W - 1] += s,
            }
            println!("{name} {label:<16} {:8.2} ms {:7.1} G(FL)OP/s", s * 1e3, flops / s / 1e9);
        }
        for ((label, _), (q, p)) in ops.iter().zip(parts.iter_mut()) {
            if !q.is_empty() {
                println!("{name} {label} int8 parts: quantise {:6.2} ms, product {:6.2} ms", median(q) * 1e3, median(p) * 1e3);
            }
        }
        // attn.proj and fc2 in bf16 with LayerScale and the residual add: the product then the
        // add's pass (`ScaledResidualOp`), against the add in the tiles' epilogue
        // (`LinearResidual`).
        if !only_attention {
            let gamma = rng.units(d);
            let res = Tensor::from_vec(rng.units(n * d), (n, d), &Device::Cpu)?;
            let add = ScaledResidualOp { gamma: gamma.clone() };
            for (i, label) in [(1, "proj"), (3, "fc2")] {
                let op = &ops[i].1[3];
                let fused = LinearResidual { linear: op, gamma: &gamma };
                let (mut apart, mut together) = (Vec::new(), Vec::new());
                for _ in 0..reps {
                    let t = Instant::now();
                    let y = res.apply_op2_no_bwd(&inputs[i].apply_op1_no_bwd(op)?, &add)?;
                    apart.push(t.elapsed().as_secs_f64());
                    drop(y);
                    let t = Instant::now();
                    let y = inputs[i].apply_op2_no_bwd(&res, &fused)?;
                    together.push(t.elapsed().as_secs_f64());
                    drop(y);
                }
                println!(
                    "{name} {label} bf16 + layerscale residual: apart {:6.2} ms, in the epilogue {:6.2} ms",
                    median(&mut apart) * 1e3,
                    median(&mut together) * 1e3
                );
            }
        }
        let route = moge::model::cpu::matmul::int8::route(isa::current()).name();
        let bf16 = moge::model::cpu::matmul::bf16::route(isa::current());
        println!(
            "{name} block, linears by the gemm crate {:8.2} ms, by panels {:8.2} ms, int8 ({route}) {:8.2} ms, bf16 ({bf16}, attention too) {:8.2} ms",
            totals[0] * 1e3,
            totals[1] * 1e3,
            totals[2] * 1e3,
            totals[3] * 1e3
        );
    }
    Ok(())
}
