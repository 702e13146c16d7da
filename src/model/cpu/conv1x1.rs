//! 1x1 and 2x2-stride-2 transposed convolutions over (C, H, W) planes as single GEMMs with the
//! bias (and an optional residual) written in the same pass, instead of GEMM, permute, copy
//! and broadcast-add as separate ops.
//!
//! In f32 at the AVX2 level the product is the 3x3 direct route's kernel with one tap
//! ([`Pointwise`]): on these shapes (a few hundred rows by up to 460 000 pixels) it beat the
//! `gemm` crate by 1.16x warm and 2-3x in a first forward (PERFORMANCE.md, step 15). Their
//! int8 route is the 3x3 one's with the centre tap alone (`super::conv3x3::int8`).

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape};
use rayon::prelude::*;

use super::tensor::{contiguous, with_f32};

use crate::simd::{Mat, SendPtr};

use super::conv3x3::tiles::TileConv;
use super::matmul::bf16::{gemm_bf16_packed_a, PackedA};
use super::matmul::gemm::{Gemm, Strided};
use super::matmul::pointwise::Pointwise;

/// out (m × n) += w (m × k) · x (k × n), all row-major, on the rayon pool.
pub(crate) fn gemm_into(out: &mut [f32], w: &[f32], x: &[f32], m: usize, k: usize, n: usize) {
    assert!(out.len() >= m * n && w.len() >= m * k && x.len() >= k * n, "gemm_into: operand sizes");
    let threads = rayon::current_num_threads().max(1);
    // SAFETY: `out` holds m rows of n (borrowed mutably), `w` m rows of k and `x` k rows of n
    // (asserted).
    unsafe {
        Gemm::new(m, n, k).accumulate(true).on_rayon(threads).run(
            Strided::rows(out.as_mut_ptr(), n),
            Strided::rows(w.as_ptr(), k),
            Strided::rows(x.as_ptr(), n),
        );
    }
}

/// out (m × n) += w (m × k) · x (k × n), in bf16 when the weight was packed for it.
fn weights_times(out: &mut [f32], w: &[f32], packed: Option<&PackedA>, x: &[f32], m: usize, k: usize, n: usize) {
    match packed {
        Some(p) => gemm_bf16_packed_a(p, Mat::from_slice(x, k, n, n), Mat::from_slice_mut(out, m, n, n), true, rayon::current_num_threads().max(1)),
        None => gemm_into(out, w, x, m, k, n),
    }
}

/// `nn.Conv2d(cin, cout, 1)`: weight (cout, cin), bias (cout).
pub struct Conv1x1Op {
    pub weight: candle_core::Tensor,
    pub bias: Vec<f32>,
    pub cin: usize,
    pub cout: usize,
    pub packed: Option<PackedA>,
    /// The f32 product on the AVX2 route ([`Pointwise`]).
    pub pointwise: Option<Pointwise>,
    /// bf16 on AMX tiles, one tap ([`TileConv::new_pointwise`]), where the calls give the map's
    /// rows ([`Conv1x1Op::run_map`]).
    pub tiles: Option<TileConv>,
}

impl Conv1x1Op {
    /// An f32 op from a (cout, cin) weight, on the route of the current level.
    pub fn new(w: Vec<f32>, bias: Vec<f32>, cin: usize, cout: usize) -> Result<Self> {
        if w.len() != cout * cin || bias.len() != cout {
            candle_core::bail!("conv1x1: {} weights and {} biases for {cin}->{cout}", w.len(), bias.len());
        }
        let pointwise = Pointwise::new(&w, cout, cin);
        let weight = candle_core::Tensor::from_vec(w, (cout, cin), &candle_core::Device::Cpu)?;
        Ok(Self { weight, bias, cin, cout, packed: None, pointwise, tiles: None })
    }

