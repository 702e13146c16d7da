//! `Sparse3DUNet` (`moge/model/modules/sparse_unet.py`) and its blocks
//! (`flex_sparse_blocks.py`: `SparseResBlock3d`, `PoolDown`, `NearestUp`), on the host: the
//! refiner of MoGe-3. Names map to the state-dict keys under `refiner.`. Features are rows of
//! voxels ([`Voxels`] order); the submanifold convolutions run on the CPU kernels in f32, bf16 or
//! int8; the linears in f32, but for the bottleneck's fusion, in bf16 where the convolutions are
//! (half its time). The first stays f32: bf16 would round the input features (x/z, y/z, log z)
//! by up to a depth bin (2^-8 relative against bins of 1/256). So do those between levels: in
//! bf16 they took the refiner at ViT-L's widths from PCC 0.99999 to 0.99994 against the float64
//! reference (`tests/it/moge3.rs`), for 2 % of its time.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use rayon::prelude::*;

use super::config::RefinerConfig;
use super::cpu::layer_norm::LayerNormOp;
use super::cpu::matmul::bf16::{self, linear_bf16, PackedB};
use super::cpu::matmul::gemm::{Gemm, Strided};
use super::cpu::sparse_conv::{DenseRows, Neighbours, Pre, Products, SubmConv3d};
use super::voxels::{mean_pool, upsample_add, Voxels};
use super::weights::Weights;
use super::Precision;
use crate::simd::isa::{self, Isa};
use crate::simd::math::silu_in_place;
use crate::simd::Mat;

/// The refiner's convolutions run in the model's precision.
impl From<Precision> for Products {
    fn from(p: Precision) -> Self {
        match p {
            Precision::F32 => Products::F32,
            Precision::Bf16 => Products::Bf16,
            Precision::Int8 => Products::Int8,
        }
    }
}

/// `nn.Linear` on rows: in f32, or in bf16 (f32 sums) where the refiner's products are bf16 and
/// the CPU multiplies bf16 natively ([`Linear::load_for`]).
pub struct Linear {
    d_in: usize,
    d_out: usize,
    /// PyTorch's (out, in); empty where packed.
    weight: Vec<f32>,
    bias: Vec<f32>,
    packed: Option<PackedB>,
    /// f32 on the row tiles, where the CPU has them.
    rows: Option<DenseRows>,
}

impl Linear {
    pub fn load(w: &mut Weights, p: &str, d_in: usize, d_out: usize) -> Result<Self> {
        let weight = w.host(&format!("{p}.weight"), &[d_out, d_in])?;
        let bias = w.host(&format!("{p}.bias"), &[d_out])?;
        let rows = DenseRows::new(&weight, bias.clone(), d_in, d_out, false);
        let weight = if rows.is_some() { vec![] } else { weight };
        Ok(Self { d_in, d_out, weight, bias, packed: None, rows })
    }

    /// As [`Linear::load`], in bf16 where `products` are and the CPU has them natively.
    pub fn load_for(w: &mut Weights, p: &str, d_in: usize, d_out: usize, products: Products) -> Result<Self> {
        if products == Products::Bf16 && bf16::native() {
            let weight = w.host(&format!("{p}.weight"), &[d_out, d_in])?;
            let bias = w.host(&format!("{p}.bias"), &[d_out])?;
            let packed = Some(PackedB::from_f32_nk(&weight, d_out, d_in));
            return Ok(Self { d_in, d_out, weight: vec![], bias, packed, rows: None });
        }
        Self::load(w, p, d_in, d_out)
    }

