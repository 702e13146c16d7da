//! `moge colmap`: MoGe's depth for every registered image of a COLMAP reconstruction, run with
//! that image's own camera and brought to the reconstruction's scale, written as the depth
//! priors that Gaussian-splatting and NeRF pipelines read.
//!
//! - [`model`]: the sparse model (`cameras`, `images`, `points3D`), from [`text`] or [`binary`];
//! - [`align`]: the robust per-image scale;
//! - here: the run's inputs (one per registered image) and the [`Post`] work that fits each
//!   prediction and writes its files, in the pipeline's encode threads.
//!
//! Under the output folder, per image `NAME` (COLMAP's name without its extension):
//! - `depth/NAME.npy`: float32 (H, W), the aligned depth in the reconstruction's units, 0 where
//!   MoGe has none;
//! - `depth/NAME.png`: 16-bit, the aligned depth times `depth_png_scale` (1000: millimetres
//!   where the reconstruction is in metres), 0 where none, saturated at 65535;
//! - `depths/NAME.png` and `depth_params.json`: the layout of the 3D Gaussian Splatting
//!   reference code's depth regularisation (`-d depths`): MoGe's own inverse depth as 16-bit
//!   (`65535 · 0.1 m / depth`, nearer than 0.1 m saturated), and per image the `scale` and
//!   `offset` that take `png / 65536` to the reconstruction's inverse depth;
//! - `normals/NAME.png`: the normals in the camera's frame, as `--format png` writes them;
//! - `NAME.json`: the sidecar, with `colmap` (the image, its camera, the fit).

pub mod align;
mod binary;
pub mod model;
mod text;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::infer::Prediction;
use crate::outputs::{with_suffix, write_atomic};
use crate::pipeline::inputs::{rel_stem, Input};
use crate::pipeline::post::{Post, PostDone};
use model::{Model, Observation};

/// The model in `dir`: `cameras.bin`, `images.bin`, `points3D.bin` where they are there,
/// else the `.txt` three.
pub fn read(dir: &Path) -> Result<Model> {
    let has = |ext: &str| ["cameras", "images", "points3D"].iter().all(|f| dir.join(format!("{f}.{ext}")).is_file());
    let model = if has("bin") {
        binary::read(dir)?
    } else if has("txt") {
        text::read(dir)?
    } else {
        let hint = if dir.join("sparse/0/cameras.bin").is_file() || dir.join("sparse/0/cameras.txt").is_file() {
            format!(" (there is one in {})", dir.join("sparse/0").display())
        } else if dir.join("0/cameras.bin").is_file() || dir.join("0/cameras.txt").is_file() {
            format!(" (there is one in {})", dir.join("0").display())
        } else {
            String::new()
        };
        bail!("{}: no COLMAP model here: cameras, images and points3D .bin or .txt are needed{hint}", dir.display());
    };
    for image in model.images.values() {
        if !model.cameras.contains_key(&image.camera_id) {
            bail!("{}: image {} ('{}') has camera {}, which cameras does not list", dir.display(), image.id, image.name, image.camera_id);
        }
    }
    Ok(model)
}

/// `depth/NAME.png`'s units per reconstruction unit.
pub const DEPTH_PNG_SCALE: f64 = 1000.0;
/// `depths/NAME.png`: MoGe's inverse depth times this (metres): 65535 at 0.1 m.
pub const INVERSE_DEPTH_NEAR: f64 = 0.1;

/// A registered image as an input of the run.
struct Registered {
    image_id: u32,
    camera_id: u32,
    name: String,
    observed: Vec<Observation>,
}

/// The fit and the files of each image, in the encode threads; the 3DGS `depth_params.json`
/// gathered for the end of the run.
pub struct Aligner {
    output: PathBuf,
    by_path: HashMap<PathBuf, Registered>,
    params: Mutex<BTreeMap<String, (f64, f64)>>,
}

/// The inputs of `moge colmap` over `model` with its photos under `images`: one per registered
/// image, with its camera; one whose photo is missing or whose camera is not a pinhole one is
/// marked with the reason (it fails, the rest run).
pub fn inputs(model: &Model, images: &Path, output: &Path) -> (Vec<Input>, Aligner) {
    let mut inputs = Vec::with_capacity(model.images.len());
    let mut by_path = HashMap::new();
    for image in model.images.values() {
        let path = images.join(&image.name);
        let camera = &model.cameras[&image.camera_id];
        let mut input = Input { rel: rel_stem(Path::new(&image.name)), ..crate::pipeline::inputs::file_input(&path) };
        match camera.pinhole() {
            Ok(k) => input.camera = Some(k),
            Err(why) => input.problem = Some(why),
        }
        if input.problem.is_none() && !path.is_file() {
            input.problem = Some(format!("image {} ('{}') of the model is not in {}", image.id, image.name, images.display()));
        }
        let observed = image.observations(&model.points);
        by_path.insert(path, Registered { image_id: image.id, camera_id: image.camera_id, name: image.name.clone(), observed });
        inputs.push(input);
    }
    (inputs, Aligner { output: output.to_owned(), by_path, params: Mutex::default() })
}

