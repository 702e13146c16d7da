//! A full-size checkpoint with the tests' synthetic weights, for benchmarks on a machine without
//! PyTorch: the published architecture of a variant (`tests/fixtures/fullsize/configs.json`)
//! with the weights that `tests/synth_weights.py` makes (seed 7, shaped), as `.safetensors` with
//! its JSON config beside it.
//!
//! `moge3-vitl` is MoGe-3's ViT-L: vitl-normal's network and the released refiner's architecture
//! (channels 32..512), its `out_proj` scaled by 0.01 so that each step corrects log-depth by a
//! few bins, as a trained refiner does, and the voxels keep a surface's neighbourhoods.
//! `moge3-vitg` is the same with the DINOv2 ViT-g/14 encoder (1536 wide, 40 SwiGLU blocks). Its
//! released config is not known here: its intermediate layers are taken as [9, 19, 29, 39] (ViT-L's
//! [5, 11, 17, 23] spaced over 40 blocks), the scale head's input 1536 (the class token's width)
//! and the rest as ViT-L's (`dim_out` 1024, the refiner's encoder_channels 1026): enough to
//! measure its cost and memory, not its numbers.
//!
//! ```text
//! cargo run --profile ci --example synth_checkpoint -- vits-normal /tmp/vits.safetensors
//! moge bench --weights /tmp/vits.safetensors --precision f32
//! ```

#[path = "../tests/it/support/synth.rs"]
mod synth;

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(variant), Some(out)) = (args.next(), args.next().map(PathBuf::from)) else {
        anyhow::bail!("usage: synth_checkpoint VARIANT OUT.safetensors (VARIANT: vits-normal, vitb-normal, vitl-normal, vitl, moge3-vitl, moge3-vitg)");
    };
    let configs = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fullsize/configs.json");
    let configs: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(configs)?)?;
    let moge3 = variant.starts_with("moge3-");
    let mut config = configs.get(if moge3 { "vitl-normal" } else { &variant }).ok_or_else(|| anyhow::anyhow!("no variant {variant} in {configs}"))?.clone();
    if moge3 {
        // v3's config: no remap_output (it is exp), the refiner of `Ruicheng/moge-3-vitl`.
        let c = config.as_object_mut().expect("a config is an object");
        c.remove("remap_output");
        c.insert(
            "refiner".into(),
            serde_json::json!({"in_channels": 3, "out_channels": 1, "encoder_channels": 1026, "model_channels": [32, 64, 128, 256, 512],
                               "encoder_blocks_per_level": 1, "decoder_blocks_per_level": 1, "bottleneck_blocks": 1,
                               "downsample_factors": [2, 2, 2, 2], "encoder_downsample": 16}),
        );
        c.insert("refiner_depth_resolution".into(), 256.into());
        match variant.as_str() {
            "moge3-vitl" => {}
            "moge3-vitg" => {
                c["encoder"]["backbone"] = "dinov2_vitg14".into();
                c["encoder"]["intermediate_layers"] = serde_json::json!([9, 19, 29, 39]);
                // The scale head reads the class token, 1536 wide.
                c["scale_head"]["dims"][0] = 1536.into();
            }
            other => anyhow::bail!("no MoGe-3 variant {other} (moge3-vitl, moge3-vitg)"),
        }
    }
    let shapes = moge::Model::state_dict_shapes(&serde_json::from_value(config.clone())?)?;
    let mut sd = synth::synth_state_dict(&shapes, 7, true);
    if let Some((_, w)) = sd.get_mut("refiner.out_proj.weight") {
        w.iter_mut().for_each(|v| *v *= 0.01);
    }
    let config = &config;
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> =
        sd.into_iter().map(|(k, (shape, v))| (k, shape, v.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = bytes
        .iter()
        .map(|(k, shape, b)| Ok((k.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), b)?)))
        .collect::<anyhow::Result<_>>()?;
    safetensors::serialize_to_file(views, None, &out)?;
    std::fs::write(out.with_extension("json"), serde_json::to_string_pretty(config)?)?;
    println!("{}: {variant}, {} tensors", out.display(), bytes.len());
    Ok(())
}