    /// out (cout, h, w) from x (cin, h, w) [+ residual]: on the tiles where the op has them,
    /// else [`Conv1x1Op::run`].
    pub fn run_map(&self, x: &[f32], (h, w): (usize, usize), residual: Option<&[f32]>) -> Result<Vec<f32>> {
        match &self.tiles {
            Some(t) if x.len() >= self.cin * h * w && residual.is_none_or(|r| r.len() >= self.cout * h * w) => {
                Ok(t.run(x, (h, w), false, &self.bias, residual))
            }
            _ => self.run(x, h * w, residual),
        }
    }

    /// out (cout, hw) from x (cin, hw) [+ residual].
    pub fn run(&self, x: &[f32], hw: usize, residual: Option<&[f32]>) -> Result<Vec<f32>> {
        if x.len() < self.cin * hw || residual.is_some_and(|r| r.len() < self.cout * hw) {
            candle_core::bail!(
                "conv1x1: {} input and {:?} residual values for {}->{} at {hw} pixels",
                x.len(),
                residual.map(<[f32]>::len),
                self.cin,
                self.cout
            );
        }
        if let Some(p) = &self.pointwise {
            return Ok(p.run(x, hw, &self.bias, residual));
        }
        // The bias (and residual) written straight into the new buffer, on every thread (it
        // was zeroed first, on the calling thread).
        let mut out: Vec<f32> = Vec::with_capacity(self.cout * hw);
        if hw > 0 {
            out.spare_capacity_mut()[..self.cout * hw].par_chunks_mut(hw).enumerate().for_each(|(o, row)| match residual {
                Some(r) => row.iter_mut().zip(&r[o * hw..(o + 1) * hw]).for_each(|(d, s)| {
                    d.write(s + self.bias[o]);
                }),
                None => row.iter_mut().for_each(|d| {
                    d.write(self.bias[o]);
                }),
            });
        }
        // SAFETY: each of the cout rows of hw floats was written above.
        unsafe { out.set_len(self.cout * hw) };
        with_f32(&self.weight, |w| weights_times(&mut out, w, self.packed.as_ref(), x, self.cout, self.cin, hw))?;
        Ok(out)
    }
}

impl CustomOp1 for Conv1x1Op {
    fn name(&self) -> &'static str {
        "conv1x1"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (c, h, w) = l.shape().dims3()?;
        if c != self.cin {
            candle_core::bail!("conv1x1: {c} input channels, weight expects {}", self.cin);
        }
        let out = self.run_map(contiguous(s, l, "conv1x1")?, (h, w), None)?;
        Ok((CpuStorage::F32(out), Shape::from((self.cout, h, w))))
    }
}

/// `residual + conv1x1(x)` in one pass: `ConvStack`'s `x = x + input_blocks[i](in[i])`.
impl CustomOp2 for Conv1x1Op {
    fn name(&self) -> &'static str {
        "conv1x1-add"
    }
    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (c, h, w) = l1.shape().dims3()?;
        if c != self.cin || l2.shape().dims() != [self.cout, h, w] {
            candle_core::bail!("conv1x1-add: shapes {:?} and {:?} do not fit weight {}x{}", l1.shape(), l2.shape(), self.cout, self.cin);
        }
        let out = self.run_map(contiguous(s1, l1, "conv1x1")?, (h, w), Some(contiguous(s2, l2, "conv1x1")?))?;
        Ok((CpuStorage::F32(out), Shape::from((self.cout, h, w))))
    }
}

/// `nn.ConvTranspose2d(cin, cout, 2, stride=2)`: weight as (cout·4, cin) with rows (o, di, dj).
pub struct ConvTranspose2x2Op {
    pub weight: candle_core::Tensor,
    pub bias: Vec<f32>,
    pub cin: usize,
    pub cout: usize,
    pub packed: Option<PackedA>,
    /// The f32 product on the AVX2 route ([`Pointwise`]), with the bias of each of its 4·cout
    /// rows (row (o, di, dj) takes bias[o]), so the interleave only moves values.
    pub pointwise: Option<(Pointwise, Vec<f32>)>,
    /// bf16 on AMX tiles ([`TileConv::new_transposed`]): the interleave done by the epilogue.
    pub tiles: Option<TileConv>,
}