    /// y (n × out) = x (n × in) · Wᵀ + b.
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let n = x.len() / self.d_in.max(1);
        assert_eq!(x.len(), n * self.d_in, "refiner linear: {} inputs of width {}", x.len(), self.d_in);
        let threads = rayon::current_num_threads().max(1);
        if let Some(b) = &self.packed {
            return linear_bf16(Mat::from_slice(x, n, self.d_in, self.d_in), b, &self.bias, None, threads);
        }
        if let Some(rows) = &self.rows {
            return rows.forward(x);
        }
        let mut y = vec![0f32; n * self.d_out];
        if n == 0 {
            return y;
        }
        y.par_chunks_mut(self.d_out).for_each(|r| r.copy_from_slice(&self.bias));
        // SAFETY: y holds n rows of d_out, x n rows of d_in (asserted), the weight d_out rows
        // of d_in read transposed.
        unsafe {
            Gemm::new(n, self.d_out, self.d_in).accumulate(true).on_rayon(threads).run(
                Strided::rows(y.as_mut_ptr(), self.d_out),
                Strided::rows(x.as_ptr(), self.d_in),
                Strided::cols(self.weight.as_ptr(), self.d_in),
            )
        };
        y
    }

    pub fn macs(&self, rows: usize) -> u64 {
        (rows * self.d_in * self.d_out) as u64
    }
}

/// SiLU over every element, in parallel.
fn silu(level: Isa, mut x: Vec<f32>) -> Vec<f32> {
    x.par_chunks_mut(4096).for_each(|c| silu_in_place(level, c));
    x
}

/// `SparseResBlock3d(c)`: x + conv2(SiLU(conv1(SiLU(norm1(x))))).
pub struct SparseResBlock3d {
    norm1: LayerNormOp,
    conv1: SubmConv3d,
    conv2: SubmConv3d,
}

impl SparseResBlock3d {
    pub fn load(w: &mut Weights, p: &str, c: usize, products: Products) -> Result<Self> {
        let norm1 = LayerNormOp {
            weight: w.host(&format!("{p}.norm1.weight"), &[c])?,
            bias: w.host(&format!("{p}.norm1.bias"), &[c])?,
            eps: 1e-6,
            isa: isa::current(),
        };
        let conv = |w: &mut Weights, name: &str| -> Result<SubmConv3d> {
            let weight = w.host(&format!("{p}.{name}.weight"), &[c, 3, 3, 3, c])?;
            Ok(SubmConv3d::new(&weight, w.host(&format!("{p}.{name}.bias"), &[c])?, c, c, products))
        };
        Ok(Self { norm1, conv1: conv(w, "conv1")?, conv2: conv(w, "conv2")? })
    }

    pub fn forward(&self, x: &[f32], nb: &Neighbours) -> Vec<f32> {
        // The norm and the SiLUs applied as each convolution prepares its rows, the residual
        // added where conv2's outputs start (`SubmConv3d::forward_fused`).
        let h = self.conv1.forward_fused(x, nb, Pre::Norm { norm: &self.norm1, silu: true }, None);
        self.conv2.forward_fused(&h, nb, Pre::Silu, Some(x))
    }

    pub fn macs(&self, nb: &Neighbours) -> u64 {
        self.conv1.macs(nb) + self.conv2.macs(nb)
    }
}

/// What one refiner call did: voxels, convolution multiply-adds and time, per level.
#[derive(Debug, Clone, Default)]
pub struct RefinerStats {
    pub voxels: Vec<usize>,
    /// (voxel, neighbour) pairs of each level's submanifold convolutions.
    pub pairs: Vec<usize>,
    /// Multiply-adds of the sparse convolutions, and of everything (linears included).
    pub conv_macs: u64,
    pub macs: u64,
    /// Building the voxel sets and neighbour maps.
    pub structure: Duration,
    /// The residual blocks: their convolutions, LayerNorm, SiLU and residual adds.
    pub convolutions: Duration,
    /// The whole call.
    pub total: Duration,
}

/// `Sparse3DUNet`.
pub struct Sparse3DUNet {
    channels: Vec<usize>,
    encoder_channels: usize,
    input_proj: Linear,
    encoder_fuse: Linear,
    /// `fuse_proj.0` and `fuse_proj.2` (a SiLU between them).
    fuse_proj: (Linear, Linear),
    down_stages: Vec<Vec<SparseResBlock3d>>,
    downsample_blocks: Vec<Linear>,
    bottleneck_stage: Vec<SparseResBlock3d>,
    upsample_blocks: Vec<Linear>,
    up_stages: Vec<Vec<SparseResBlock3d>>,
    out_proj: Linear,
    isa: Isa,
}

