//! `moge batch` / `moge predict` end to end: the binary on temporary trees of good and bad
//! files, every output format decoded back and compared with the npz, exit statuses,
//! interruption and resume, shards, lists, and the pad / stretch fits.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use image::{GenericImageView, Rgb, RgbImage};
use ndarray::{Array2, Array3};
use ndarray_npy::NpzReader;
use serde_json::Value;

use crate::support::cli::{moge, run};
use crate::support::tiny_model::{write_tiny, TinySpec};

/// Few tokens keep the tiny model's forward at tens of milliseconds.
const TOKENS: &str = "64";

struct Models {
    _dir: tempfile::TempDir,
    /// Normal head, almost every pixel valid.
    normal: PathBuf,
    /// Normal head, a mask with valid and invalid pixels.
    mixed: PathBuf,
    /// No normal head.
    plain: PathBuf,
}

fn models() -> &'static Models {
    static M: OnceLock<Models> = OnceLock::new();
    M.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let normal = write_tiny(dir.path(), "tiny", TinySpec::default());
        let mixed = write_tiny(dir.path(), "mixed", TinySpec { mask_bias: 0.0, seed: 3, ..Default::default() });
        let plain = write_tiny(dir.path(), "plain", TinySpec { normal: false, ..Default::default() });
        Models { _dir: dir, normal, mixed, plain }
    })
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A photo with structure (gradients and a pattern), so the network's outputs vary.
fn photo(w: u32, h: u32, seed: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| Rgb([(x * 255 / w) as u8, (y * 255 / h) as u8, (((x / 4 + y / 3 + seed) * 37) % 256) as u8]))
}

fn json_lines(out: &Output) -> Vec<Value> {
    text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}"))).collect()
}

/// Every file under `dir`, relative, sorted.
fn tree(dir: &Path) -> BTreeSet<String> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_file())
        .map(|e| e.path().strip_prefix(dir).unwrap().to_string_lossy().into_owned())
        .collect()
}

struct Npz {
    points: Array3<f32>,
    depth: Array2<f32>,
    normal: Option<Array3<f32>>,
    mask: Array2<u8>,
    intrinsics: Array2<f32>,
    intrinsics_pixels: Array2<f32>,
    metric_scale: f32,
    fov_x: f32,
    fov_y: f32,
}

fn read_npz(path: &Path) -> Npz {
    let mut z = NpzReader::new(std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap();
    let names = z.names().unwrap();
    let scalar = |z: &mut NpzReader<std::fs::File>, n: &str| z.by_name::<ndarray::OwnedRepr<f32>, ndarray::Ix0>(n).unwrap().into_scalar();
    Npz {
        points: z.by_name("points").unwrap(),
        depth: z.by_name("depth").unwrap(),
        normal: names.iter().any(|n| n == "normal").then(|| z.by_name("normal").unwrap()),
        mask: z.by_name("mask").unwrap(),
        intrinsics: z.by_name("intrinsics").unwrap(),
        intrinsics_pixels: z.by_name("intrinsics_pixels").unwrap(),
        metric_scale: scalar(&mut z, "metric_scale"),
        fov_x: scalar(&mut z, "fov_x"),
        fov_y: scalar(&mut z, "fov_y"),
    }
}

// ---------------------------------------------------------------------------------------------
// Independent readers and reference computations for the formats.

/// The surface upstream's `moge infer` writes as PLY and GLB, computed here from the npz: the
/// pixels kept after edge removal (depth range over the 3x3 neighbourhood within `rtol` of the
/// depth) and used by a fully valid 2x2 block, in row-major order, and the triangles over them.
fn reference_surface(n: &Npz, rtol: f32) -> (Vec<usize>, Vec<[usize; 3]>) {
    let (h, w) = n.depth.dim();
    let d = |y: usize, x: usize| n.depth[[y, x]];
    let mut keep = vec![false; w * h];
    for y in 0..h {
        for x in 0..w {
            if n.mask[[y, x]] == 0 {
                continue;
            }
            let mut lo = f32::INFINITY;
            let mut hi = f32::NEG_INFINITY;
            for yy in y.saturating_sub(1)..=(y + 1).min(h - 1) {
                for xx in x.saturating_sub(1)..=(x + 1).min(w - 1) {
                    lo = lo.min(d(yy, xx));
                    hi = hi.max(d(yy, xx));
                }
            }
            // A NaN ratio keeps the pixel.
            let r = (hi - lo) / d(y, x);
            keep[y * w + x] = r <= rtol || r.is_nan();
        }
    }
    let mut tris = Vec::new();
    let mut used = BTreeSet::new();
    for y in 0..h - 1 {
        for x in 0..w - 1 {
            let (tl, tr, bl, br) = (y * w + x, y * w + x + 1, (y + 1) * w + x, (y + 1) * w + x + 1);
            if [tl, tr, bl, br].iter().all(|&p| keep[p]) {
                tris.push([tl, bl, br]);
                tris.push([tl, br, tr]);
                used.extend([tl, tr, bl, br]);
            }
        }
    }
    (used.into_iter().collect(), tris)
}

struct Ply {
    count: usize,
    props: Vec<String>,
    /// Per vertex: floats then 4 colour bytes.
    floats: Vec<Vec<f32>>,
    colors: Vec<[u8; 4]>,
}

fn read_ply(path: &Path) -> Ply {
    let bytes = std::fs::read(path).unwrap();
    let end = bytes.windows(11).position(|w| w == b"end_header\n").expect("a PLY header") + 11;
    let header = std::str::from_utf8(&bytes[..end]).unwrap();
    let mut lines = header.lines();
    assert_eq!(lines.next(), Some("ply"));
    assert_eq!(lines.next(), Some("format binary_little_endian 1.0"));
    let mut count = 0;
    let mut props = Vec::new();
    let mut in_vertex = false;
    for l in lines {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["element", "vertex", n] => {
                count = n.parse().unwrap();
                in_vertex = true;
            }
            ["element", "face", n] => {
                assert_eq!(*n, "0", "a point cloud has no faces");
                in_vertex = false;
            }
            ["property", ty, name] if in_vertex => props.push(format!("{ty} {name}")),
            _ => {}
        }
    }
    let nf = props.iter().filter(|p| p.starts_with("float")).count();
    let stride = 4 * nf + 4;
    assert_eq!(bytes.len() - end, count * stride, "vertex data size");
    let mut floats = Vec::new();
    let mut colors = Vec::new();
    for r in bytes[end..].chunks_exact(stride) {
        floats.push((0..nf).map(|k| f32::from_le_bytes(r[4 * k..4 * k + 4].try_into().unwrap())).collect());
        colors.push(r[4 * nf..].try_into().unwrap());
    }
    Ply { count, props, floats, colors }
}

