//! `moge quantize`: the int8 checkpoint of the fixture model (upstream's `model.pt` from
//! `state_dict()`) holds every product weight as int8 with its scales and the rest in f32, in
//! well under half the size; read back, the ViT's linears quantise to the same int8 values as
//! the original's (so `--precision int8` runs the same linears), and the model from it keeps the
//! int8 gates against upstream fp32. Wrong outputs and damaged files are refused by name,
//! leaving nothing behind.

use std::collections::HashMap;

use moge::model::checkpoint::Checkpoint;
use moge::model::cpu::matmul::int8::quantise_weights;
use moge::model::quantize::{is_int8_weight, stored_as_int8, SCALE_SUFFIX};
use moge::model::Precision;
use moge::{InferOptions, Model};

use crate::support::cli::run;
use crate::support::npz::Npz;
use crate::support::paths::fixtures;
use crate::support::reference::{check_against_reference, fixture_case, Gates};

fn quantize(out: &std::path::Path) -> std::process::Output {
    let weights = fixtures().join("tiny_normal.pt");
    run(&["quantize", "--weights", weights.to_str().unwrap(), "-o", out.to_str().unwrap()])
}

#[test]
fn the_int8_checkpoint_holds_int8_weights_and_runs_within_the_gates() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny-int8.safetensors");
    let o = quantize(&out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("weights in int8") && said.contains("tiny-int8.safetensors"), "{said}");
    assert!(dir.path().join("tiny-int8.json").is_file());

    let original = Checkpoint::read(&fixtures().join("tiny_normal.pt")).unwrap();
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let stored: HashMap<String, safetensors::tensor::TensorView> = st.tensors().into_iter().collect();
    let (mut int8, mut f32_bytes) = (0, 0usize);
    for (key, t) in &original.tensors {
        let dims = t.dims();
        f32_bytes += 4 * t.elem_count();
        let v = &stored[key];
        if stored_as_int8(key, dims) {
            int8 += 1;
            assert_eq!((v.dtype(), v.shape()), (safetensors::Dtype::I8, dims), "{key}");
            let s = &stored[&format!("{key}{SCALE_SUFFIX}")];
            assert_eq!((s.dtype(), s.shape()), (safetensors::Dtype::F32, &dims[..1]), "{key}");
        } else {
            assert_eq!((v.dtype(), v.shape()), (safetensors::Dtype::F32, dims), "{key}");
        }
    }
    assert!(original.tensors.keys().filter(|k| is_int8_weight(k)).count() >= 4 && int8 > 4);
    assert_eq!(stored.len(), original.tensors.len() + int8, "one scale per int8 weight, nothing else");
    assert!(bytes.len() < f32_bytes / 2, "{} bytes against {f32_bytes} in f32", bytes.len());

    // Read back: each weight within half a step of the original; the linears that int8 runs
    // quantise to the very same values.
    let back = Checkpoint::read(&out).unwrap();
    assert_eq!(back.tensors.len(), original.tensors.len());
    for (key, t) in &original.tensors {
        let (a, b): (Vec<f32>, Vec<f32>) = (t.flatten_all().unwrap().to_vec1().unwrap(), back.tensors[key].flatten_all().unwrap().to_vec1().unwrap());
        assert_eq!(back.tensors[key].dims(), t.dims(), "{key}");
        if !stored_as_int8(key, t.dims()) {
            assert_eq!(a, b, "{key}");
            continue;
        }
        let (n, k) = (t.dims()[0], t.elem_count() / t.dims()[0]);
        let (s, q) = quantise_weights(&a, n, k);
        for (e, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!((x - y).abs() <= 0.5001 * s[e / k], "{key}[{e}]: {x} read back as {y}");
        }
        if is_int8_weight(key) {
            assert_eq!(quantise_weights(&b, n, k).1, q, "{key}");
        }
    }

    // The model from it, against upstream fp32, with the int8 gates.
    let (c, opts) = fixture_case("n_rgb_1200");
    assert_eq!(c["checkpoint"].as_str(), Some("tiny_normal.pt"));
    let model = Model::load(&out, &moge::model::BuildOptions::new(&moge::Device::Cpu, Precision::Int8).unwrap()).unwrap();
    let mut z = Npz::open(&fixtures().join("cases/n_rgb_1200.npz"));
    let img = moge::image_io::load_rgb(&fixtures().join(c["image"].as_str().unwrap()), true).unwrap();
    let gates = Gates { pcc: 0.999, depth_max_rel: 0.05, mask_agreement: 0.995, scalar_rel: 0.02, fwd_tol: None };
    check_against_reference("int8 checkpoint", &model, &mut z, &img, &opts, true, &gates);
    // And it runs in f32 too, on the dequantised weights.
    let f32 =
        Model::load(&out, &moge::model::BuildOptions::new(&moge::Device::Cpu, Precision::F32).unwrap()).unwrap().infer(&img, &InferOptions::default()).unwrap();
    assert!(f32.depth.iter().any(|d| d.is_finite()));
}

#[test]
fn wrong_outputs_and_damaged_int8_files_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    // Not a .safetensors name.
    let o = quantize(&dir.path().join("tiny.pt"));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("tiny.pt: the int8 checkpoint is a .safetensors file"), "{}", String::from_utf8_lossy(&o.stderr));
    // Not a checkpoint.
    let junk = dir.path().join("junk.pt");
    std::fs::write(&junk, b"not a checkpoint at all").unwrap();
    let o = run(&["quantize", "--weights", junk.to_str().unwrap(), "-o", dir.path().join("j.safetensors").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("junk.pt"), "{}", String::from_utf8_lossy(&o.stderr));
    // A folder that cannot be made: exit 2, nothing written.
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"").unwrap();
    let o = quantize(&blocker.join("sub/out.safetensors"));
    assert_eq!(o.status.code(), Some(2));
    let mut left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    left.sort();
    assert_eq!(left, ["file", "junk.pt"]);

    // An int8 file whose scales are missing (cut out by hand): the weight is named.
    let out = dir.path().join("q.safetensors");
    assert!(quantize(&out).status.success());
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let victim = st.names().into_iter().find(|n| n.ends_with(SCALE_SUFFIX)).unwrap().to_owned();
    let kept: Vec<(String, safetensors::tensor::TensorView)> = st.tensors().into_iter().filter(|(n, _)| *n != victim).collect();
    std::fs::write(&out, safetensors::serialize(kept, None).unwrap()).unwrap();
    let e = format!("{:#}", Checkpoint::read(&out).err().unwrap());
    let weight = victim.trim_end_matches(SCALE_SUFFIX);
    assert!(e.contains(&format!("{weight}: an int8 tensor needs its scales")), "{e}");
}
