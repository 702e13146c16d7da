//! `model_config` of an upstream checkpoint: the constructor arguments of `MoGeModel`
//! (`moge/model/v2.py`), read from the pickle or from a JSON file beside a safetensors file.

use serde::{Deserialize, Serialize};

/// `MoGeModel(**model_config)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub encoder: EncoderConfig,
    pub neck: ConvStackConfig,
    #[serde(default)]
    pub points_head: Option<ConvStackConfig>,
    #[serde(default)]
    pub mask_head: Option<ConvStackConfig>,
    #[serde(default)]
    pub normal_head: Option<ConvStackConfig>,
    #[serde(default)]
    pub scale_head: Option<MlpConfig>,
    #[serde(default = "default_remap")]
    pub remap_output: RemapOutput,
    #[serde(default = "default_num_tokens_range")]
    pub num_tokens_range: [u32; 2],
    /// MoGe-3 (`moge/model/v3.py`): the sparse 3D U-Net that refines log-depth. Its presence is
    /// what makes a checkpoint MoGe-3; v3 fixes `remap_output` to `exp` (its config has none).
    #[serde(default)]
    pub refiner: Option<RefinerConfig>,
    /// Voxels per unit of log-depth (v3: 256).
    #[serde(default = "default_depth_resolution")]
    pub refiner_depth_resolution: f64,
}

fn default_depth_resolution() -> f64 {
    256.0
}

/// `Sparse3DUNet(**refiner)` (`moge/model/modules/sparse_unet.py`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefinerConfig {
    #[serde(default = "default_three")]
    pub in_channels: usize,
    #[serde(default = "default_one")]
    pub out_channels: usize,
    pub encoder_channels: usize,
    pub model_channels: Vec<usize>,
    #[serde(default = "default_blocks")]
    pub encoder_blocks_per_level: PerLevel<usize>,
    #[serde(default = "default_blocks")]
    pub decoder_blocks_per_level: PerLevel<usize>,
    #[serde(default = "default_one")]
    pub bottleneck_blocks: usize,
    #[serde(default)]
    pub downsample_factors: Option<Vec<usize>>,
    #[serde(default = "default_encoder_downsample")]
    pub encoder_downsample: usize,
}

fn default_three() -> usize {
    3
}
fn default_blocks() -> PerLevel<usize> {
    PerLevel::All(1)
}
fn default_encoder_downsample() -> usize {
    16
}

impl RefinerConfig {
    /// The checks upstream's constructor makes, plus what this port supports: factors of 2 (the
    /// released models'), one block count per level, and sizes no published model exceeds (a
    /// damaged config must not ask for unbounded memory).
    pub fn validate(&self) -> Result<(), String> {
        let levels = self.model_channels.len();
        if !(2..=8).contains(&levels) {
            return Err(format!("refiner.model_channels has {levels} levels (2 to 8 supported)"));
        }
        if let Some(c) = self.model_channels.iter().chain([&self.in_channels, &self.out_channels, &self.encoder_channels]).find(|&&c| c == 0 || c > 8192) {
            return Err(format!("refiner channel count {c} is outside 1..=8192"));
        }
        let factors = self.downsample_factors.clone().unwrap_or_else(|| vec![2; levels - 1]);
        if factors.len() != levels - 1 || factors.iter().any(|&f| f != 2) {
            return Err(format!("refiner.downsample_factors {factors:?}: this port runs factors of 2, one per level transition ({} here)", levels - 1));
        }
        if self.encoder_downsample != 1 << (levels - 1) {
            return Err(format!("refiner.encoder_downsample {} is not the product of its downsample factors ({})", self.encoder_downsample, 1 << (levels - 1)));
        }
        for (name, blocks, n) in
            [("encoder_blocks_per_level", &self.encoder_blocks_per_level, levels), ("decoder_blocks_per_level", &self.decoder_blocks_per_level, levels - 1)]
        {
            if let PerLevel::Each(v) = blocks {
                if v.len() != n {
                    return Err(format!("refiner.{name} has {} entries for {n} levels", v.len()));
                }
            }
            if (0..n).any(|i| blocks.get(i).is_none_or(|b| b > 16)) {
                return Err(format!("refiner.{name}: at most 16 blocks per level"));
            }
        }
        if self.bottleneck_blocks > 16 {
            return Err("refiner.bottleneck_blocks: at most 16".into());
        }
        Ok(())
    }
}

fn default_remap() -> RemapOutput {
    RemapOutput::Linear
}
fn default_num_tokens_range() -> [u32; 2] {
    [1200, 3600]
}

/// `DINOv2Encoder(backbone, intermediate_layers, dim_out)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EncoderConfig {
    pub backbone: String,
    pub intermediate_layers: IntermediateLayers,
    pub dim_out: usize,
}

/// Either the indices of the tapped blocks, or "the last n blocks".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IntermediateLayers {
    Last(usize),
    Indices(Vec<usize>),
}

impl IntermediateLayers {
    /// The 0-based block indices whose outputs are tapped, for a backbone of `depth` blocks.
    pub fn indices(&self, depth: usize) -> Vec<usize> {
        match self {
            IntermediateLayers::Last(n) => (depth.saturating_sub(*n)..depth).collect(),
            IntermediateLayers::Indices(v) => v.clone(),
        }
    }
}