struct Glb {
    json: Value,
    bin: Vec<u8>,
}

fn read_glb(path: &Path) -> Glb {
    let b = std::fs::read(path).unwrap();
    let u = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize;
    assert_eq!(&b[0..4], b"glTF");
    assert_eq!(u(4), 2, "glTF version");
    assert_eq!(u(8), b.len(), "GLB length field");
    let jl = u(12);
    assert_eq!(&b[16..20], b"JSON");
    assert_eq!(jl % 4, 0);
    let json: Value = serde_json::from_slice(&b[20..20 + jl]).unwrap();
    let mut bin = Vec::new();
    if 20 + jl < b.len() {
        let bl = u(20 + jl);
        assert_eq!(&b[24 + jl..28 + jl], b"BIN\0");
        bin = b[28 + jl..28 + jl + bl].to_vec();
    }
    Glb { json, bin }
}

impl Glb {
    fn view(&self, i: usize) -> &[u8] {
        let v = &self.json["bufferViews"][i];
        let o = v["byteOffset"].as_u64().unwrap_or(0) as usize;
        &self.bin[o..o + v["byteLength"].as_u64().unwrap() as usize]
    }
    fn floats(&self, accessor: usize, comps: usize) -> Vec<Vec<f32>> {
        let a = &self.json["accessors"][accessor];
        assert_eq!(a["componentType"], 5126);
        let data = self.view(a["bufferView"].as_u64().unwrap() as usize);
        let count = a["count"].as_u64().unwrap() as usize;
        assert_eq!(data.len(), count * comps * 4);
        data.chunks_exact(4 * comps).map(|c| c.chunks_exact(4).map(|x| f32::from_le_bytes(x.try_into().unwrap())).collect()).collect()
    }
    fn indices(&self, accessor: usize) -> Vec<u32> {
        let a = &self.json["accessors"][accessor];
        assert_eq!(a["componentType"], 5125, "u32 indices");
        self.view(a["bufferView"].as_u64().unwrap() as usize).chunks_exact(4).map(|x| u32::from_le_bytes(x.try_into().unwrap())).collect()
    }
}

/// (name → samples, compression) of a single-layer EXR, read with the exr crate.
fn read_exr(path: &Path) -> (BTreeMap<String, Vec<f32>>, String, (usize, usize)) {
    use exr::prelude::*;
    let img = read().no_deep_data().largest_resolution_level().all_channels().all_layers().all_attributes().from_file(path).unwrap();
    assert_eq!(img.layer_data.len(), 1);
    let layer = &img.layer_data[0];
    let chans = layer
        .channel_data
        .list
        .iter()
        .map(|c| {
            let v = match &c.sample_data {
                FlatSamples::F32(v) => v.clone(),
                other => panic!("{}: channel {} is not float32: {other:?}", path.display(), c.name),
            };
            (c.name.to_string(), v)
        })
        .collect();
    (chans, format!("{:?}", layer.encoding.compression), (layer.size.0, layer.size.1))
}

