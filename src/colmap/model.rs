//! A COLMAP sparse model as `cameras`, `images` and `points3D`, read from either of COLMAP's
//! formats (its "Output Format" description): `.txt` or `.bin` files in one folder. Rigs and
//! frames (COLMAP 3.12 and later) are not read: `images` still carries each image's pose.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::camera::Pinhole;

/// COLMAP's camera models by id, with their parameter counts (`colmap/sensor/models.h`).
pub const MODELS: [(&str, usize); 18] = [
    ("SIMPLE_PINHOLE", 3),
    ("PINHOLE", 4),
    ("SIMPLE_RADIAL", 4),
    ("RADIAL", 5),
    ("OPENCV", 8),
    ("OPENCV_FISHEYE", 8),
    ("FULL_OPENCV", 12),
    ("FOV", 5),
    ("SIMPLE_RADIAL_FISHEYE", 4),
    ("RADIAL_FISHEYE", 5),
    ("THIN_PRISM_FISHEYE", 12),
    ("RAD_TAN_THIN_PRISM_FISHEYE", 16),
    ("SIMPLE_DIVISION", 4),
    ("DIVISION", 5),
    ("SIMPLE_FISHEYE", 3),
    ("FISHEYE", 4),
    ("EUCM", 6),
    ("EQUIRECTANGULAR", 2),
];

#[derive(Debug, Clone, PartialEq)]
pub struct Camera {
    pub id: u32,
    /// Its model's name, as COLMAP writes it (`PINHOLE`, `OPENCV`, ...).
    pub model: String,
    pub width: u64,
    pub height: u64,
    pub params: Vec<f64>,
}

impl Camera {
    /// The pinhole camera this is, or why it is not one: SIMPLE_PINHOLE and PINHOLE, and the
    /// perspective models with distortion whose distortion terms are all zero (SIMPLE_RADIAL,
    /// RADIAL, OPENCV, FULL_OPENCV). Others need their photos undistorted first.
    pub fn pinhole(&self) -> Result<Pinhole, String> {
        let p = &self.params;
        let (k, distortion) = match self.model.as_str() {
            "SIMPLE_PINHOLE" if p.len() == 3 => ([p[0], p[0], p[1], p[2]], &p[3..]),
            "PINHOLE" if p.len() == 4 => ([p[0], p[1], p[2], p[3]], &p[4..]),
            "SIMPLE_RADIAL" | "RADIAL" if p.len() >= 4 => ([p[0], p[0], p[1], p[2]], &p[3..]),
            "OPENCV" | "FULL_OPENCV" if p.len() >= 8 => ([p[0], p[1], p[2], p[3]], &p[4..]),
            _ => {
                return Err(format!(
                    "camera {} is {} ({} parameters), not a pinhole camera: undistort the photos first (`colmap image_undistorter` writes PINHOLE cameras)",
                    self.id,
                    self.model,
                    p.len()
                ))
            }
        };
        if distortion.iter().any(|&d| d != 0.0) {
            return Err(format!(
                "camera {} is {} with distortion ({}): undistort the photos first (`colmap image_undistorter` writes PINHOLE cameras)",
                self.id,
                self.model,
                distortion.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
            ));
        }
        Pinhole::new(k).map_err(|why| format!("camera {}: {why}", self.id))
    }
}

/// A registered image: its pose (camera from world: x_cam = R(q) · x_world + t) and its 2D
/// points, each with the 3D point it observes (`None`: none).
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub id: u32,
    /// (w, x, y, z), as COLMAP writes it.
    pub q: [f64; 4],
    pub t: [f64; 3],
    pub camera_id: u32,
    /// Its path under the images folder.
    pub name: String,
    pub points2d: Vec<([f64; 2], Option<u64>)>,
}

impl Image {
    /// The rotation of `q` (normalised first), row-major.
    pub fn rotation(&self) -> [[f64; 3]; 3] {
        let n = self.q.iter().map(|v| v * v).sum::<f64>().sqrt();
        let [w, x, y, z] = self.q.map(|v| v / n);
        [
            [1.0 - 2.0 * (y * y + z * z), 2.0 * (x * y - w * z), 2.0 * (x * z + w * y)],
            [2.0 * (x * y + w * z), 1.0 - 2.0 * (x * x + z * z), 2.0 * (y * z - w * x)],
            [2.0 * (x * z - w * y), 2.0 * (y * z + w * x), 1.0 - 2.0 * (x * x + y * y)],
        ]
    }

    /// Where each 3D point this image observes lies: its pixel (x, y) in the image and its
    /// depth (z in the camera's frame), for the points `points` has.
    pub fn observations(&self, points: &HashMap<u64, [f64; 3]>) -> Vec<Observation> {
        let r = self.rotation();
        self.points2d
            .iter()
            .filter_map(|&(xy, id)| {
                let p = points.get(&id?)?;
                let z = r[2][0] * p[0] + r[2][1] * p[1] + r[2][2] * p[2] + self.t[2];
                Some(Observation { pixel: xy, depth: z })
            })
            .collect()
    }
}

/// A 3D point as one image sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// Pixels, the image's top-left corner at (0, 0).
    pub pixel: [f64; 2],
    /// Along the camera's axis, in the model's units.
    pub depth: f64,
}

/// The files a model was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Binary,
}

/// A sparse model.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub cameras: BTreeMap<u32, Camera>,
    pub images: BTreeMap<u32, Image>,
    pub points: HashMap<u64, [f64; 3]>,
    pub format: Format,
}

/// Reads `path` whole, up to `limit` bytes (a model's files are read into memory).
pub(super) fn read_file(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let len = std::fs::metadata(path).with_context(|| format!("{}: cannot read", path.display()))?.len();
    if len > limit {
        bail!("{}: {len} bytes, over the limit of {limit}", path.display());
    }
    std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))
}

/// Largest model file read: 16 GB (a city-scale points3D.bin).
pub(super) const MAX_FILE: u64 = 16 << 30;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rotation_of_a_quaternion() {
        let img = Image { id: 1, q: [0.0, 0.0, 0.0, 2.0], t: [0.0; 3], camera_id: 1, name: String::new(), points2d: vec![] };
        // 180° about z, q not normalised.
        let r = img.rotation();
        assert_eq!(r, [[-1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 1.0]]);
    }

    #[test]
    fn pinhole_cameras_and_those_that_are_not() {
        let cam = |model: &str, params: Vec<f64>| Camera { id: 3, model: model.into(), width: 64, height: 48, params };
        assert_eq!(cam("SIMPLE_PINHOLE", vec![50.0, 32.0, 24.0]).pinhole().unwrap(), Pinhole::new([50.0, 50.0, 32.0, 24.0]).unwrap());
        assert_eq!(cam("OPENCV", vec![50.0, 51.0, 32.0, 24.0, 0.0, 0.0, 0.0, 0.0]).pinhole().unwrap(), Pinhole::new([50.0, 51.0, 32.0, 24.0]).unwrap());
        let e = cam("OPENCV", vec![50.0, 51.0, 32.0, 24.0, -0.05, 0.0, 0.0, 0.0]).pinhole().unwrap_err();
        assert!(e.contains("camera 3 is OPENCV with distortion (-0.05, 0, 0, 0): undistort"), "{e}");
        let e = cam("OPENCV_FISHEYE", vec![50.0; 8]).pinhole().unwrap_err();
        assert!(e.contains("not a pinhole camera"), "{e}");
    }
}