impl ConvTranspose2x2Op {
    /// The `pointwise` field for the (cout·4, cin) weight `w` and bias (cout): `None` off the
    /// AVX2 route ([`Pointwise::new`]).
    pub fn pointwise(w: &[f32], cin: usize, cout: usize, bias: &[f32]) -> Option<(Pointwise, Vec<f32>)> {
        Pointwise::new(w, 4 * cout, cin).map(|p| (p, bias.iter().flat_map(|&b| [b; 4]).collect()))
    }
}

impl CustomOp1 for ConvTranspose2x2Op {
    fn name(&self) -> &'static str {
        "conv-transpose-2x2"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (c, h, w) = l.shape().dims3()?;
        if c != self.cin {
            candle_core::bail!("conv-transpose: {c} input channels, weight expects {}", self.cin);
        }
        let x = contiguous(s, l, "conv-transpose")?;
        if let Some(t) = &self.tiles {
            return Ok((CpuStorage::F32(t.run_upsampled(x, (h, w), &self.bias, None)), Shape::from((self.cout, 2 * h, 2 * w))));
        }
        let hw = h * w;
        let (y, bias) = match &self.pointwise {
            Some((p, bias4)) => (p.run(x, hw, bias4, None), None),
            None => {
                let mut y = super::tensor::par_zeros(4 * self.cout * hw);
                with_f32(&self.weight, |wt| weights_times(&mut y, wt, self.packed.as_ref(), x, 4 * self.cout, self.cin, hw))?;
                (y, Some(&self.bias[..]))
            }
        };
        // Interleave: out[o, 2i+di, 2j+dj] = bias[o] + y[(o, di, dj), (i, j)], one output row
        // at a time from its two source rows (dj = 0, 1).
        let (oh, ow) = (2 * h, 2 * w);
        let mut out: Vec<f32> = Vec::with_capacity(self.cout * oh * ow);
        let out_ptr = SendPtr(out.as_mut_ptr());
        (0..self.cout).into_par_iter().for_each(|o| {
            // SAFETY: `out` has room for cout planes of oh · ow floats; plane o is this task's
            // alone, and every float of it is written below before `set_len`.
            let plane = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(o * oh * ow), oh * ow) };
            let b = bias.map_or(0.0, |b| b[o]);
            for (r, row) in plane.chunks_exact_mut(ow.max(1)).enumerate() {
                let (i, di) = (r / 2, r % 2);
                let a = &y[(o * 4 + di * 2) * hw + i * w..][..w];
                let c = &y[(o * 4 + di * 2 + 1) * hw + i * w..][..w];
                if bias.is_some() {
                    row.chunks_exact_mut(2).zip(a).zip(c).for_each(|((p, &u), &v)| {
                        p[0] = u + b;
                        p[1] = v + b;
                    });
                } else {
                    row.chunks_exact_mut(2).zip(a).zip(c).for_each(|((p, &u), &v)| {
                        p[0] = u;
                        p[1] = v;
                    });
                }
            }
        });
        // SAFETY: every row of every plane was written above, within the capacity.
        unsafe { out.set_len(self.cout * oh * ow) };
        Ok((CpuStorage::F32(out), Shape::from((self.cout, oh, ow))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::isa;
    use candle_core::{Device, Tensor};

    use crate::simd::test_values as rand;

    /// `got` against an f64 value and the sum of |terms| behind it (the f32 accumulation's scale).
    fn close(got: f32, want: f64, mag: f64) -> bool {
        (got as f64 - want).abs() <= 1e-5 * mag + 1e-6
    }

    /// 1x1 convolutions (with and without the residual) and transposed convolutions at every
    /// level this machine can run, against an f64 reference: widths that are not a multiple of
    /// the 16-pixel block (the padded copy of the last columns), row counts that are not a
    /// multiple of the 6-row tile, 2 input channels (the ConvStack's UV input) and 300. The
    /// AVX2 level takes [`Pointwise`], the others the GEMM routes.
    #[test]
    fn pointwise_and_transposed_match_reference_at_every_level() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        // (cin, cout, h, w)
        let cases = [(2, 32, 3, 37), (64, 7, 5, 16), (300, 13, 1, 5), (33, 25, 4, 40), (5, 3, 3, 7)];
        for &(cin, cout, h, w) in &cases {
            let hw = h * w;
            let x = rand(&mut seed, cin * hw);
            let wt = rand(&mut seed, cout * cin);
            let wt4 = rand(&mut seed, 4 * cout * cin);
            let bias = rand(&mut seed, cout);
            let res = rand(&mut seed, cout * hw);
            let xt = Tensor::from_vec(x.clone(), (cin, h, w), &Device::Cpu).unwrap();
            let rt = Tensor::from_vec(res.clone(), (cout, h, w), &Device::Cpu).unwrap();
            // (value, Σ|terms|) of bias[o] + Σ_c w[row, c] x[c, p].
            let dot = |w: &[f32], row: usize, o: usize, p: usize| -> (f64, f64) {
                (0..cin).fold((bias[o] as f64, bias[o].abs() as f64), |(s, m), c| {
                    let t = w[row * cin + c] as f64 * x[c * hw + p] as f64;
                    (s + t, m + t.abs())
                })
            };
            for level in isa::levels() {
                let avx2 = Pointwise::available(level);
                let (c1, ct) = isa::with_isa(level, || {
                    let c1 = Conv1x1Op {
                        weight: Tensor::from_vec(wt.clone(), (cout, cin), &Device::Cpu).unwrap(),
                        bias: bias.clone(),
                        cin,
                        cout,
                        packed: None,
                        pointwise: Pointwise::new(&wt, cout, cin),
                        tiles: None,
                    };
                    let pw = ConvTranspose2x2Op::pointwise(&wt4, cin, cout, &bias);
                    let ct = ConvTranspose2x2Op {
                        weight: Tensor::from_vec(wt4.clone(), (4 * cout, cin), &Device::Cpu).unwrap(),
                        bias: bias.clone(),
                        cin,
                        cout,
                        packed: None,
                        pointwise: pw,
                        tiles: None,
                    };
                    (c1, ct)
                });
                assert_eq!(c1.pointwise.is_some(), avx2, "{level}");
                assert_eq!(ct.pointwise.is_some(), avx2, "{level}");
                let plain = xt.apply_op1_no_bwd(&c1).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                let added = xt.apply_op2_no_bwd(&rt, &c1).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                for o in 0..cout {
                    for p in 0..hw {
                        let (v, m) = dot(&wt, o, o, p);
                        let i = o * hw + p;
                        assert!(close(plain[i], v, m), "{level} conv1x1 {cin}->{cout} {h}x{w} [{o}, {p}]: {} vs {v}", plain[i]);
                        let r = res[i] as f64;
                        assert!(close(added[i], v + r, m + r.abs()), "{level} conv1x1+res {cin}->{cout} {h}x{w} [{o}, {p}]: {} vs {}", added[i], v + r);
                    }
                }
                let up = xt.apply_op1_no_bwd(&ct).unwrap();
                assert_eq!(up.dims(), &[cout, 2 * h, 2 * w]);
                let up = up.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                for o in 0..cout {
                    for yy in 0..2 * h {
                        for xx in 0..2 * w {
                            let (di, dj) = (yy % 2, xx % 2);
                            let (v, m) = dot(&wt4, o * 4 + di * 2 + dj, o, (yy / 2) * w + xx / 2);
                            let got = up[(o * 2 * h + yy) * 2 * w + xx];
                            assert!(close(got, v, m), "{level} transposed {cin}->{cout} {h}x{w} [{o}, {yy}, {xx}]: {got} vs {v}");
                        }
                    }
                }
            }
        }
    }
}