fn sha256(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(std::fs::read(path).unwrap()).iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks every format of one image against its npz.
fn check_formats(out_stem: &Path, photo_path: &Path, weights: &Path, depth_scale: f32) {
    let f = |suffix: &str| PathBuf::from(format!("{}.{suffix}", out_stem.display()));
    let n = read_npz(&f("npz"));
    let (h, w) = n.depth.dim();
    let photo = moge::image_io::load_rgb(photo_path, true).unwrap();
    assert_eq!((photo.width() as usize, photo.height() as usize), (w, h), "maps have the photo's size");
    let valid = |y: usize, x: usize| n.mask[[y, x]] == 1;
    let nvalid = n.mask.iter().filter(|&&m| m == 1).count();
    for ((y, x), &d) in n.depth.indexed_iter() {
        assert_eq!(valid(y, x), d.is_finite(), "mask and finite depth agree at ({x},{y})");
    }

    // PNG maps.
    let dp = image::open(f("depth.png")).unwrap();
    assert!(matches!(dp, image::DynamicImage::ImageLuma16(_)), "depth.png is 16-bit gray");
    let dp = dp.to_luma16();
    let mut saturated = 0;
    for ((y, x), &d) in n.depth.indexed_iter() {
        let v = dp.get_pixel(x as u32, y as u32).0[0];
        if !valid(y, x) {
            assert_eq!(v, 0, "invalid pixel ({x},{y}) is 0 in depth.png");
        } else if d / depth_scale > 65535.5 {
            assert_eq!(v, 65535);
            saturated += 1;
        } else {
            assert!((v as f32 * depth_scale - d).abs() <= depth_scale * 0.5 + d * 1e-6, "depth.png ({x},{y}): {v} vs {d}");
        }
    }
    let mp = image::open(f("mask.png")).unwrap();
    assert!(matches!(mp, image::DynamicImage::ImageLuma8(_)));
    for (x, y, p) in mp.to_luma8().enumerate_pixels() {
        assert_eq!(p.0[0], if valid(y as usize, x as usize) { 255 } else { 0 });
    }
    if let Some(nm) = &n.normal {
        let np = image::open(f("normal.png")).unwrap();
        assert!(matches!(np, image::DynamicImage::ImageRgb8(_)));
        for (x, y, p) in np.to_rgb8().enumerate_pixels() {
            for c in 0..3 {
                let back = p.0[c] as f32 / 255.0 * 2.0 - 1.0;
                assert!((back - nm[[y as usize, x as usize, c]]).abs() <= 1.0 / 255.0 + 1e-6, "normal.png ({x},{y})");
            }
        }
    } else {
        assert!(!f("normal.png").exists());
    }

    // Sidecar.
    let j: Value = serde_json::from_str(&std::fs::read_to_string(f("json")).unwrap()).unwrap();
    assert_eq!(j["width"], w);
    assert_eq!(j["height"], h);
    assert!((j["fov_x"].as_f64().unwrap() as f32 - n.fov_x).abs() < 1e-4);
    assert!((j["fov_y"].as_f64().unwrap() as f32 - n.fov_y).abs() < 1e-4);
    assert!((j["metric_scale"].as_f64().unwrap() as f32 - n.metric_scale).abs() < 1e-6);
    for r in 0..3 {
        for c in 0..3 {
            assert!((j["intrinsics"][r][c].as_f64().unwrap() as f32 - n.intrinsics[[r, c]]).abs() < 1e-6);
            assert!((j["intrinsics_pixels"][r][c].as_f64().unwrap() as f32 - n.intrinsics_pixels[[r, c]]).abs() < 1e-3);
        }
    }
    assert_eq!(j["depth"]["valid_pixels"], nvalid);
    let finite: Vec<f32> = n.depth.iter().copied().filter(|d| d.is_finite()).collect();
    if !finite.is_empty() {
        let min = finite.iter().copied().fold(f32::INFINITY, f32::min);
        let max = finite.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(j["depth"]["min"].as_f64().unwrap() as f32, min);
        assert_eq!(j["depth"]["max"].as_f64().unwrap() as f32, max);
    }
    assert_eq!(j["depth_png"]["scale"].as_f64().unwrap() as f32, depth_scale);
    assert_eq!(j["depth_png"]["saturated"], saturated);
    assert_eq!(j["model"]["weights_sha256"], sha256(weights));
    assert_eq!(j["model"]["id"], weights.file_name().unwrap().to_str().unwrap());
    assert_eq!(j["tool"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(j["has_normal"], n.normal.is_some());
    for k in ["decode", "prepare", "forward", "postprocess", "write"] {
        assert!(j["timings_ms"][k].as_f64().unwrap() >= 0.0, "timing {k}");
    }

    // EXR: bit-identical to the npz, inf where invalid, ZIP like OpenCV.
    let (ch, comp, size) = read_exr(&f("depth.exr"));
    assert_eq!(size, (w, h));
    assert_eq!(comp, "ZIP16");
    assert_eq!(ch.keys().collect::<Vec<_>>(), vec!["Y"]);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&ch["Y"]), bits(n.depth.as_slice().unwrap()));
    let (ch, _, _) = read_exr(&f("points.exr"));
    assert_eq!(ch.keys().cloned().collect::<Vec<_>>(), vec!["B", "G", "R"]);
    for (name, c) in [("R", 0), ("G", 1), ("B", 2)] {
        let want: Vec<f32> = n.points.iter().skip(c).step_by(3).copied().collect();
        assert_eq!(bits(&ch[name]), bits(&want), "points.exr {name}");
    }

    // PLY and GLB: the reference surface, OpenGL axes.
    let (pixels, tris) = reference_surface(&n, 0.04);
    let ply = read_ply(&f("ply"));
    assert_eq!(ply.count, pixels.len(), "ply vertex count");
    let mut want_props = vec!["float x", "float y", "float z"];
    if n.normal.is_some() {
        want_props.extend(["float nx", "float ny", "float nz"]);
    }
    want_props.extend(["uchar red", "uchar green", "uchar blue", "uchar alpha"]);
    assert_eq!(ply.props, want_props);
    for (k, &p) in pixels.iter().enumerate() {
        let (y, x) = (p / w, p % w);
        let v = &ply.floats[k];
        assert_eq!(v[..3], [n.points[[y, x, 0]], -n.points[[y, x, 1]], -n.points[[y, x, 2]]], "ply vertex {k}");
        if let Some(nm) = &n.normal {
            assert_eq!(v[3..6], [nm[[y, x, 0]], -nm[[y, x, 1]], -nm[[y, x, 2]]]);
        }
        let c = photo.get_pixel(x as u32, y as u32).0;
        assert_eq!(ply.colors[k], [c[0], c[1], c[2], 255], "ply colour {k}");
    }
    let glb = read_glb(&f("glb"));
    if tris.is_empty() {
        assert!(glb.json.get("meshes").is_none());
    } else {
        let prim = &glb.json["meshes"][0]["primitives"][0];
        let attr = |k: &str| prim["attributes"][k].as_u64().unwrap() as usize;
        let pos = glb.floats(attr("POSITION"), 3);
        assert_eq!(pos.len(), pixels.len());
        for (k, p) in pos.iter().enumerate() {
            assert_eq!(p[..], ply.floats[k][..3]);
        }
        let index: BTreeMap<usize, u32> = pixels.iter().enumerate().map(|(k, &p)| (p, k as u32)).collect();
        let want: Vec<u32> = tris.iter().flat_map(|t| t.iter().map(|p| index[p])).collect();
        assert_eq!(glb.indices(prim["indices"].as_u64().unwrap() as usize), want, "glb triangles");
        let uv = glb.floats(attr("TEXCOORD_0"), 2);
        for (k, &p) in pixels.iter().enumerate() {
            let (y, x) = (p / w, p % w);
            assert!((uv[k][0] - (x as f32 + 0.5) / w as f32).abs() < 1e-6);
            assert!((uv[k][1] - (1.0 - (y as f32 + 0.5) / h as f32)).abs() < 1e-6);
        }
        if n.normal.is_some() {
            let nrm = glb.floats(attr("NORMAL"), 3);
            for (k, v) in nrm.iter().enumerate() {
                assert_eq!(v[..], ply.floats[k][3..6]);
            }
        }
        let mat = &glb.json["materials"][prim["material"].as_u64().unwrap() as usize]["pbrMetallicRoughness"];
        assert_eq!(mat["metallicFactor"], 0.5);
        assert_eq!(mat["roughnessFactor"], 1.0);
        let tex = &glb.json["textures"][mat["baseColorTexture"]["index"].as_u64().unwrap() as usize];
        let img = &glb.json["images"][tex["source"].as_u64().unwrap() as usize];
        assert_eq!(img["mimeType"], "image/png");
        let png = glb.view(img["bufferView"].as_u64().unwrap() as usize);
        let texture = image::load_from_memory(png).unwrap().to_rgb8();
        assert_eq!(texture, photo, "the texture is the photo");
    }

    // Vis: the upstream normal colours exactly; depth colours from the Spectral ramp.
    let dv = image::open(f("depth_vis.png")).unwrap();
    assert!(matches!(dv, image::DynamicImage::ImageRgb8(_)));
    assert_eq!(dv.dimensions(), (w as u32, h as u32));
    if let Some(nm) = &n.normal {
        let nv = image::open(f("normal_vis.png")).unwrap().to_rgb8();
        for (x, y, p) in nv.enumerate_pixels() {
            let v = |c: usize, s: f64| ((nm[[y as usize, x as usize, c]] as f64 * s + 0.5).clamp(0.0, 1.0) * 255.0) as u8;
            assert_eq!(p.0, [v(0, 0.5), v(1, -0.5), v(2, -0.5)]);
        }
    }
}

// ---------------------------------------------------------------------------------------------

/// A tree with good photos in every supported encoding and every kind of bad file.
fn build_tree(root: &Path) -> (Vec<PathBuf>, Vec<(PathBuf, &'static str)>) {
    std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(root.join(".hidden")).unwrap();
    let mut good = Vec::new();
    let mut save = |rel: &str, img: image::DynamicImage| {
        let p = root.join(rel);
        img.save(&p).unwrap();
        good.push(p);
    };
    save("a.png", photo(40, 30, 1).into());
    save("b.JPG", photo(36, 28, 2).into());
    save("sub/c.tiff", photo(30, 40, 3).into());
    save("sub/d.webp", photo(32, 24, 4).into());
    save("sub/deeper/e.bmp", photo(28, 28, 5).into());
    save("gray.png", image::DynamicImage::ImageLuma8(image::GrayImage::from_fn(33, 25, |x, y| image::Luma([(x * 7 + y * 3) as u8]))));
    save("sub/rgb16.png", image::DynamicImage::ImageRgb16(image::ImageBuffer::from_fn(30, 22, |x, y| Rgb([(x * 2000) as u16, (y * 2900) as u16, 40000]))));
    // Not inputs: hidden, or not an image extension.
    photo(20, 20, 0).save(root.join(".hidden/h.png")).unwrap();
    photo(20, 20, 0).save(root.join(".dot.png")).unwrap();
    std::fs::write(root.join("notes.txt"), "not a photo").unwrap();

    let mut bad = Vec::new();
    let mut put = |rel: &str, bytes: &[u8], reason: &'static str| {
        let p = root.join(rel);
        std::fs::write(&p, bytes).unwrap();
        bad.push((p, reason));
    };
    put("empty.png", b"", "empty file");
    let mut png = Vec::new();
    photo(40, 30, 9).write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
    put("truncated.png", &png[..png.len() / 2], "truncated PNG");
    put("corrupt.jpg", &[0xFF, 0xD8, 0xFF, 0xE0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], "JPEG");
    put("sub/text.png", b"this is a text file, not a PNG", "not an image");
    // A BMP header that claims 30000 x 30000 pixels (data absent).
    let mut bmp = b"BM".to_vec();
    for v in [54u32 + 16, 0, 54, 40, 30000, 30000] {
        bmp.extend(v.to_le_bytes());
    }
    bmp.extend(1u16.to_le_bytes());
    bmp.extend(24u16.to_le_bytes());
    for v in [0u32, 16, 2835, 2835, 0, 0] {
        bmp.extend(v.to_le_bytes());
    }
    bmp.extend([0u8; 16]);
    put("huge.bmp", &bmp, "over the limit");
    (good, bad)
}

#[test]
fn batch_every_format_on_a_tree_with_bad_files() {
    let m = models();
    let tmp = tempfile::tempdir().unwrap();
    let (input, out) = (tmp.path().join("in"), tmp.path().join("out"));
    let (good, bad) = build_tree(&input);
    let o = run(&[
        "batch",
        s(&input),
        "-o",
        s(&out),
        "--weights",
        s(&m.mixed),
        "--num-tokens",
        TOKENS,
        "--format",
        "npz,png,json,exr,ply,glb,vis",
        "--json",
        "--jobs",
        "2",
    ]);
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "some inputs failed → 1\n{stderr}");

    // One JSON line per input, with the right status; one error line per bad file.
    let lines = json_lines(&o);
    assert_eq!(lines.len(), good.len() + bad.len(), "{}", text(&o.stdout));
    let by_input: BTreeMap<String, &Value> = lines.iter().map(|l| (l["input"].as_str().unwrap().to_owned(), l)).collect();
    for g in &good {
        let l = by_input[s(g)];
        assert_eq!(l["status"], "ok", "{l}");
        assert!(l["error"].is_null());
        assert!(l["timings_ms"]["forward"].as_f64().unwrap() > 0.0);
        assert_eq!(l["outputs"].as_array().unwrap().len(), 11);
    }
    for (b, reason) in &bad {
        let l = by_input[s(b)];
        assert_eq!(l["status"], "failed");
        let err = l["error"].as_str().unwrap();
        assert!(err.starts_with(s(b)) && err.contains(reason), "error names the file and why: {err}");
        let shown: Vec<&str> = stderr.lines().filter(|x| x.contains(s(b))).collect();
        assert_eq!(shown.len(), 1, "one stderr line for {}: {stderr}", b.display());
    }
    assert!(stderr.contains(&format!("{} done, {} failed", good.len(), bad.len())), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // The mirrored tree holds exactly the expected files, none temporary, none for bad inputs.
    let suffixes = ["npz", "depth.png", "normal.png", "mask.png", "json", "depth.exr", "points.exr", "ply", "glb", "depth_vis.png", "normal_vis.png"];
    let mut want = BTreeSet::new();
    for g in &good {
        let rel = g.strip_prefix(&input).unwrap().with_extension("");
        for x in suffixes {
            want.insert(format!("{}.{x}", rel.display()));
        }
    }
    assert_eq!(tree(&out), want);

    let mut some_invalid = false;
    for g in &good {
        let stem = out.join(g.strip_prefix(&input).unwrap().with_extension(""));
        check_formats(&stem, g, &m.mixed, 0.001);
        some_invalid |= read_npz(&PathBuf::from(format!("{}.npz", stem.display()))).mask.iter().any(|&v| v == 0);
    }
    assert!(some_invalid, "the mixed model gives invalid pixels, so 0 = invalid and edge removal are exercised");
}

#[test]
fn model_without_normals_saturation_and_skip_existing() {
    let m = models();
    let tmp = tempfile::tempdir().unwrap();
    let (input, out) = (tmp.path().join("in"), tmp.path().join("out"));
    std::fs::create_dir_all(&input).unwrap();
    photo(40, 30, 1).save(input.join("x.png")).unwrap();
    photo(30, 30, 2).save(input.join("y.png")).unwrap();
    // 1e-5 m per unit: depths of metres do not fit in 16 bits and saturate.
    let args = [
        "batch",
        s(&input),
        "-o",
        s(&out),
        "--weights",
        s(&m.plain),
        "--num-tokens",
        TOKENS,
        "--format",
        "npz,png,vis,ply,glb",
        "--depth-scale",
        "0.00001",
        "--json",
    ];
    let o = run(&args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let files = tree(&out);
    for st in ["x", "y"] {
        for x in ["depth.png", "mask.png", "json", "depth_vis.png", "ply", "glb"] {
            assert!(files.contains(&format!("{st}.{x}")), "{st}.{x} in {files:?}");
        }
        assert!(!files.contains(&format!("{st}.normal.png")) && !files.contains(&format!("{st}.normal_vis.png")));
        let j: Value = serde_json::from_str(&std::fs::read_to_string(out.join(format!("{st}.json"))).unwrap()).unwrap();
        assert_eq!(j["has_normal"], false);
        let n = read_npz(&out.join(format!("{st}.npz")));
        assert!(n.normal.is_none());
        let over = n.depth.iter().filter(|d| d.is_finite() && **d / 1e-5 > 65535.5).count();
        assert!(over > 0, "the test needs depths beyond 0.655 m");
        assert_eq!(j["depth_png"]["saturated"], over);
        let dp = image::open(out.join(format!("{st}.depth.png"))).unwrap().to_luma16();
        assert_eq!(dp.pixels().filter(|p| p.0[0] == 65535).count(), over, "saturated values are clamped to 65535");
        let ply = read_ply(&out.join(format!("{st}.ply")));
        assert_eq!(ply.props.len(), 7, "no normal properties: {:?}", ply.props);
    }
    assert!(text(&o.stderr).contains("depth PNG values saturated"), "{}", text(&o.stderr));

    // Resume: everything requested exists → all skipped, nothing rewritten.
    let before = std::fs::metadata(out.join("x.glb")).unwrap().modified().unwrap();
    let mut again = args.to_vec();
    again.push("--skip-existing");
    let o = run(&again);
    assert_eq!(o.status.code(), Some(0));
    assert!(json_lines(&o).iter().all(|l| l["status"] == "skipped"));
    assert_eq!(std::fs::metadata(out.join("x.glb")).unwrap().modified().unwrap(), before);
    // Asking for one more format processes them again.
    std::fs::remove_file(out.join("y.mask.png")).unwrap();
    let o = run(&again);
    let st: BTreeMap<String, String> =
        json_lines(&o).iter().map(|l| (l["input"].as_str().unwrap().to_owned(), l["status"].as_str().unwrap().to_owned())).collect();
    assert_eq!(st[s(&input.join("x.png"))], "skipped");
    assert_eq!(st[s(&input.join("y.png"))], "ok");
    assert!(out.join("y.mask.png").exists());
}

#[test]
fn an_output_directory_inside_the_input_tree_is_not_searched() {
    let m = models();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("photos");
    std::fs::create_dir_all(&input).unwrap();
    photo(24, 20, 1).save(input.join("p.png")).unwrap();
    let out = input.join("out");
    for round in 0..2 {
        let o = run(&["batch", s(&input), "-o", s(&out), "--weights", s(&m.normal), "--num-tokens", TOKENS, "--format", "png", "--json"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        let l = json_lines(&o);
        assert_eq!(l.len(), 1, "round {round}: only the photo, not last round's PNG outputs: {l:?}");
    }
}

#[test]
fn exit_statuses_for_usage_and_fatal_errors() {
    let m = models();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    photo(24, 24, 1).save(input.join("p.png")).unwrap();
    let out = tmp.path().join("out");
    let base = |extra: &[&str]| {
        let mut v = vec!["batch", s(&input), "-o", s(&out), "--num-tokens", TOKENS, "--quiet"];
        v.extend_from_slice(extra);
        v.iter().map(|x| x.to_string()).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>| moge().args(&args).output().unwrap();

    let o = run(base(&["--weights", s(&m.normal)]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(o.stderr.is_empty(), "--quiet prints nothing when all is well: {}", text(&o.stderr));

    // Weights that do not load.
    let junk = tmp.path().join("junk.safetensors");
    std::fs::write(&junk, b"definitely not a checkpoint").unwrap();
    let o = run(base(&["--weights", s(&junk)]));
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains(s(&junk)), "{}", text(&o.stderr));

    // An output that cannot be written (a file where the directory should be).
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let o = run(vec!["batch".into(), s(&input).into(), "-o".into(), s(&file).into(), "--weights".into(), s(&m.normal).into()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains(s(&file)), "{}", text(&o.stderr));

    // Usage: a missing input directory, a bad shard, an unknown format, no input at all.
    let o = run(vec!["batch".into(), s(&tmp.path().join("nope")).into(), "-o".into(), s(&out).into(), "--weights".into(), s(&m.normal).into()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("nope"));
    for extra in [&["--shard", "3/3"][..], &["--format", "npz,gif"], &["--canvas", "0x10"], &["--jobs", "0"]] {
        let mut a = base(&["--weights", s(&m.normal)]);
        a.extend(extra.iter().map(|x| x.to_string()));
        let o = run(a);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", text(&o.stderr));
    }
    let o = run(vec!["batch".into(), "-o".into(), s(&out).into()]);
    assert_eq!(o.status.code(), Some(2));
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = run(vec!["batch".into(), s(&empty).into(), "-o".into(), s(&out).into(), "--weights".into(), s(&m.normal).into()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("no images or videos found"), "{}", text(&o.stderr));
}

#[test]
fn shards_partition_and_lists_mirror_their_paths() {
    let m = models();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    std::fs::create_dir_all(input.join("s")).unwrap();
    let mut all = BTreeSet::new();
    for i in 0..9 {
        let rel = if i % 2 == 0 { format!("p{i}.png") } else { format!("s/p{i}.png") };
        photo(24, 20, i).save(input.join(&rel)).unwrap();
        all.insert(format!("{}.npz", rel.trim_end_matches(".png")));
    }
    let out = tmp.path().join("out");
    let mut seen = BTreeSet::new();
    let mut total = 0;
    let inputs_of = |o: &Output| json_lines(o).iter().map(|l| l["input"].as_str().unwrap().to_owned()).collect::<BTreeSet<_>>();
    let mut by_shard = Vec::new();
    for k in 0..3 {
        let shard = format!("{k}/3");
        let o = run(&["batch", s(&input), "-o", s(&out), "--weights", s(&m.normal), "--num-tokens", TOKENS, "--shard", &shard, "--json"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        for l in json_lines(&o) {
            assert!(seen.insert(l["input"].as_str().unwrap().to_owned()), "an input in two shards");
            total += 1;
        }
        by_shard.push(inputs_of(&o));
    }
    assert_eq!(total, 9, "the shards cover every input once");
    assert_eq!(tree(&out), all);

    // --shard auto in a Slurm array numbered from 1 (sbatch --array=1-3): the same shards.
    let scheduler_vars = ["SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_COUNT", "JOB_COMPLETION_INDEX", "JOB_COMPLETIONS"];
    let auto = |vars: &[(&str, String)], shard: &str| {
        let mut c = moge();
        c.args(["batch", s(&input), "-o", s(&tmp.path().join("out_auto")), "--weights", s(&m.normal), "--num-tokens", TOKENS, "--shard", shard, "--json"]);
        scheduler_vars.iter().for_each(|v| {
            c.env_remove(v);
        });
        c.envs(vars.iter().map(|(k, v)| (*k, v.as_str()))).output().unwrap()
    };
    for (k, want) in by_shard.iter().enumerate() {
        let slurm = [("SLURM_ARRAY_TASK_ID", (k + 1).to_string()), ("SLURM_ARRAY_TASK_MIN", "1".into()), ("SLURM_ARRAY_TASK_COUNT", "3".into())];
        let o = auto(&slurm, "auto");
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        assert_eq!(&inputs_of(&o), want, "Slurm task {} is shard {k}/3", k + 1);
        // A Kubernetes indexed Job, its count given on the command line.
        let o = auto(&[("JOB_COMPLETION_INDEX", k.to_string())], "auto/3");
        assert_eq!(&inputs_of(&o), want, "indexed Job {k} is shard {k}/3: {}", text(&o.stderr));
    }
    // Outside a scheduler: a usage error naming what it reads.
    let o = auto(&[], "auto");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("SLURM_ARRAY_TASK_ID") && text(&o.stderr).contains("JOB_COMPLETION_INDEX"), "{}", text(&o.stderr));

    // A list on stdin: relative paths keep their directories under OUT; comments skipped; a
    // listed file that is missing fails on its own.
    let out2 = tmp.path().join("out2");
    let mut child = moge()
        .current_dir(&input)
        .args(["batch", "--from-list", "-", "-o", s(&out2), "--weights", s(&m.normal), "--num-tokens", TOKENS, "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"# photos\ns/p1.png\n\np2.png\nmissing.png\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert_eq!(tree(&out2), BTreeSet::from(["s/p1.npz".to_string(), "p2.npz".to_string()]));
    assert!(text(&o.stderr).contains("missing.png"));
}

#[test]
fn predict_writes_the_requested_formats() {
    let m = models();
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a.png");
    photo(30, 20, 1).save(&a).unwrap();
    let bad = tmp.path().join("bad.png");
    std::fs::write(&bad, b"nope").unwrap();
    let out = tmp.path().join("out");
    let o = run(&["predict", s(&a), s(&bad), "-o", s(&out), "--weights", s(&m.normal), "--num-tokens", TOKENS, "--format", "npz,png,exr"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stdout).contains("MoGeOutput(30x20"), "{}", text(&o.stdout));
    assert!(text(&o.stderr).contains(s(&bad)));
    let want: BTreeSet<String> = ["a.npz", "a.depth.png", "a.normal.png", "a.mask.png", "a.json", "a.depth.exr", "a.points.exr"].map(String::from).into();
    assert_eq!(tree(&out), want);
}

/// A JPEG with an EXIF APP1 segment carrying `orientation`.
fn jpeg_with_orientation(img: &RgbImage, orientation: u16) -> Vec<u8> {
    let mut jpg = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut jpg), image::ImageFormat::Jpeg).unwrap();
    let mut tiff = b"II*\0".to_vec();
    tiff.extend(8u32.to_le_bytes());
    tiff.extend(1u16.to_le_bytes());
    tiff.extend(0x0112u16.to_le_bytes());
    tiff.extend(3u16.to_le_bytes());
    tiff.extend(1u32.to_le_bytes());
    tiff.extend(orientation.to_le_bytes());
    tiff.extend([0, 0]);
    tiff.extend(0u32.to_le_bytes());
    let mut app1 = b"Exif\0\0".to_vec();
    app1.extend(tiff);
    let mut out = vec![0xFF, 0xD8, 0xFF, 0xE1];
    out.extend(((app1.len() + 2) as u16).to_be_bytes());
    out.extend(app1);
    out.extend(&jpg[2..]);
    out
}

#[test]
fn exif_orientation_is_applied_unless_no_exif() {
    let m = models();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    std::fs::write(input.join("r.jpg"), jpeg_with_orientation(&photo(40, 24, 1), 6)).unwrap();
    for (flag, dims) in [(None, (40, 24)), (Some("--no-exif"), (24, 40))] {
        let out = tmp.path().join(format!("out{}", flag.is_some()));
        let mut a = vec!["batch", s(&input), "-o", s(&out), "--weights", s(&m.normal), "--num-tokens", TOKENS];
        a.extend(flag);
        let o = run(&a);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        assert_eq!(read_npz(&out.join("r.npz")).depth.dim(), dims, "{flag:?}");
    }
}

/// points = depth · K⁻¹ [u, v, 1] on the valid pixels, u, v normalised pixel centres.
fn assert_projective(n: &Npz) {
    let (h, w) = n.depth.dim();
    let k = &n.intrinsics;
    let mut checked = 0;
    for y in 0..h {
        for x in 0..w {
            let d = n.depth[[y, x]];
            if !d.is_finite() {
                continue;
            }
            let u = (x as f32 + 0.5) / w as f32;
            let v = (y as f32 + 0.5) / h as f32;
            let want = [(u - k[[0, 2]]) / k[[0, 0]] * d, (v - k[[1, 2]]) / k[[1, 1]] * d, d];
            for (c, want_c) in want.iter().enumerate() {
                let got = n.points[[y, x, c]];
                assert!((got - want_c).abs() <= 1e-4 * (1.0 + d.abs()), "({x},{y})[{c}]: {got} vs {want_c}");
            }
            checked += 1;
        }
    }
    assert!(checked > w * h / 2, "most pixels are valid");
}

#[test]
fn fit_pad_and_stretch_cut_outputs_back_to_the_photo() {
    let m = models();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    photo(60, 40, 1).save(input.join("wide.png")).unwrap();
    photo(30, 44, 2).save(input.join("tall.png")).unwrap();
    // Exactly the canvas aspect (16:9): pad adds nothing, so it must equal exact.
    photo(64, 36, 3).save(input.join("same.png")).unwrap();
    let tokens: u32 = TOKENS.parse().unwrap();
    let mut depth_of = BTreeMap::new();
    for fit in ["exact", "pad", "stretch"] {
        let out = tmp.path().join(fit);
        let o = run(&[
            "batch",
            s(&input),
            "-o",
            s(&out),
            "--weights",
            s(&m.normal),
            "--num-tokens",
            TOKENS,
            "--fit",
            fit,
            "--canvas",
            "32x18",
            "--format",
            "npz,json",
        ]);
        assert_eq!(o.status.code(), Some(0), "{fit}: {}", text(&o.stderr));
        for (name, w, h) in [("wide", 60, 40), ("tall", 30, 44), ("same", 64, 36)] {
            let n = read_npz(&out.join(format!("{name}.npz")));
            assert_eq!(n.depth.dim(), (h, w), "{fit} {name}: outputs at the photo's size");
            assert_projective(&n);
            let j: Value = serde_json::from_str(&std::fs::read_to_string(out.join(format!("{name}.json"))).unwrap()).unwrap();
            let grid = (j["inference"]["grid"][0].as_u64().unwrap() as usize, j["inference"]["grid"][1].as_u64().unwrap() as usize);
            let want = if fit == "exact" { moge::model::token_grid(w, h, tokens) } else { moge::model::token_grid(32, 18, tokens) };
            assert_eq!(grid, want, "{fit} {name}: token grid");
            depth_of.insert((fit, name), n.depth.clone());
            if fit == "stretch" {
                // An axis-aligned stretch keeps normalised intrinsics centred; pixel focals differ per axis.
                assert!((n.intrinsics[[0, 2]] - 0.5).abs() < 1e-6 && (n.intrinsics[[1, 2]] - 0.5).abs() < 1e-6);
            }
            if fit == "pad" && name == "tall" {
                // Borders left and right: the principal point stays centred in x for a centred photo.
                assert!((n.intrinsics[[0, 2]] - 0.5).abs() < 0.02, "{}", n.intrinsics);
            }
        }
    }
    let bits = |a: &Array2<f32>| a.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&depth_of[&("pad", "same")]), bits(&depth_of[&("exact", "same")]), "pad at the canvas aspect is exact");
    assert_ne!(bits(&depth_of[&("pad", "wide")]), bits(&depth_of[&("exact", "wide")]), "pad changes a photo of another aspect");
}

/// Without a format that reads the point map or the float normals (png, json), the
/// post-processing leaves them out (the normal PNG's codes made in place of the floats): the
/// files written are the same, byte for byte, as beside an npz, at every `--fit`.
#[test]
fn outputs_without_the_point_map_are_unchanged() {
    let m = models();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    photo(60, 40, 4).save(input.join("wide.png")).unwrap();
    photo(30, 44, 5).save(input.join("tall.png")).unwrap();
    for fit in ["exact", "pad", "stretch"] {
        let run = |formats: &str| {
            let out = tmp.path().join(format!("{fit}-{formats}"));
            let o = run(&[
                "batch",
                s(&input),
                "-o",
                s(&out),
                "--weights",
                s(&m.normal),
                "--num-tokens",
                TOKENS,
                "--fit",
                fit,
                "--canvas",
                "32x18",
                "--format",
                formats,
            ]);
            assert_eq!(o.status.code(), Some(0), "{fit} {formats}: {}", text(&o.stderr));
            out
        };
        let (lean, full) = (run("png,json"), run("npz,png,json"));
        for name in ["wide", "tall"] {
            for suffix in ["depth.png", "normal.png", "mask.png"] {
                let (a, b) = (lean.join(format!("{name}.{suffix}")), full.join(format!("{name}.{suffix}")));
                assert_eq!(sha256(&a), sha256(&b), "{fit}: {name}.{suffix}");
            }
            let sidecar = |dir: &Path| {
                let mut j: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap()).unwrap();
                j.as_object_mut().unwrap().remove("timings_ms");
                j
            };
            let (a, b) = (sidecar(&lean), sidecar(&full));
            assert!(a["depth"]["valid_pixels"].as_u64().unwrap() > 0, "{fit}: depth statistics over valid pixels: {a}");
            assert_eq!(a, b, "{fit}: {name}.json");
            assert!(full.join(format!("{name}.npz")).exists() && !lean.join(format!("{name}.npz")).exists());
        }
    }
}

#[test]
fn interrupt_leaves_no_partial_file_and_resume_completes() {
    let m = models();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    let total = 40;
    for i in 0..total {
        photo(64, 48, i).save(input.join(format!("p{i:03}.png"))).unwrap();
    }
    let out = tmp.path().join("out");
    let args = ["batch", s(&input), "-o", s(&out), "--weights", s(&m.normal), "--num-tokens", TOKENS, "--format", "npz,png,glb", "--json", "--jobs", "1"];
    let mut child = moge().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    let mut line = String::new();
    while lines.len() < 3 {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "the batch ended before the interruption");
        lines.push(line.trim().to_owned());
    }
    let kill = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    for l in stdout.lines() {
        lines.push(l.unwrap());
    }
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("--skip-existing"), "{stderr}");
    let done: BTreeSet<String> = lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["status"] == "ok")
        .map(|v| v["input"].as_str().unwrap().to_owned())
        .collect();
    assert!(done.len() >= 3 && done.len() < total as usize, "stopped part way: {} done", done.len());

    // No temporary or partial file: every file present is complete and belongs to a done image.
    let files = tree(&out);
    assert!(files.iter().all(|f| !f.contains("moge-tmp")), "{files:?}");
    // npz, depth / normal / mask png, the sidecar, glb.
    assert_eq!(files.len(), done.len() * 6, "all six files of each finished image, nothing else");
    for f in &files {
        let p = out.join(f);
        if f.ends_with(".npz") {
            read_npz(&p);
        } else if f.ends_with(".png") {
            image::open(&p).unwrap();
        } else if f.ends_with(".glb") {
            read_glb(&p);
        }
    }

    // Resume: the finished ones are skipped, the rest done.
    let mut again = args.to_vec();
    again.push("--skip-existing");
    let o = run(&again);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let l = json_lines(&o);
    let skipped: BTreeSet<String> = l.iter().filter(|v| v["status"] == "skipped").map(|v| v["input"].as_str().unwrap().to_owned()).collect();
    assert_eq!(skipped, done);
    assert_eq!(l.iter().filter(|v| v["status"] == "ok").count(), total as usize - done.len());
    assert_eq!(tree(&out).len(), total as usize * 6);
}

/// `root/in` with `n` 40x30 photos p0.png, p1.png, ...: an uncompressed npz of their maps is
/// ~35 KiB, which the two write-failure tests size their limits by (Linux's only).
#[cfg(target_os = "linux")]
fn photos_40x30(root: &Path, n: u32) -> PathBuf {
    let input = root.join("in");
    std::fs::create_dir_all(&input).unwrap();
    for i in 0..n {
        photo(40, 30, i).save(input.join(format!("p{i}.png"))).unwrap();
    }
    input
}

/// A write the system refuses half-way (here the file-size limit, EFBIG, which fails a write as
/// a full disk does) gets one line naming the file and the reason, leaves neither the output
/// nor its temporary file behind, and the batch goes on to the next image (exit 1).
#[cfg(target_os = "linux")]
#[test]
fn a_refused_write_leaves_nothing_behind_and_the_batch_goes_on() {
    use std::os::unix::process::CommandExt;
    let m = models();
    let tmp = tempfile::tempdir().unwrap();
    let input = photos_40x30(tmp.path(), 2);
    let out = tmp.path().join("out");
    let mut cmd = moge();
    cmd.args(["batch", s(&input), "-o", s(&out), "--weights", s(&m.normal), "--num-tokens", TOKENS, "--no-compress", "--json"]);
    // Files may not grow past 4 KiB (an npz of 40x30 maps is ~35 KiB); the process ignores
    // SIGXFSZ, so the write fails with EFBIG instead of killing it.
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // calls are allowed: signal and setrlimit are, and an io::Error from errno allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let limit = libc::rlimit { rlim_cur: 4096, rlim_max: 4096 };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let o = cmd.output().unwrap();
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    let records = json_lines(&o);
    assert_eq!(records.len(), 2, "every image is reported: {records:?}");
    for r in &records {
        assert_eq!(r["status"], "failed", "{r}");
        let err = r["error"].as_str().unwrap();
        assert!(err.contains(".npz") && err.to_lowercase().contains("too large"), "names the file and the reason: {err}");
    }
    for i in 0..2 {
        assert!(stderr.contains(&format!("p{i}.npz")), "{stderr}");
    }
    let files = tree(&out);
    assert!(files.iter().all(|f| !f.ends_with(".npz") && !f.contains("moge-tmp")), "{files:?}");
}

/// A full disk stops the batch (every later write would fail too) with exit 2 and a line that
/// names the file and says why, and leaves only whole files behind. Needs a small tmpfs, so it
/// runs where the test may mount one (root, as on the project's machines and CI).
#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_stops_the_batch_and_leaves_only_whole_files() {
    let m = models();
    let tmp = tempfile::tempdir().unwrap();
    let input = photos_40x30(tmp.path(), 6);
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // 80 KiB: room for two uncompressed npz files of 40x30 maps (~35 KiB each), not six.
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=80k", "tmpfs", s(&out)]).output();
    if !mounted.as_ref().is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: cannot mount a tmpfs here ({mounted:?})");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _guard = Unmount(&out);
    let o = run(&["batch", s(&input), "-o", s(&out), "--weights", s(&m.normal), "--num-tokens", TOKENS, "--npz-compression", "none", "--jobs", "1"]);
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("moge: stopped:") && stderr.contains(".npz"), "{stderr}");
    assert!(stderr.to_lowercase().contains("no space left"), "{stderr}");
    let files = tree(&out);
    assert!(files.iter().all(|f| !f.contains("moge-tmp")), "{files:?}");
    assert!(!files.is_empty() && files.len() < 6, "the disk holds some, not six: {files:?}");
    for f in &files {
        // What is there is whole: it reads back as an npz with every array.
        let n = read_npz(&out.join(f));
        assert_eq!(n.depth.dim(), (30, 40), "{f}");
    }
}
