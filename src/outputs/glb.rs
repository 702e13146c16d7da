//! `x.glb`: the textured mesh of upstream `moge infer --glb` as binary glTF 2.0: u32
//! indices, float POSITION / NORMAL / TEXCOORD_0, a PBR material (metallic 0.5, roughness
//! 1.0) whose base colour texture is the photo, embedded as PNG.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::Result;
use image::RgbImage;
use serde_json::{json, Value};

use super::edges::Surface;
use super::write_atomic;

const GLB_MAGIC: u32 = 0x4654_6C67; // "glTF"
const CHUNK_JSON: u32 = 0x4E4F_534A;
const CHUNK_BIN: u32 = 0x004E_4942;
const FLOAT: u32 = 5126;
const UNSIGNED_INT: u32 = 5125;
const ARRAY_BUFFER: u32 = 34962;
const ELEMENT_ARRAY_BUFFER: u32 = 34963;

/// The binary chunk and its views, each view 4-byte aligned.
struct Bin {
    data: Vec<u8>,
    views: Vec<Value>,
}

impl Bin {
    fn push(&mut self, bytes: &[u8], target: Option<u32>) -> usize {
        while !self.data.len().is_multiple_of(4) {
            self.data.push(0);
        }
        let mut v = json!({"buffer": 0, "byteOffset": self.data.len(), "byteLength": bytes.len()});
        if let Some(t) = target {
            v["target"] = json!(t);
        }
        self.data.extend_from_slice(bytes);
        self.views.push(v);
        self.views.len() - 1
    }
}

fn f32_bytes<const N: usize>(v: &[[f32; N]]) -> Vec<u8> {
    v.iter().flat_map(|a| a.iter().flat_map(|x| x.to_le_bytes())).collect()
}

fn bounds(v: &[[f32; 3]]) -> (Vec<f32>, Vec<f32>) {
    let mut lo = [f32::INFINITY; 3];
    let mut hi = [f32::NEG_INFINITY; 3];
    for p in v {
        for k in 0..3 {
            lo[k] = lo[k].min(p[k]);
            hi[k] = hi[k].max(p[k]);
        }
    }
    (lo.to_vec(), hi.to_vec())
}

/// The GLB bytes for `s` textured with `image`.
pub fn encode(s: &Surface, image: &RgbImage) -> Result<Vec<u8>> {
    let asset = json!({"version": "2.0", "generator": concat!("moge ", env!("CARGO_PKG_VERSION"))});
    let (doc, bin) = if s.triangles.is_empty() {
        // glTF forbids empty accessors: an image without a valid 2x2 block gives an empty scene.
        (json!({"asset": asset, "scene": 0, "scenes": [{"nodes": []}]}), Vec::new())
    } else {
        let mut bin = Bin { data: Vec::new(), views: Vec::new() };
        let idx: Vec<u8> = s.triangles.iter().flat_map(|t| t.iter().flat_map(|i| i.to_le_bytes())).collect();
        let v_idx = bin.push(&idx, Some(ELEMENT_ARRAY_BUFFER));
        let v_pos = bin.push(&f32_bytes(&s.positions), Some(ARRAY_BUFFER));
        let v_nrm = s.normals.as_ref().map(|n| bin.push(&f32_bytes(n), Some(ARRAY_BUFFER)));
        let v_uv = bin.push(&f32_bytes(&s.uvs), Some(ARRAY_BUFFER));
        let mut png = Vec::new();
        image.write_with_encoder(image::codecs::png::PngEncoder::new(&mut png))?;
        let v_img = bin.push(&png, None);

        let n = s.positions.len();
        let (lo, hi) = bounds(&s.positions);
        let mut accessors = vec![
            json!({"bufferView": v_idx, "componentType": UNSIGNED_INT, "count": 3 * s.triangles.len(), "type": "SCALAR"}),
            json!({"bufferView": v_pos, "componentType": FLOAT, "count": n, "type": "VEC3", "min": lo, "max": hi}),
            json!({"bufferView": v_uv, "componentType": FLOAT, "count": n, "type": "VEC2"}),
        ];
        let mut attributes = json!({"POSITION": 1, "TEXCOORD_0": 2});
        if let Some(v) = v_nrm {
            accessors.push(json!({"bufferView": v, "componentType": FLOAT, "count": n, "type": "VEC3"}));
            attributes["NORMAL"] = json!(3);
        }
        let doc = json!({
            "asset": asset,
            "scene": 0,
            "scenes": [{"nodes": [0]}],
            "nodes": [{"mesh": 0}],
            "meshes": [{"primitives": [{"attributes": attributes, "indices": 0, "material": 0, "mode": 4}]}],
            "materials": [{"pbrMetallicRoughness": {"baseColorTexture": {"index": 0}, "metallicFactor": 0.5, "roughnessFactor": 1.0}}],
            "textures": [{"source": 0}],
            "images": [{"bufferView": v_img, "mimeType": "image/png"}],
            "accessors": accessors,
            "bufferViews": bin.views,
            "buffers": [{"byteLength": bin.data.len()}],
        });
        (doc, bin.data)
    };

    let mut json_bytes = serde_json::to_vec(&doc)?;
    while json_bytes.len() % 4 != 0 {
        json_bytes.push(b' ');
    }
    let mut bin = bin;
    while bin.len() % 4 != 0 {
        bin.push(0);
    }
    let total = 12 + 8 + json_bytes.len() + if bin.is_empty() { 0 } else { 8 + bin.len() };
    let total = u32::try_from(total).map_err(|_| anyhow::anyhow!("the mesh is over the 4 GB limit of a GLB file"))?;
    let mut out = Vec::with_capacity(total as usize);
    for v in [GLB_MAGIC, 2, total, json_bytes.len() as u32, CHUNK_JSON] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&json_bytes);
    if !bin.is_empty() {
        out.extend_from_slice(&(bin.len() as u32).to_le_bytes());
        out.extend_from_slice(&CHUNK_BIN.to_le_bytes());
        out.extend_from_slice(&bin);
    }
    Ok(out)
}

pub fn write(path: &Path, s: &Surface, image: &RgbImage) -> Result<()> {
    let bytes = encode(s, image)?;
    write_atomic(path, |f| {
        let mut out = BufWriter::new(f);
        out.write_all(&bytes)?;
        out.flush()?;
        Ok(())
    })
}
