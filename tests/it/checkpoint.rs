//! Checkpoint reading: both formats, strict key checks, and clear errors on bad files.
use std::collections::HashMap;

use moge::model::checkpoint::{write_safetensors, Checkpoint};
use moge::model::BuildOptions;
use moge::{InferOptions, Model};

use crate::support::paths::{corpus, fixtures};
use crate::support::torch_zip::{archive, entries_of, Entry, Pickle};

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
        let again = Checkpoint::read(&tiny()).unwrap();
        let m = Model::build(again.config, again.tensors, &BuildOptions::default()).unwrap();
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
    let a = Model::load(&tiny(), &BuildOptions::default()).unwrap();
    let b = Model::load(&st, &BuildOptions::default()).unwrap();
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
    let msg = err_text(Model::load(&st, &BuildOptions::default()));
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
    let msg = err_text(Model::load(&st, &BuildOptions::default()));
    assert!(msg.contains("shape mismatches (1)") && msg.contains("neck.input_blocks.0.bias: checkpoint [7], model [96]"), "{msg}");
}

/// A scale head whose config and weights agree with each other but not with the backbone's class
/// token is refused at load, by name, not at the first image.
#[test]
fn a_scale_head_narrower_than_the_class_token_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let mut ck = Checkpoint::read(&tiny()).unwrap();
    let width = *ck.tensors["encoder.backbone.cls_token"].dims().last().unwrap();
    let sh = ck.config.scale_head.as_mut().unwrap();
    sh.dims[0] = width + 8;
    let out = ck.tensors["scale_head.0.weight"].dims()[0];
    ck.tensors.insert("scale_head.0.weight".into(), candle_core::Tensor::zeros((out, width + 8), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap());
    let st = dir.path().join("narrow.safetensors");
    write_safetensors(&ck, &st).unwrap();
    let msg = err_text(Model::load(&st, &BuildOptions::default()));
    assert!(
        msg.contains("narrow.safetensors") && msg.contains(&format!("scale_head.dims starts at {}", width + 8)) && msg.contains(&format!("{width} wide")),
        "{msg}"
    );
}

#[test]
fn published_backbone_with_wrong_depth_is_refused() {
    // A checkpoint claiming ViT-S but carrying 3 tiny blocks must not load.
    let dir = tempfile::tempdir().unwrap();
    let mut ck = Checkpoint::read(&tiny()).unwrap();
    ck.config.encoder.backbone = "dinov2_vits14".into();
    let st = dir.path().join("liar.safetensors");
    write_safetensors(&ck, &st).unwrap();
    let msg = err_text(Model::load(&st, &BuildOptions::default()));
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
        let msg = err_text(Model::load(&p, &BuildOptions::default()));
        assert!(msg.contains(name), "{name}: {msg}");
        assert!(msg.contains(reason), "{name}: {msg}");
    }
    let msg = err_text(Model::load(&dir.path().join("absent.pt"), &BuildOptions::default()));
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
    let msg = err_text(Model::load(&p, &BuildOptions::default()));
    assert!(msg.contains("other.zip") && msg.contains("no data.pkl"), "{msg}");
}

fn pickle_of(path: &std::path::Path) -> Vec<u8> {
    let mut z = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    let name = z.file_names().filter_map(|n| n.ok().map(|n| n.into_owned())).find(|n| n.ends_with("data.pkl")).unwrap();
    let mut v = Vec::new();
    std::io::Read::read_to_end(&mut z.by_name(&name).unwrap(), &mut v).unwrap();
    v
}

