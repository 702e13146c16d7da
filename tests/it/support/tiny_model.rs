//! A tiny MoGe-2 checkpoint for tests that run the `moge` binary: a DINOv2 ViT/14 of width
//! 64 and depth 2 (`dinov2_vitt14`), the MoGe-2 neck and heads at small widths, random
//! weights from a fixed seed, written as safetensors + JSON config (what `--weights` reads).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use moge::model::checkpoint::{write_safetensors, Checkpoint};
use moge::model::config::{ConvStackConfig, ModelConfig};
use serde_json::json;

use super::rng::Rng;

/// Options of the test model.
#[derive(Clone, Copy)]
pub struct TinySpec {
    pub normal: bool,
    /// Bias of the mask head's last layer: +10 makes (almost) every pixel valid, 0 about half.
    pub mask_bias: f32,
    pub seed: u64,
}

impl Default for TinySpec {
    fn default() -> Self {
        Self { normal: true, mask_bias: 10.0, seed: 1 }
    }
}

const E: usize = 64;
const DEPTH: usize = 2;

pub fn config(spec: &TinySpec) -> ModelConfig {
    let head = |c: usize| {
        json!({
            "dim_in": [64, 16, 16, 8, 8], "dim_res_blocks": [64, 16, 16, 8, 8], "dim_out": [null, null, null, null, c],
            "resamplers": ["conv_transpose", "conv_transpose", "conv_transpose", "bilinear"],
            "num_res_blocks": [0, 1, 1, 1, 0], "res_block_in_norm": "none", "res_block_hidden_norm": "none",
            "dim_times_res_block_hidden": 1, "activation": "relu"
        })
    };
    let mut neck = head(0);
    neck["dim_in"] = json!([66, 2, 2, 2, 2]);
    neck["dim_out"] = json!(null);
    let mut cfg = json!({
        "encoder": {"backbone": "dinov2_vitt14", "intermediate_layers": [0, 1], "dim_out": 64},
        "neck": neck,
        "points_head": head(3),
        "mask_head": head(1),
        "scale_head": {"dims": [64, 64, 64, 1]},
        "remap_output": "exp",
        "num_tokens_range": [1200, 3600]
    });
    if spec.normal {
        cfg["normal_head"] = head(3);
    }
    serde_json::from_value(cfg).expect("a valid model_config")
}

