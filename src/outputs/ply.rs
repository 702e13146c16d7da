//! `x.ply`: the point cloud of upstream `moge infer --ply` (trimesh's binary little-endian
//! layout): the vertices of the surface (edges removed, OpenGL axes), float x, y, z, float
//! nx, ny, nz (models with normals), uchar red, green, blue, alpha, and an empty face list.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::Result;

use super::edges::Surface;
use super::write_atomic;

pub fn write(path: &Path, s: &Surface) -> Result<()> {
    write_atomic(path, |f| {
        let mut out = BufWriter::with_capacity(1 << 20, f);
        let mut header =
            format!("ply\nformat binary_little_endian 1.0\ncomment written by moge {}\nelement vertex {}\n", env!("CARGO_PKG_VERSION"), s.positions.len());
        header.push_str("property float x\nproperty float y\nproperty float z\n");
        if s.normals.is_some() {
            header.push_str("property float nx\nproperty float ny\nproperty float nz\n");
        }
        header.push_str("property uchar red\nproperty uchar green\nproperty uchar blue\nproperty uchar alpha\n");
        header.push_str("element face 0\nproperty list uchar int vertex_indices\nend_header\n");
        out.write_all(header.as_bytes())?;
        let mut rec = Vec::with_capacity(28);
        for (i, p) in s.positions.iter().enumerate() {
            rec.clear();
            p.iter().for_each(|v| rec.extend_from_slice(&v.to_le_bytes()));
            if let Some(n) = &s.normals {
                n[i].iter().for_each(|v| rec.extend_from_slice(&v.to_le_bytes()));
            }
            rec.extend_from_slice(&s.colors[i]);
            rec.push(255);
            out.write_all(&rec)?;
        }
        out.flush()?;
        Ok(())
    })
}