fn bits(t: &candle_core::Tensor) -> Vec<u32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn state_dict_checkpoints_as_training_code_saves_them() {
    // tests/make_fixtures.py saved these from model.state_dict(): an OrderedDict whose
    // `_metadata` attribute is pickled as the dict's state.
    for name in ["tiny_vitl.pt", "random_normal.pt", "tiny_normal_f16.pt", "tiny_normal_bf16.pt"] {
        let pkl = pickle_of(&fixtures().join(name));
        assert!(pkl.windows(9).any(|w| w == b"_metadata"), "{name} is not a state_dict() pickle");
        let ck = Checkpoint::read(&fixtures().join(name)).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert!(!ck.tensors.contains_key("_metadata"), "{name}");
        let n = ck.tensors.len();
        let m = Model::build(ck.config, ck.tensors, &BuildOptions::default()).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert!(n > 100 && m.has_normal() != name.starts_with("tiny_vitl"), "{name}");
    }
    assert!(!pickle_of(&tiny()).windows(9).any(|w| w == b"_metadata"), "tiny_normal.pt stays a plain dict");
}

#[test]
fn float16_and_bfloat16_weights_are_the_fp32_weights_rounded() {
    let full = Checkpoint::read(&tiny()).unwrap();
    for (name, dtype) in [("tiny_normal_f16.pt", candle_core::DType::F16), ("tiny_normal_bf16.pt", candle_core::DType::BF16)] {
        let ck = Checkpoint::read(&fixtures().join(name)).unwrap();
        assert_eq!(ck.tensors.len(), full.tensors.len(), "{name}");
        let mut changed = 0;
        for (k, t) in &full.tensors {
            let rounded = t.to_dtype(dtype).unwrap().to_dtype(candle_core::DType::F32).unwrap();
            assert_eq!(bits(&ck.tensors[k]), bits(&rounded), "{name}: {k}");
            changed += (bits(&rounded) != bits(t)) as usize;
        }
        assert!(changed > full.tensors.len() / 2, "{name}: the weights were really rounded");
    }
}

#[test]
fn safetensors_in_float16_load_widened() {
    let dir = tempfile::tempdir().unwrap();
    let full = Checkpoint::read(&tiny()).unwrap();
    let half: HashMap<String, candle_core::Tensor> = full.tensors.iter().map(|(k, t)| (k.clone(), t.to_dtype(candle_core::DType::F16).unwrap())).collect();
    let st = dir.path().join("half.safetensors");
    candle_core::safetensors::save(&half, &st).unwrap();
    std::fs::write(dir.path().join("half.json"), serde_json::to_string(&full.config).unwrap()).unwrap();
    let ck = Checkpoint::read(&st).unwrap();
    for (k, t) in &half {
        assert_eq!(bits(&ck.tensors[k]), bits(&t.to_dtype(candle_core::DType::F32).unwrap()), "{k}");
    }
}

fn tiny_config_json() -> serde_json::Value {
    serde_json::to_value(&Checkpoint::read(&tiny()).unwrap().config).unwrap()
}

#[test]
fn written_archives_load_like_the_fixture() {
    // The test writer (support/torch_zip.rs) makes archives the loader reads as torch's.
    let dir = tempfile::tempdir().unwrap();
    let ck = Checkpoint::read(&tiny()).unwrap();
    for ordered in [false, true] {
        let p = dir.path().join(format!("w{ordered}.pt"));
        std::fs::write(&p, archive(Some(&tiny_config_json()), &entries_of(&ck), ordered)).unwrap();
        let back = Checkpoint::read(&p).unwrap();
        assert_eq!(back.tensors.len(), ck.tensors.len());
        for (k, t) in &ck.tensors {
            assert_eq!(bits(&back.tensors[k]), bits(t), "{k}");
        }
    }
}

#[test]
fn non_tensor_entries_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let ck = Checkpoint::read(&tiny()).unwrap();
    let mut entries = entries_of(&ck);
    entries.insert(3, ("global_step".into(), Entry::Int(1200)));
    let p = dir.path().join("extra.pt");
    std::fs::write(&p, archive(Some(&tiny_config_json()), &entries, true)).unwrap();
    let msg = err_text(Model::load(&p, &BuildOptions::default()));
    assert!(msg.contains("extra.pt") && msg.contains("global_step: not a tensor (a int)"), "{msg}");

    let mut entries = entries_of(&ck);
    entries.push(("notes".into(), Entry::Str("hello".into())));
    std::fs::write(&p, archive(Some(&tiny_config_json()), &entries, false)).unwrap();
    let msg = err_text(Model::load(&p, &BuildOptions::default()));
    assert!(msg.contains("notes: not a tensor (a str)"), "{msg}");
}

