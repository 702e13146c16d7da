//! `MoGeModel` (`moge/model/v2.py`): encoder, UV-conditioned neck, heads, scale head.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use lru::LruCache;

use super::build::BuildOptions;
use super::checkpoint::Checkpoint;
use super::config::{BackboneSpec, ModelConfig, RemapOutput};
use super::dinov2::{PATCH_SIZE, POS_GRID};
use super::modules::{ConvStack, Dinov2Encoder, EncoderOutput, FoldedTail, LinearTail, Mlp};
use super::sparse_unet::{RefinerStats, Sparse3DUNet};
use super::token_grid;
use super::weights::Weights;
use super::Precision;
use crate::geometry::resize::{resize_bicubic_scaled, resize_bilinear_antialias, resize_rgb8_antialias};
use crate::geometry::uv::view_plane_uv_planar;

/// Token grids whose per-grid state (position embeddings here, CUDA graphs in
/// [`super::Runner`]) is kept: a directory of photos has a few aspects, while `moge serve` lets
/// each request choose its grid, so the least recently used grid goes beyond this.
pub const GRIDS_CACHED: NonZeroUsize = NonZeroUsize::new(8).unwrap();

/// A loaded MoGe-2 model on one device.
pub struct Model {
    pub config: ModelConfig,
    pub precision: Precision,
    pub device: Device,
    /// The dtype of the matrix products' weights on the device: f32, or bf16 for
    /// `Precision::Bf16` off the CPU (the CPU kernels keep f32 weights and round while packing).
    /// Activations are f32 between products either way.
    pub dtype: DType,
    encoder: Dinov2Encoder,
    neck: ConvStack,
    points_head: Option<ConvStack>,
    normal_head: Option<ConvStack>,
    mask_head: Option<ConvStack>,
    /// The full-resolution level of the neck and heads, folded ([`FoldedTail`]); the stacks
    /// above then end one level early. `None`: they run it themselves.
    tail: Option<FoldedTail>,
    scale_head: Option<Mlp>,
    /// MoGe-3's sparse U-Net (`refiner.*`), on the host.
    pub(super) refiner: Option<Sparse3DUNet>,
    /// Interpolated position embeddings of the last token grids used, on the device.
    pos_cache: Mutex<LruCache<(usize, usize), Tensor>>,
    /// Host copy of the 37x37 embedding as (D, 37, 37) planes, for the bicubic resize.
    pos_planes: Vec<f32>,
    pos_cls: Vec<f32>,
}

/// The modules of `MoGeModel`, bound to a state dict.
struct Parts {
    encoder: Dinov2Encoder,
    neck: ConvStack,
    points_head: Option<ConvStack>,
    normal_head: Option<ConvStack>,
    mask_head: Option<ConvStack>,
    tail: Option<FoldedTail>,
    scale_head: Option<Mlp>,
    refiner: Option<Sparse3DUNet>,
}

impl Parts {
    fn bind(config: &ModelConfig, w: &mut Weights) -> Result<Self> {
        // Width and depth are read off the state dict and checked against the backbone name.
        let dim = w.shape_of("encoder.backbone.cls_token").and_then(|s| s.last().copied()).unwrap_or(0);
        let depth = w.keys().filter_map(|k| k.strip_prefix("encoder.backbone.blocks.")?.split('.').next()?.parse::<usize>().ok()).max().map_or(0, |d| d + 1);
        let spec = BackboneSpec::from_name(&config.encoder.backbone, dim, depth).map_err(anyhow::Error::msg)?;
        let encoder = Dinov2Encoder::load(w, &config.encoder, &spec)?;
        let heads = [("points_head", &config.points_head), ("normal_head", &config.normal_head), ("mask_head", &config.mask_head)];
        // The last level folds where the neck's and every head's does.
        let fold =
            w.build().folds() && LinearTail::folds(&config.neck, false) && heads.iter().all(|(_, c)| c.as_ref().is_none_or(|c| LinearTail::folds(c, true)));
        let (neck, tail, [points_head, normal_head, mask_head]) = if fold {
            let Some((neck, neck_tail)) = ConvStack::load_without_tail(w, "neck", &config.neck, false)? else { bail!("the neck's last level does not fold") };
            let mut tails = Vec::new();
            let mut stacks = [None, None, None];
            for ((name, cfg), stack) in heads.iter().zip(&mut stacks) {
                if let Some(cfg) = cfg {
                    let Some((s, t)) = ConvStack::load_without_tail(w, name, cfg, true)? else { bail!("{name}'s last level does not fold") };
                    *stack = Some(s);
                    tails.push(t);
                }
            }
            let tail = FoldedTail::new(w.build(), &neck_tail, &tails)?;
            (neck, Some(tail), stacks)
        } else {
            let neck = ConvStack::load(w, "neck", &config.neck)?;
            let mut stacks = [None, None, None];
            for ((name, cfg), stack) in heads.iter().zip(&mut stacks) {
                *stack = cfg.as_ref().map(|c| ConvStack::load(w, name, c)).transpose()?;
            }
            (neck, None, stacks)
        };
        Ok(Self {
            encoder,
            neck,
            points_head,
            normal_head,
            mask_head,
            tail,
            scale_head: config.scale_head.as_ref().map(|c| Mlp::load(w, "scale_head", &c.dims)).transpose()?,
            refiner: config.refiner.as_ref().map(|c| Sparse3DUNet::load(w, "refiner", c, w.build().precision().into())).transpose()?,
        })
    }
}