/// key → shape for every tensor the architecture binds (mirrors the loaders in src/model).
pub fn shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let mut v: Vec<(String, Vec<usize>)> = Vec::new();
    let mut add = |k: String, s: &[usize]| v.push((k, s.to_vec()));
    add("encoder.image_mean".into(), &[1, 3, 1, 1]);
    add("encoder.image_std".into(), &[1, 3, 1, 1]);
    let b = "encoder.backbone";
    add(format!("{b}.patch_embed.proj.weight"), &[E, 3, 14, 14]);
    add(format!("{b}.patch_embed.proj.bias"), &[E]);
    add(format!("{b}.cls_token"), &[1, 1, E]);
    add(format!("{b}.pos_embed"), &[1, 1 + 37 * 37, E]);
    add(format!("{b}.mask_token"), &[1, E]);
    for i in 0..DEPTH {
        let p = format!("{b}.blocks.{i}");
        for n in ["norm1", "norm2"] {
            add(format!("{p}.{n}.weight"), &[E]);
            add(format!("{p}.{n}.bias"), &[E]);
        }
        add(format!("{p}.attn.qkv.weight"), &[3 * E, E]);
        add(format!("{p}.attn.qkv.bias"), &[3 * E]);
        add(format!("{p}.attn.proj.weight"), &[E, E]);
        add(format!("{p}.attn.proj.bias"), &[E]);
        add(format!("{p}.ls1.gamma"), &[E]);
        add(format!("{p}.ls2.gamma"), &[E]);
        add(format!("{p}.mlp.fc1.weight"), &[4 * E, E]);
        add(format!("{p}.mlp.fc1.bias"), &[4 * E]);
        add(format!("{p}.mlp.fc2.weight"), &[E, 4 * E]);
        add(format!("{p}.mlp.fc2.bias"), &[E]);
    }
    add(format!("{b}.norm.weight"), &[E]);
    add(format!("{b}.norm.bias"), &[E]);
    for k in 0..2 {
        add(format!("encoder.output_projections.{k}.weight"), &[cfg.encoder.dim_out, E, 1, 1]);
        add(format!("encoder.output_projections.{k}.bias"), &[cfg.encoder.dim_out]);
    }
    let mut stack = |p: &str, c: &ConvStackConfig| {
        let dims = &c.dim_res_blocks;
        let n = dims.len();
        for i in 0..n {
            if let Some(cin) = c.dim_in.get(i).flatten() {
                add(format!("{p}.input_blocks.{i}.weight"), &[dims[i], cin, 1, 1]);
                add(format!("{p}.input_blocks.{i}.bias"), &[dims[i]]);
            }
            for j in 0..c.num_res_blocks.get(i).unwrap_or(0) {
                let h = c.dim_times_res_block_hidden * dims[i];
                add(format!("{p}.res_blocks.{i}.{j}.layers.2.weight"), &[h, dims[i], 3, 3]);
                add(format!("{p}.res_blocks.{i}.{j}.layers.2.bias"), &[h]);
                add(format!("{p}.res_blocks.{i}.{j}.layers.5.weight"), &[dims[i], h, 3, 3]);
                add(format!("{p}.res_blocks.{i}.{j}.layers.5.bias"), &[dims[i]]);
            }
            if let Some(cout) = c.dim_out.get(i).flatten() {
                add(format!("{p}.output_blocks.{i}.weight"), &[cout, dims[i], 1, 1]);
                add(format!("{p}.output_blocks.{i}.bias"), &[cout]);
            }
            if i + 1 < n {
                let (ci, co) = (dims[i], dims[i + 1]);
                if c.resamplers.get(i).unwrap_or_default() == "conv_transpose" {
                    add(format!("{p}.resamplers.{i}.0.weight"), &[ci, co, 2, 2]);
                    add(format!("{p}.resamplers.{i}.0.bias"), &[co]);
                    add(format!("{p}.resamplers.{i}.1.weight"), &[co, co, 3, 3]);
                } else {
                    add(format!("{p}.resamplers.{i}.1.weight"), &[co, ci, 3, 3]);
                }
                add(format!("{p}.resamplers.{i}.1.bias"), &[co]);
            }
        }
    };
    stack("neck", &cfg.neck);
    for (name, h) in [("points_head", &cfg.points_head), ("normal_head", &cfg.normal_head), ("mask_head", &cfg.mask_head)] {
        if let Some(h) = h {
            stack(name, h);
        }
    }
    if let Some(s) = &cfg.scale_head {
        for (i, d) in s.dims.windows(2).enumerate() {
            add(format!("scale_head.{}.weight", 2 * i), &[d[1], d[0]]);
            add(format!("scale_head.{}.bias", 2 * i), &[d[1]]);
        }
    }
    v
}

/// Writes `dir/<name>.safetensors` and `dir/<name>.json`; returns the safetensors path.
pub fn write_tiny(dir: &Path, name: &str, spec: TinySpec) -> PathBuf {
    let cfg = config(&spec);
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15 ^ spec.seed.wrapping_mul(0x1234_5678_9ABC_DEF1) | 1);
    let mut tensors = HashMap::new();
    for (key, shape) in shapes(&cfg) {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = match key.as_str() {
            "encoder.image_mean" => vec![0.485, 0.456, 0.406],
            "encoder.image_std" => vec![0.229, 0.224, 0.225],
            "mask_head.output_blocks.4.bias" => vec![spec.mask_bias],
            k if k.ends_with("mask_token") => vec![0.0; n],
            k if k.ends_with(".weight") && shape.len() >= 2 => {
                let a = (3.0 / shape[1..].iter().product::<usize>() as f32).sqrt();
                (0..n).map(|_| rng.unit() * a).collect()
            }
            k if k.ends_with(".weight") => (0..n).map(|_| 1.0 + 0.1 * rng.unit()).collect(),
            k if k.ends_with("cls_token") || k.ends_with("pos_embed") => (0..n).map(|_| 0.5 * rng.unit()).collect(),
            _ => (0..n).map(|_| 0.1 * rng.unit()).collect(),
        };
        tensors.insert(key, Tensor::from_vec(values, shape, &Device::Cpu).unwrap());
    }
    let path = dir.join(format!("{name}.safetensors"));
    write_safetensors(&Checkpoint { path: path.clone(), config: cfg, tensors }, &path).expect("write the tiny checkpoint");
    // The checkpoint must load: a wrong key or shape shows here, not as a CLI failure.
    moge::Model::load(&path, &moge::model::BuildOptions::default()).expect("the tiny checkpoint loads");
    path
}