impl Sparse3DUNet {
    pub fn load(w: &mut Weights, p: &str, cfg: &RefinerConfig, products: Products) -> Result<Self> {
        cfg.validate().map_err(anyhow::Error::msg)?;
        if cfg.in_channels != 3 || cfg.out_channels != 1 {
            bail!("refiner: {} input and {} output channels (MoGe-3 has 3 and 1)", cfg.in_channels, cfg.out_channels);
        }
        let ch = cfg.model_channels.clone();
        let levels = ch.len();
        let last = ch[levels - 1];
        let blocks = |w: &mut Weights, name: String, c: usize, n: usize| -> Result<Vec<SparseResBlock3d>> {
            (0..n).map(|b| SparseResBlock3d::load(w, &format!("{name}.{b}"), c, products)).collect()
        };
        let input_proj = Linear::load(w, &format!("{p}.input_proj"), cfg.in_channels, ch[0])?;
        // The bottleneck's fusion in the products' precision (the module's documentation).
        let linear = |w: &mut Weights, name: String, d_in: usize, d_out: usize| Linear::load_for(w, &name, d_in, d_out, products);
        let encoder_fuse = linear(w, format!("{p}.encoder_fuse"), cfg.encoder_channels, last)?;
        let fuse_proj = (linear(w, format!("{p}.fuse_proj.0"), 2 * last, last)?, linear(w, format!("{p}.fuse_proj.2"), last, last)?);
        let mut down_stages = vec![];
        let mut downsample_blocks = vec![];
        for (k, &c) in ch.iter().enumerate() {
            down_stages.push(blocks(w, format!("{p}.down_stages.{k}"), c, cfg.encoder_blocks_per_level.get(k).unwrap_or(1))?);
            if k + 1 < levels {
                downsample_blocks.push(Linear::load(w, &format!("{p}.downsample_blocks.{k}.linear"), c, ch[k + 1])?);
            }
        }
        let bottleneck_stage = blocks(w, format!("{p}.bottleneck_stage"), last, cfg.bottleneck_blocks)?;
        let mut upsample_blocks = vec![];
        let mut up_stages = vec![];
        for i in 0..levels - 1 {
            let (src, dst) = (levels - 1 - i, levels - 2 - i);
            upsample_blocks.push(Linear::load(w, &format!("{p}.upsample_blocks.{i}.linear"), ch[src], ch[dst])?);
            up_stages.push(blocks(w, format!("{p}.up_stages.{i}"), ch[dst], cfg.decoder_blocks_per_level.get(i).unwrap_or(1))?);
        }
        let out_proj = Linear::load(w, &format!("{p}.out_proj"), ch[0], cfg.out_channels)?;
        Ok(Self {
            channels: ch,
            encoder_channels: cfg.encoder_channels,
            input_proj,
            encoder_fuse,
            fuse_proj,
            down_stages,
            downsample_blocks,
            bottleneck_stage,
            upsample_blocks,
            up_stages,
            out_proj,
            isa: isa::current(),
        })
    }

    /// Levels of the U-Net; the map's side must be a multiple of `2^(levels − 1)`.
    pub fn levels(&self) -> usize {
        self.channels.len()
    }