/// A decoded image made ready for the network (host work, any thread).
#[derive(Debug, Clone)]
pub struct Prepared {
    pub width: usize,
    pub height: usize,
    /// ViT token grid (rows, cols).
    pub grid: (usize, usize),
    /// Normalised (3, 14·rows, 14·cols) input.
    pub input: Vec<f32>,
    /// MoGe-3's refine steps ([`Model::default_refine_steps`] unless set by
    /// [`Prepared::refined`]), and whether the maps before each step are kept.
    pub refine_steps: usize,
    pub per_step: bool,
}

impl Prepared {
    /// With `steps` refine steps and, with `per_step`, the maps of every step kept.
    pub fn refined(self, steps: usize, per_step: bool) -> Self {
        Self { refine_steps: steps, per_step, ..self }
    }
}

/// Head outputs before the resize to the input size, planar on the host.
#[derive(Debug, Clone, Default)]
pub struct RawOutput {
    /// (16·rows, 16·cols) for the MoGe-2 heads.
    pub size: (usize, usize),
    pub points: Vec<f32>,
    pub normal: Option<Vec<f32>>,
    pub mask: Option<Vec<f32>>,
    /// Scale head output before `exp`.
    pub metric_scale: Option<f32>,
    /// The token grid (rows, cols).
    pub grid: (usize, usize),
    /// MoGe-3: the neck's level-0 input (encoder features and UV, planar at the token grid),
    /// which the refiner samples; `None` for MoGe-2.
    pub encoder_map: Option<Vec<f32>>,
    /// MoGe-3 with `per_step`: `points` before each refine step (step 0 first).
    pub points_per_step: Vec<Vec<f32>>,
    /// MoGe-3: what each refine step did.
    pub refiner: Vec<RefinerStats>,
}

/// What [`Model::network`] leaves on the device.
pub(crate) struct Network {
    pub enc: EncoderOutput,
    /// The neck's level-0 input, kept for MoGe-3's refiner.
    pub level0: Option<Tensor>,
    pub neck: Vec<Tensor>,
    pub heads: Vec<(&'static str, Vec<Tensor>)>,
    /// The scale head's (1, 1) output, before `exp`.
    pub scale: Option<Tensor>,
}

impl Network {
    /// The tensors the host needs: each head's last map and the scale.
    pub fn outputs(&self) -> Outputs {
        let head = |name: &str| self.heads.iter().find(|(n, _)| *n == name).and_then(|(_, outs)| outs.last().cloned());
        Outputs {
            points: head("points_head"),
            normal: head("normal_head"),
            mask: head("mask_head"),
            scale: self.scale.clone(),
            encoder_map: self.level0.clone(),
        }
    }

