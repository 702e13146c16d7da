//! Int8 checkpoints (`moge quantize`), about a quarter of the f32 size: every weight of a
//! product (the linears and convolutions, 2-D and up, named `*.weight`) stored as int8 per
//! index of its first dimension (the output channel; the input channel of a transposed
//! convolution's weight), the rest (norms, biases, embeddings) in f32. The file is safetensors:
//! `<key>` as I8 in its own shape beside `<key>_scale` as F32 (first dimension), `<key>` ≈
//! q · scale. Reading one ([`dequantise`]) gives back q · scale in f32. What `--precision int8`
//! runs in int8 with the weight as stored (the ViT's linears, the decoder's 3x3 and 1x1
//! convolutions, MoGe-3's sparse convolutions) quantises again to the same q (a channel's largest |q| is 127, so its scale
//! comes back): the same numbers as quantising the f32 checkpoint at load. The transposed and
//! upsampling convolutions run in int8 on weights rearranged per output phase, quantised again
//! from the dequantised ones; every other layer runs in f32 on its dequantised weights, within
//! half a step of the original's.

use std::collections::HashMap;

use anyhow::{anyhow, bail, Result};
use candle_core::{DType, Device, Tensor};

use super::cpu::matmul::int8::quantise_weights;
use super::dinov2::INT8_LINEARS;

/// What names a weight's scales: `<key>_scale`.
pub const SCALE_SUFFIX: &str = "_scale";

/// Whether `key` is a weight that `--precision int8` runs as int8 products quantised as stored
/// (per index of its first dimension): a linear of a ViT block ([`INT8_LINEARS`]), or one of
/// MoGe-3's sparse convolutions (`refiner.….conv1.weight`, `conv2`).
pub fn is_int8_weight(key: &str) -> bool {
    let Some(stem) = key.strip_suffix(".weight") else { return false };
    (key.contains(".blocks.") && INT8_LINEARS.iter().any(|l| stem.ends_with(&format!(".{l}"))))
        || (key.starts_with("refiner.") && (stem.ends_with(".conv1") || stem.ends_with(".conv2")))
}

/// Whether an int8 checkpoint stores `key` of shape `dims` as int8: a product's weight of 2-D or
/// more with at least a thousand values (a norm's weight is 1-D; the few tiny ones are not worth
/// their scales).
pub fn stored_as_int8(key: &str, dims: &[usize]) -> bool {
    key.ends_with(".weight") && dims.len() >= 2 && dims.iter().product::<usize>() >= 1024
}

/// What [`int8_safetensors`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Weights stored as int8.
    pub int8_tensors: usize,
    /// Tensors kept in f32.
    pub f32_tensors: usize,
    /// Bytes of the tensors in f32, and in the file.
    pub f32_bytes: u64,
    pub bytes: u64,
}

/// A checkpoint's state dict `tensors` as an int8 safetensors file (its bytes), and what it
/// holds.
pub fn int8_safetensors(tensors: &HashMap<String, Tensor>) -> Result<(Vec<u8>, Summary)> {
    let mut keys: Vec<&String> = tensors.keys().collect();
    keys.sort();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut summary = Summary { int8_tensors: 0, f32_tensors: 0, f32_bytes: 0, bytes: 0 };
    for key in keys {
        let t = &tensors[key];
        let values: Vec<f32> = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        summary.f32_bytes += 4 * values.len() as u64;
        match t.dims() {
            dims if stored_as_int8(key, dims) => {
                let (n, k) = (dims[0], dims[1..].iter().product());
                let (scale, q) = quantise_weights(&values, n, k);
                owned.push((key.clone(), safetensors::Dtype::I8, dims.to_vec(), q.iter().map(|&v| v as u8).collect()));
                owned.push((format!("{key}{SCALE_SUFFIX}"), safetensors::Dtype::F32, vec![n], scale.iter().flat_map(|s| s.to_le_bytes()).collect()));
                summary.int8_tensors += 1;
            }
            dims => {
                owned.push((key.clone(), safetensors::Dtype::F32, dims.to_vec(), values.iter().flat_map(|s| s.to_le_bytes()).collect()));
                summary.f32_tensors += 1;
            }
        }
    }
    if !tensors.keys().any(|k| k.contains(".blocks.") && is_int8_weight(k)) {
        bail!("no ViT block linears (blocks.N.{{{}}}.weight) in the checkpoint: not a MoGe-2 model to quantise", INT8_LINEARS.join(","));
    }
    let views = owned
        .iter()
        .map(|(k, dtype, shape, bytes)| Ok((k.as_str(), safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes)?)))
        .collect::<std::result::Result<Vec<_>, safetensors::SafeTensorError>>()
        .map_err(|e| anyhow!("{e}"))?;
    let meta = HashMap::from([("moge.format".to_owned(), format!("int8 per output channel: <key> I8, <key>{SCALE_SUFFIX} F32 (its first dimension)"))]);
    let bytes = safetensors::serialize(views, Some(meta)).map_err(|e| anyhow!("{e}"))?;
    summary.bytes = bytes.len() as u64;
    Ok((bytes, summary))
}

/// The f32 tensor `q · scale` (scale per index of the first dimension) of an int8 weight read
/// from a file.
pub fn dequantise(name: &str, q: &[u8], shape: &[usize], scale: Option<(&[u8], &[usize])>) -> Result<Tensor> {
    let Some((scale, scale_shape)) = scale else { bail!("{name}: an int8 tensor needs its scales as {name}{SCALE_SUFFIX} (F32)") };
    let Some((&n, rest)) = shape.split_first().filter(|(_, rest)| !rest.is_empty()) else {
        bail!("{name}: an int8 tensor must have 2 dimensions or more, not {shape:?}")
    };
    let k: usize = rest.iter().product();
    if scale_shape != [n] || scale.len() != 4 * n || q.len() != n * k {
        bail!("{name}{SCALE_SUFFIX}: expected {n} scales for a weight of {shape:?}, found shape {scale_shape:?}");
    }
    let scale: Vec<f32> = scale.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let w: Vec<f32> = q.iter().enumerate().map(|(e, &v)| v as i8 as f32 * scale[e / k.max(1)]).collect();
    Ok(Tensor::from_vec(w, shape, &Device::Cpu)?)
}