impl Aligner {
    /// Writes `depth_params.json` of the images done (3DGS's keys: the name without its
    /// extension).
    pub fn write_depth_params(&self) -> Result<PathBuf> {
        let params = self.params.lock().unwrap_or_else(|e| e.into_inner());
        let doc: serde_json::Map<String, serde_json::Value> =
            params.iter().map(|(k, &(scale, offset))| (k.clone(), json!({"scale": scale, "offset": offset}))).collect();
        let path = self.output.join("depth_params.json");
        let text = serde_json::to_string_pretty(&doc)?;
        write_atomic(&path, |f| Ok(std::io::Write::write_all(f, text.as_bytes())?))?;
        Ok(path)
    }
}

/// 16-bit samples of `p`'s size as a PNG.
fn png16(path: &Path, values: impl Iterator<Item = u16>, p: &Prediction) -> Result<()> {
    crate::outputs::png::write_gray16(path, values.collect(), p.width, p.height)
}

impl Post for Aligner {
    fn apply(&self, input: &Input, pred: &mut Prediction, _stem: &Path) -> Result<PostDone> {
        let reg = self.by_path.get(&input.path).with_context(|| format!("{} is not a registered image of the model", input.path.display()))?;
        let t = std::time::Instant::now();
        let fit = align::fit_scale(pred, &reg.observed).map_err(|why| anyhow::anyhow!("image {} ('{}'): {why}", reg.image_id, reg.name))?;
        let fit_ms = t.elapsed().as_secs_f64() * 1e3;
        let rel = &input.rel;
        let out = |dir: &str, suffix: &str| with_suffix(&self.output.join(dir).join(rel), suffix);
        let (d_npy, d_png, inv_png, normal_png) = (out("depth", "npy"), out("depth", "png"), out("depths", "png"), out("normals", "png"));
        // MoGe's own inverse depth first, for 3DGS, which fits it itself.
        let q = 65535.0 * INVERSE_DEPTH_NEAR;
        png16(
            &inv_png,
            pred.depth.iter().zip(&pred.mask).map(|(&d, &m)| if m && d.is_finite() && d > 0.0 { (q / d as f64).round().min(65535.0) as u16 } else { 0 }),
            pred,
        )?;
        // The reconstruction's inverse depth = png / 65536 · scale: (png / q) / fit.
        let scale_3dgs = 65536.0 / (q * fit.scale);
        // Then everything in the reconstruction's units.
        pred.rescale((pred.metric_scale as f64 * fit.scale) as f32);
        let aligned: Vec<f32> = pred.depth.iter().zip(&pred.mask).map(|(&d, &m)| if m && d.is_finite() { d } else { 0.0 }).collect();
        write_atomic(&d_npy, |f| {
            use ndarray_npy::WriteNpyExt;
            let mut w = std::io::BufWriter::new(f);
            ndarray::ArrayView2::from_shape((pred.height, pred.width), &aligned[..]).expect("H x W").write_npy(&mut w)?;
            std::io::Write::flush(&mut w)?;
            Ok(())
        })?;
        png16(&d_png, aligned.iter().map(|&d| (d as f64 * DEPTH_PNG_SCALE).round().clamp(0.0, 65535.0) as u16), pred)?;
        let mut files = vec![d_npy, d_png, inv_png];
        if pred.normal.is_some() || pred.normal_png.is_some() {
            crate::outputs::png::write_normal(&normal_png, pred)?;
            files.push(normal_png);
        }
        let key = rel.to_string_lossy().replace('\\', "/");
        self.params.lock().unwrap_or_else(|e| e.into_inner()).insert(key, (scale_3dgs, 0.0));
        let sidecar = json!({
            "image_id": reg.image_id,
            "image_name": reg.name,
            "camera_id": reg.camera_id,
            "fit": fit,
            "fit_ms": fit_ms,
            "depth_png_scale": DEPTH_PNG_SCALE,
            "depth_params": {"scale": scale_3dgs, "offset": 0.0},
        });
        Ok(PostDone { files, sidecar: Some(("colmap", sidecar)) })
    }
}