    pub fn read_back(&self) -> Result<RawOutput> {
        self.outputs().read_back()
    }
}

/// The network's outputs on the device.
pub(crate) struct Outputs {
    pub points: Option<Tensor>,
    pub normal: Option<Tensor>,
    pub mask: Option<Tensor>,
    pub scale: Option<Tensor>,
    pub encoder_map: Option<Tensor>,
}

impl Outputs {
    /// Copies the outputs to the host (waiting for the device).
    pub fn read_back(&self) -> Result<RawOutput> {
        let host = |t: &Option<Tensor>| -> Result<Option<Vec<f32>>> {
            t.as_ref().map(|t| Ok(t.to_device(&Device::Cpu)?.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)).transpose()
        };
        let points_t = self.points.as_ref().context("the model has no points head")?;
        let size = (points_t.dim(1)?, points_t.dim(2)?);
        let points = host(&self.points)?.unwrap_or_default();
        let grid = match &self.encoder_map {
            Some(m) => (m.dim(1)?, m.dim(2)?),
            None => (0, 0),
        };
        Ok(RawOutput {
            size,
            points,
            normal: host(&self.normal)?,
            mask: host(&self.mask)?,
            metric_scale: host(&self.scale)?.map(|v| v[0]),
            grid,
            encoder_map: host(&self.encoder_map)?,
            ..RawOutput::default()
        })
    }
}

/// Every intermediate of one forward, for per-stage parity checks.
pub struct Intermediates {
    pub pos_embed: Tensor,
    pub taps: Vec<Tensor>,
    pub features: Tensor,
    pub cls_token: Tensor,
    pub neck: Vec<Tensor>,
    pub heads: Vec<(&'static str, Vec<Tensor>)>,
    pub raw: RawOutput,
}

impl Model {
    /// Reads a checkpoint (`model.pt`, or `.safetensors` + JSON config) and builds it
    /// ([`Model::build`]); [`crate::load`] also takes a published model's name.
    pub fn load(path: &Path, opts: &BuildOptions) -> Result<Self> {
        let ck = Checkpoint::read(path)?;
        let path = ck.path.clone();
        Self::build(ck.config, ck.tensors, opts).with_context(|| format!("{}: wrong checkpoint", path.display()))
    }

    /// Binds a state dict to the network of `config`, each layer taking its route from `opts`.
    pub fn build(mut config: ModelConfig, tensors: HashMap<String, Tensor>, opts: &BuildOptions) -> Result<Self> {
        // v3 passes `remap_output='exp'` to v2 itself; its configs carry none.
        if config.refiner.is_some() {
            config.remap_output = RemapOutput::Exp;
        }
        let mut w = Weights::new(tensors, opts);
        // The ops that read the level themselves while they pack read the options' level.
        let parts = match opts.cpu_level() {
            Some(level) => crate::simd::isa::with_isa(level, || Parts::bind(&config, &mut w))?,
            None => Parts::bind(&config, &mut w)?,
        };
        w.finish()?;
        let Parts { encoder, neck, points_head, normal_head, mask_head, tail, scale_head, refiner } = parts;
        if points_head.is_none() {
            bail!("the model has no points head");
        }
        // The scale head reads the class token: a config whose weights agree with it but not
        // with the backbone is caught here rather than at the first image.
        let width = encoder.backbone.embed_dim;
        if let Some(first) = config.scale_head.as_ref().and_then(|c| c.dims.first()).filter(|&&d| d != width) {
            bail!(
                "scale_head.dims starts at {first}, but the {} backbone's class token is {width} wide: the model_config does not fit this network",
                config.encoder.backbone
            );
        }
        let pe = encoder.backbone.pos_embed.to_device(&Device::Cpu)?;
        let pos_cls = pe.get(0)?.to_vec1::<f32>()?;
        let pos_planes = pe.narrow(0, 1, POS_GRID * POS_GRID)?.t()?.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        Ok(Self {
            precision: opts.precision(),
            config,
            device: opts.device().clone(),
            dtype: opts.dtype(),
            encoder,
            neck,
            points_head,
            normal_head,
            mask_head,
            tail,
            scale_head,
            refiner,
            pos_cache: Mutex::new(LruCache::new(GRIDS_CACHED)),
            pos_planes,
            pos_cls,
        })
    }

    /// The state-dict keys and shapes `config` needs (published backbones only, whose width and
    /// depth are fixed by name).
    pub fn state_dict_shapes(config: &ModelConfig) -> Result<Vec<(String, Vec<usize>)>> {
        let mut w = Weights::new(HashMap::new(), &BuildOptions::default());
        Parts::bind(config, &mut w)?;
        Ok(w.requested().to_vec())
    }