#[test]
fn a_bare_state_dict_is_told_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let ck = Checkpoint::read(&tiny()).unwrap();
    // torch.save(model.state_dict(), path): the tensors sit at the top, no model_config.
    let mut p = Pickle::new();
    p.0.extend_from_slice(b"}(");
    for (i, (k, t)) in ck.tensors.iter().take(2).enumerate() {
        p.str(k);
        p.tensor("FloatStorage", &i.to_string(), t.dims());
    }
    p.0.extend_from_slice(b"u.");
    let path = dir.path().join("bare.pt");
    {
        let mut z = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        z.start_file::<_, ()>("bare/data.pkl", Default::default()).unwrap();
        std::io::Write::write_all(&mut z, &p.0).unwrap();
        z.finish().unwrap();
    }
    let msg = err_text(Model::load(&path, &BuildOptions::default()));
    assert!(msg.contains("bare.pt") && msg.contains("bare state dict") && msg.contains("model_config"), "{msg}");
}

#[test]
fn a_data_parallel_prefix_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let ck = Checkpoint::read(&tiny()).unwrap();
    let entries: Vec<(String, Entry)> = entries_of(&ck).into_iter().map(|(k, e)| (format!("module.{k}"), e)).collect();
    let p = dir.path().join("ddp.pt");
    std::fs::write(&p, archive(Some(&tiny_config_json()), &entries, true)).unwrap();
    let a = Model::load(&tiny(), &BuildOptions::default()).unwrap();
    let b = Model::load(&p, &BuildOptions::default()).unwrap();
    let img = moge::image_io::load_rgb(&fixtures().join("images/rgb_64x48.png"), true).unwrap();
    let opts = InferOptions { num_tokens: Some(100), ..Default::default() };
    assert_eq!(a.infer(&img, &opts).unwrap().depth, b.infer(&img, &opts).unwrap().depth);
}

fn corpus_pt(name: &str) -> std::path::PathBuf {
    corpus("checkpoint_pt").join(name)
}

#[test]
fn a_state_dict_saved_under_two_keys_is_read_whole_under_both() {
    // torch.save({'ema': sd, 'model': sd}): the second is a memo reference to the first,
    // which the pickle memoized while it was still empty.
    let ck = Checkpoint::read(&corpus_pt("shared_ema.pt")).unwrap();
    let mut keys: Vec<&String> = ck.tensors.keys().collect();
    keys.sort();
    assert_eq!(keys, ["bias", "weight"]);
    assert_eq!(ck.tensors["weight"].dims(), &[3, 4]);
}

#[test]
fn views_that_repeat_storage_are_refused_by_name() {
    let msg = match Checkpoint::read(&corpus_pt("expanded.pt")) {
        Ok(_) => panic!("an expanded view loaded"),
        Err(e) => format!("{e:#}"),
    };
    assert!(msg.contains("expanded.pt") && msg.contains("e: ") && msg.contains("repeat"), "{msg}");
}

#[test]
fn views_and_parameters_are_read_through_their_strides() {
    // views_param.pt: t = base.t(), row = base[1], p = Parameter(base[:2, 1:3]), base 3x5.
    let ck = Checkpoint::read(&corpus_pt("views_param.pt")).unwrap();
    let t = ck.tensors["t"].to_vec2::<f32>().unwrap();
    let row = ck.tensors["row"].to_vec1::<f32>().unwrap();
    let p = ck.tensors["p"].to_vec2::<f32>().unwrap();
    assert_eq!((t.len(), t[0].len()), (5, 3));
    for j in 0..5 {
        assert_eq!(t[j][1], row[j], "t = base.t(), row = base[1]");
    }
    assert_eq!(p, vec![vec![t[1][0], t[2][0]], vec![t[1][1], t[2][1]]]);
}