/// `ConvStack(dim_in, dim_res_blocks, dim_out, resamplers, ...)` (`moge/model/modules.py`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConvStackConfig {
    pub dim_in: PerLevel<Option<usize>>,
    pub dim_res_blocks: Vec<usize>,
    #[serde(default)]
    pub dim_out: PerLevel<Option<usize>>,
    pub resamplers: PerLevel<String>,
    #[serde(default = "default_one")]
    pub dim_times_res_block_hidden: usize,
    #[serde(default = "default_num_res_blocks")]
    pub num_res_blocks: PerLevel<usize>,
    #[serde(default = "default_in_norm")]
    pub res_block_in_norm: String,
    #[serde(default = "default_hidden_norm")]
    pub res_block_hidden_norm: String,
    #[serde(default = "default_activation")]
    pub activation: String,
}

fn default_one() -> usize {
    1
}
fn default_num_res_blocks() -> PerLevel<usize> {
    PerLevel::All(1)
}
fn default_in_norm() -> String {
    "layer_norm".into()
}
fn default_hidden_norm() -> String {
    "group_norm".into()
}
fn default_activation() -> String {
    "relu".into()
}

/// Upstream accepts one value for every level or a list with one per level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PerLevel<T> {
    Each(Vec<T>),
    All(T),
}

impl<T: Clone> PerLevel<T> {
    pub fn get(&self, i: usize) -> Option<T> {
        match self {
            PerLevel::Each(v) => v.get(i).cloned(),
            PerLevel::All(x) => Some(x.clone()),
        }
    }
}

impl<T: Default> Default for PerLevel<T> {
    fn default() -> Self {
        PerLevel::All(T::default())
    }
}

/// `MLP(dims)`: Linear/ReLU pairs, no activation after the last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MlpConfig {
    pub dims: Vec<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemapOutput {
    Linear,
    Sinh,
    Exp,
    SinhExp,
}

/// The DINOv2 variants MoGe uses (`moge/model/dinov2/hub/backbones.py`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackboneSpec {
    pub embed_dim: usize,
    pub depth: usize,
    pub num_heads: usize,
    pub ffn: Ffn,
}

/// A block's feed-forward layer (`ffn_layer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ffn {
    /// `Mlp`: fc1 (4·D), GELU, fc2.
    Mlp,
    /// `SwiGLUFFNFused` (ViT-g): w12 (2·hidden), SiLU(first half) · second half, w3; hidden =
    /// ⌊8·D/3⌋ rounded up to a multiple of 8 (`layers/swiglu_ffn.py`).
    SwiGlu,
}

impl Ffn {
    /// The hidden width for a backbone of width `dim`.
    pub fn hidden(self, dim: usize) -> usize {
        match self {
            Ffn::Mlp => 4 * dim,
            Ffn::SwiGlu => (4 * dim * 2 / 3).div_ceil(8) * 8,
        }
    }
}

impl BackboneSpec {
    /// Published backbones have fixed shapes. `dinov2_vitt14` is the project's own tiny test
    /// backbone (made by `tests/make_fixtures.py`): its width and depth come from the
    /// checkpoint, with DINOv2's head width of 64.
    /// `dinov2_vitg14` (MoGe-3 ViT-g) has SwiGLU blocks; `dinov2_vitt14_swiglu` is the tiny test
    /// backbone with them (`tests/make_moge3_fixtures.py`).
    pub fn from_name(name: &str, embed_dim_in_ckpt: usize, depth_in_ckpt: usize) -> Result<Self, String> {
        let fixed = match name {
            "dinov2_vits14" => Some((384, 12, 6, Ffn::Mlp)),
            "dinov2_vitb14" => Some((768, 12, 12, Ffn::Mlp)),
            "dinov2_vitl14" => Some((1024, 24, 16, Ffn::Mlp)),
            "dinov2_vitg14" => Some((1536, 40, 24, Ffn::SwiGlu)),
            "dinov2_vitt14" | "dinov2_vitt14_swiglu" => None,
            other => return Err(format!("unsupported backbone '{other}' (expected dinov2_vits14, dinov2_vitb14, dinov2_vitl14 or dinov2_vitg14)")),
        };
        let spec = match fixed {
            Some((embed_dim, depth, num_heads, ffn)) => BackboneSpec { embed_dim, depth, num_heads, ffn },
            None => {
                if embed_dim_in_ckpt == 0 || !embed_dim_in_ckpt.is_multiple_of(64) {
                    return Err(format!("backbone width {embed_dim_in_ckpt} is not a multiple of 64"));
                }
                let ffn = if name.ends_with("_swiglu") { Ffn::SwiGlu } else { Ffn::Mlp };
                BackboneSpec { embed_dim: embed_dim_in_ckpt, depth: depth_in_ckpt, num_heads: embed_dim_in_ckpt / 64, ffn }
            }
        };
        Ok(spec)
    }
}

impl ConvStackConfig {
    pub fn levels(&self) -> usize {
        self.dim_res_blocks.len()
    }
}