    pub fn has_normal(&self) -> bool {
        self.normal_head.is_some()
    }

    /// Host preprocessing: u8 RGB (H, W, 3) → [0,1] float → antialiased bilinear resize to the
    /// ViT input → ImageNet normalisation.
    pub fn prepare(&self, rgb: &[u8], width: usize, height: usize, num_tokens: u32) -> Prepared {
        assert_eq!(rgb.len(), width * height * 3);
        let grid = token_grid(width, height, num_tokens);
        let (ih, iw) = (grid.0 * PATCH_SIZE, grid.1 * PATCH_SIZE);
        let input = resize_rgb8_antialias(rgb, height, width, ih, iw);
        self.normalized(input, width, height, grid)
    }

    /// As [`Model::prepare`] for a planar (3, H, W) float image in [0, 1].
    pub fn prepare_float(&self, planar: &[f32], width: usize, height: usize, num_tokens: u32) -> Prepared {
        let grid = token_grid(width, height, num_tokens);
        let (ih, iw) = (grid.0 * PATCH_SIZE, grid.1 * PATCH_SIZE);
        let input = resize_bilinear_antialias(planar, 3, height, width, ih, iw);
        self.normalized(input, width, height, grid)
    }

    /// `(image − mean) / std` per channel of the resized input.
    fn normalized(&self, mut input: Vec<f32>, width: usize, height: usize, grid: (usize, usize)) -> Prepared {
        let plane = grid.0 * PATCH_SIZE * grid.1 * PATCH_SIZE;
        for c in 0..3 {
            let (m, s) = (self.encoder.image_mean[c], self.encoder.image_std[c]);
            input[c * plane..(c + 1) * plane].iter_mut().for_each(|v| *v = (*v - m) / s);
        }
        Prepared { width, height, grid, input, refine_steps: self.default_refine_steps(), per_step: false }
    }

    /// `interpolate_pos_encoding`: the 37x37 table as is for a 37x37 grid, else bicubic with
    /// DINOv2's 0.1 offset in the scale factor. The last [`GRIDS_CACHED`] grids are kept.
    pub fn pos_embed(&self, rows: usize, cols: usize) -> Result<Tensor> {
        if let Some(t) = self.pos_cache.lock().unwrap_or_else(|e| e.into_inner()).get(&(rows, cols)) {
            return Ok(t.clone());
        }
        let dim = self.pos_cls.len();
        let t = if rows == POS_GRID && cols == POS_GRID {
            self.encoder.backbone.pos_embed.clone()
        } else {
            let sy = (rows as f64 + 0.1) / POS_GRID as f64;
            let sx = (cols as f64 + 0.1) / POS_GRID as f64;
            let planes = resize_bicubic_scaled(&self.pos_planes, dim, POS_GRID, POS_GRID, rows, cols, sy, sx);
            let patch = Tensor::from_vec(planes, (dim, rows * cols), &Device::Cpu)?.t()?;
            let cls = Tensor::from_slice(&self.pos_cls, (1, dim), &Device::Cpu)?;
            Tensor::cat(&[&cls, &patch], 0)?.contiguous()?.to_device(&self.device)?
        };
        self.pos_cache.lock().unwrap_or_else(|e| e.into_inner()).put((rows, cols), t.clone());
        Ok(t)
    }

