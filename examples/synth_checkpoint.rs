//! A full-size checkpoint with the tests' synthetic weights, for benchmarks on a machine without
//! PyTorch: the published architecture of a variant (`tests/fixtures/fullsize/configs.json`)
//! with the weights that `tests/synth_weights.py` makes (seed 7, shaped), as `.safetensors` with
//! its JSON config beside it.
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
        anyhow::bail!("usage: synth_checkpoint VARIANT OUT.safetensors (VARIANT: vits-normal, vitb-normal, vitl-normal, vitl)");
    };
    let configs = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fullsize/configs.json");
    let configs: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(configs)?)?;
    let config = configs.get(&variant).ok_or_else(|| anyhow::anyhow!("no variant {variant} in {configs}"))?;
    let shapes = moge::Model::state_dict_shapes(&serde_json::from_value(config.clone())?)?;
    let sd = synth::synth_state_dict(&shapes, 7, true);
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