    /// The log-depth correction (one per voxel) of `feats` (M × 3) at `voxels`, conditioned on
    /// `encoder` (encoder_channels, gh, gw planes), sampled at the deepest level's (i, j).
    pub fn forward(&self, feats: &[f32], voxels: &Voxels, encoder: &[f32], (gh, gw): (usize, usize)) -> Result<(Vec<f32>, RefinerStats)> {
        let t0 = Instant::now();
        let levels = self.levels();
        let scale = 1usize << (levels - 1);
        if voxels.height != gh * scale || voxels.width != gw * scale {
            bail!("refiner: a {}x{} voxel map for a {gw}x{gh} encoder map (expected {} times it)", voxels.width, voxels.height, scale);
        }
        if encoder.len() != self.encoder_channels * gh * gw {
            bail!("refiner: encoder map of {} floats for {} channels of {gw}x{gh}", encoder.len(), self.encoder_channels);
        }
        let mut stats = RefinerStats::default();
        let mut conv_time = Duration::ZERO;
        let mut structure = Duration::ZERO;
        let timed = |acc: &mut Duration, f: &mut dyn FnMut()| {
            let t = Instant::now();
            f();
            *acc += t.elapsed();
        };

        let mut x = self.input_proj.forward(feats);
        stats.macs += self.input_proj.macs(voxels.len());
        let mut vox = vec![voxels.clone()];
        let mut nbs: Vec<Neighbours> = vec![];
        let mut parents: Vec<Vec<u32>> = vec![];
        let mut skips: Vec<Vec<f32>> = vec![];
        for k in 0..levels {
            let mut nb = None;
            timed(&mut structure, &mut || nb = Some(vox[k].neighbours()));
            let nb = nb.expect("built above");
            stats.voxels.push(vox[k].len());
            stats.pairs.push(nb.pairs());
            for b in &self.down_stages[k] {
                timed(&mut conv_time, &mut || x = b.forward(&x, &nb));
                stats.conv_macs += b.macs(&nb);
            }
            nbs.push(nb);
            if k + 1 < levels {
                let mut pooled = None;
                timed(&mut structure, &mut || pooled = Some(vox[k].pooled()));
                let (up, parent) = pooled.expect("built above");
                let m = mean_pool(&x, self.channels[k], &parent, up.len());
                skips.push(std::mem::take(&mut x));
                x = self.downsample_blocks[k].forward(&m);
                stats.macs += self.downsample_blocks[k].macs(up.len());
                vox.push(up);
                parents.push(parent);
            }
        }

        // The bottleneck: the encoder's features at each deepest voxel's (i, j), fused.
        let deep = &vox[levels - 1];
        let (c, last) = (self.encoder_channels, self.channels[levels - 1]);
        let plane = gh * gw;
        let cols = deep.columns();
        let mut gathered = vec![0f32; deep.len() * c];
        gathered.par_chunks_mut(c).zip(cols.par_iter()).for_each(|(row, &col)| {
            for (ch, v) in row.iter_mut().enumerate() {
                *v = encoder[ch * plane + col as usize];
            }
        });
        let e = self.encoder_fuse.forward(&gathered);
        let cat: Vec<f32> = x.chunks_exact(last).zip(e.chunks_exact(last)).flat_map(|(a, b)| a.iter().chain(b).copied()).collect();
        let h = silu(self.isa, self.fuse_proj.0.forward(&cat));
        x = self.fuse_proj.1.forward(&h);
        stats.macs += self.encoder_fuse.macs(deep.len()) + self.fuse_proj.0.macs(deep.len()) + self.fuse_proj.1.macs(deep.len());
        for b in &self.bottleneck_stage {
            timed(&mut conv_time, &mut || x = b.forward(&x, &nbs[levels - 1]));
            stats.conv_macs += b.macs(&nbs[levels - 1]);
        }

        for i in 0..levels - 1 {
            let k = levels - 2 - i;
            let y = self.upsample_blocks[i].forward(&x);
            stats.macs += self.upsample_blocks[i].macs(vox[k + 1].len());
            x = upsample_add(&y, self.channels[k], &parents[k], &skips[k]);
            for b in &self.up_stages[i] {
                timed(&mut conv_time, &mut || x = b.forward(&x, &nbs[k]));
                stats.conv_macs += b.macs(&nbs[k]);
            }
        }
        let out = self.out_proj.forward(&x);
        stats.macs += stats.conv_macs + self.out_proj.macs(voxels.len());
        stats.structure = structure;
        stats.convolutions = conv_time;
        stats.total = t0.elapsed();
        Ok((out, stats))
    }
}