    /// The token grids whose position embeddings are cached now (at most [`GRIDS_CACHED`]).
    pub fn cached_grids(&self) -> usize {
        self.pos_cache.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The network on one prepared image, op by op ([`super::Runner`] replays captured
    /// forwards where the device has them).
    pub fn forward(&self, prep: &Prepared) -> Result<RawOutput> {
        let mut raw = self.forward_intermediates(prep, None)?.raw;
        self.refine(&mut raw, prep.refine_steps, prep.per_step)?;
        Ok(raw)
    }

    /// The network, keeping every intermediate; with `timings`, the wall time of each part
    /// (encoder, neck, each head, scale head) is appended. Timings are exact on the CPU, where
    /// every op completes before it returns; an asynchronous device needs a sync per part.
    pub fn forward_intermediates(&self, prep: &Prepared, timings: Option<&mut Vec<(&'static str, Duration)>>) -> Result<Intermediates> {
        let (image, uv) = self.device_inputs(prep)?;
        let pos_embed = self.pos_embed(prep.grid.0, prep.grid.1)?;
        let net = self.network(&image, &uv, &pos_embed, prep.grid, timings)?;
        let raw = net.read_back()?;
        let Network { enc, neck, heads, .. } = net;
        Ok(Intermediates { pos_embed, taps: enc.taps, features: enc.features, cls_token: enc.cls_token, neck, heads, raw })
    }

    /// The network's inputs on the device: the normalised image, and the UV planes of the
    /// neck's five levels (their values depend on the photo's aspect, not only on the grid).
    pub(crate) fn device_inputs(&self, prep: &Prepared) -> Result<(Tensor, Vec<Tensor>)> {
        Ok((self.device_image(prep)?, self.device_uv(prep)?))
    }

    /// The normalised (3, 14·rows, 14·cols) image on the device.
    pub(crate) fn device_image(&self, prep: &Prepared) -> Result<Tensor> {
        let (rows, cols) = prep.grid;
        Ok(Tensor::from_slice(&prep.input, (3, rows * PATCH_SIZE, cols * PATCH_SIZE), &self.device)?)
    }

    /// The (2, rows·2^l, cols·2^l) UV planes of levels l = 0..5 on the device.
    pub(crate) fn device_uv(&self, prep: &Prepared) -> Result<Vec<Tensor>> {
        let (rows, cols) = prep.grid;
        let aspect = prep.width as f64 / prep.height as f64;
        Ok((0..5)
            .map(|level| {
                let (h, w) = (rows << level, cols << level);
                Tensor::from_vec(view_plane_uv_planar(w, h, aspect), (2, h, w), &self.device)
            })
            .collect::<candle_core::Result<Vec<_>>>()?)
    }

    /// Encoder, neck and heads on device-resident inputs, with nothing read back to the host and
    /// nothing uploaded (so that it can be captured as a CUDA graph).
    pub(crate) fn network(
        &self,
        image: &Tensor,
        uv: &[Tensor],
        pos_embed: &Tensor,
        (rows, cols): (usize, usize),
        mut timings: Option<&mut Vec<(&'static str, Duration)>>,
    ) -> Result<Network> {
        let mut clock = Instant::now();
        let mut lap = |name: &'static str, timings: &mut Option<&mut Vec<(&'static str, Duration)>>| {
            if let Some(t) = timings.as_mut() {
                let _ = self.device.synchronize();
                let now = Instant::now();
                t.push((name, now - clock));
                clock = now;
            }
        };
        let enc = self.encoder.forward(image, rows, cols, pos_embed)?;
        lap("encoder", &mut timings);

        // UV conditioning per level: level 0 also takes the encoder's features.
        let level0 = Tensor::cat(&[&enc.features, &uv[0]], 0)?;
        let inputs: Vec<Option<&Tensor>> = std::iter::once(&level0).chain(&uv[1..]).map(Some).collect();
        let (neck, neck_last) = self.neck.forward_with_last(&inputs)?;
        // The folded full-resolution level: the neck's share of the heads' outputs.
        let shared = self.tail.as_ref().map(|t| t.shared(&neck_last)).transpose()?;
        lap("neck", &mut timings);
        let neck_in: Vec<Option<&Tensor>> = neck.iter().map(Some).collect();

        let mut heads = Vec::new();
        for (name, head) in [("points_head", &self.points_head), ("normal_head", &self.normal_head), ("mask_head", &self.mask_head)] {
            if let Some(h) = head {
                let levels = match (&self.tail, &shared) {
                    (Some(tail), Some(shared)) => {
                        let (mut levels, last) = h.forward_with_last(&neck_in)?;
                        levels.push(tail.head(heads.len(), shared, &last, &uv[inputs.len() - 1])?);
                        levels
                    }
                    _ => h.forward(&neck_in)?,
                };
                heads.push((name, levels));
                lap(name, &mut timings);
            }
        }
        let scale = self.scale_head.as_ref().map(|m| m.forward(&enc.cls_token)).transpose()?;
        lap("scale_head", &mut timings);
        let level0 = self.refiner.is_some().then_some(level0);
        Ok(Network { enc, level0, neck, heads, scale })
    }
}
