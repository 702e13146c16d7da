//! Checkpoint reading: both formats, strict key checks, and clear errors on bad files.
mod support;

use std::collections::HashMap;

use moge::model::checkpoint::{write_safetensors, Checkpoint};
use moge::{Device, InferOptions, Model};
use support::*;

fn tiny() -> std::path::PathBuf {
    fixtures().join("tiny_normal.pt")
}

fn err_text(r: anyhow::Result<Model>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn reads_model_pt_config_and_every_tensor() {
    let ck = Checkpoint::read(&tiny()).unwrap();
    assert_eq!(ck.config.encoder.backbone, "dinov2_vitt14");
    assert_eq!(ck.config.neck.dim_res_blocks, vec![96, 32, 24, 16, 8]);
    assert!(ck.config.normal_head.is_some());
    // Every key the architecture needs, and no other.
    let expected = {
        let m = Model::from_checkpoint(Checkpoint::read(&tiny()).unwrap(), &Device::Cpu).unwrap();
        drop(m);
        ck.tensors.len()
    };
    assert_eq!(expected, ck.tensors.len());
    let cls = ck.tensors["encoder.backbone.cls_token"].dims().to_vec();
    assert_eq!(cls, vec![1, 1, 128]);
}

#[test]
fn safetensors_with_json_config_gives_the_same_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("tiny.safetensors");
    write_safetensors(&Checkpoint::read(&tiny()).unwrap(), &st).unwrap();
    assert!(dir.path().join("tiny.json").is_file());
    let a = Model::load(&tiny(), &Device::Cpu).unwrap();
    let b = Model::load(&st, &Device::Cpu).unwrap();
    let img = moge::image_io::load_rgb(&fixtures().join("images/rgb_64x48.png"), true).unwrap();
    let opts = InferOptions { num_tokens: Some(100), ..Default::default() };
    let (pa, pb) = (a.infer(&img, &opts).unwrap(), b.infer(&img, &opts).unwrap());
    assert_eq!(pa.depth.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), pb.depth.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
}

#[test]
fn missing_and_unexpected_keys_are_all_listed_with_the_file_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut ck = Checkpoint::read(&tiny()).unwrap();
    ck.tensors.remove("neck.res_blocks.1.0.layers.2.weight");
    ck.tensors.remove("points_head.output_blocks.4.bias");
    let extra = ck.tensors["scale_head.0.bias"].clone();
    ck.tensors.insert("scale_head.9.bias".into(), extra);
    let st = dir.path().join("broken.safetensors");
    write_safetensors(&ck, &st).unwrap();
    let msg = err_text(Model::load(&st, &Device::Cpu));
    assert!(msg.contains("broken.safetensors"), "{msg}");
    assert!(msg.contains("missing keys (2)"), "{msg}");
    assert!(msg.contains("neck.res_blocks.1.0.layers.2.weight [32, 32, 3, 3]"), "{msg}");
    assert!(msg.contains("points_head.output_blocks.4.bias"), "{msg}");
    assert!(msg.contains("unexpected keys (1)") && msg.contains("scale_head.9.bias"), "{msg}");
}

#[test]
fn wrong_shapes_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut ck = Checkpoint::read(&tiny()).unwrap();
    let t = candle_core::Tensor::zeros((7,), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
    ck.tensors.insert("neck.input_blocks.0.bias".into(), t);
    let st = dir.path().join("shapes.safetensors");
    write_safetensors(&ck, &st).unwrap();
    let msg = err_text(Model::load(&st, &Device::Cpu));
    assert!(msg.contains("shape mismatches (1)") && msg.contains("neck.input_blocks.0.bias: checkpoint [7], model [96]"), "{msg}");
}

#[test]
fn published_backbone_with_wrong_depth_is_refused() {
    // A checkpoint claiming ViT-S but carrying 3 tiny blocks must not load.
    let dir = tempfile::tempdir().unwrap();
    let mut ck = Checkpoint::read(&tiny()).unwrap();
    ck.config.encoder.backbone = "dinov2_vits14".into();
    let st = dir.path().join("liar.safetensors");
    write_safetensors(&ck, &st).unwrap();
    let msg = err_text(Model::load(&st, &Device::Cpu));
    assert!(msg.contains("liar.safetensors") && msg.contains("missing keys") && msg.contains("shape mismatches"), "{msg}");
}

#[test]
fn bad_files_get_a_clear_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(tiny()).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty.pt", vec![], "not a checkpoint"),
        ("text.pt", b"hello, I am not a model\n".to_vec(), "not a checkpoint"),
        ("truncated.pt", bytes[..bytes.len() / 2].to_vec(), "damaged or truncated"),
        ("head_only.pt", bytes[..64].to_vec(), "damaged or truncated"),
    ];
    for (name, data, reason) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        let msg = err_text(Model::load(&p, &Device::Cpu));
        assert!(msg.contains(name), "{name}: {msg}");
        assert!(msg.contains(reason), "{name}: {msg}");
    }
    let msg = err_text(Model::load(&dir.path().join("absent.pt"), &Device::Cpu));
    assert!(msg.contains("absent.pt") && msg.contains("cannot open"), "{msg}");
    // A zip that is not a torch archive.
    let p = dir.path().join("other.zip");
    {
        let f = std::fs::File::create(&p).unwrap();
        let mut z = zip::ZipWriter::new(f);
        z.start_file::<_, ()>("readme.txt", Default::default()).unwrap();
        std::io::Write::write_all(&mut z, b"hi").unwrap();
        z.finish().unwrap();
    }
    let msg = err_text(Model::load(&p, &Device::Cpu));
    assert!(msg.contains("other.zip") && msg.contains("no data.pkl"), "{msg}");
    let _ = HashMap::<u8, u8>::new();
}
