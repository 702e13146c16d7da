//! `--format colmap`: the photo as a COLMAP text model, `x.colmap/{cameras,images,points3D}.txt`,
//! for tools that start from one (Gaussian-splatting trainers' initialisation, viewers): a
//! PINHOLE camera with MoGe's intrinsics, the image at the identity pose (the camera's frame is
//! the world), and the point map as 3D points, one per pixel on a grid of at most
//! [`MAX_POINTS`], each observed by the image at its pixel centre, coloured from the photo.

use std::io::Write;
use std::path::Path;

use anyhow::Result;
use image::RgbImage;

use super::write_atomic;
use crate::infer::Prediction;

/// The most 3D points written: the grid's step grows with the photo.
pub const MAX_POINTS: usize = 100_000;

/// The grid step that keeps a `w` x `h` photo within [`MAX_POINTS`].
pub fn step(w: usize, h: usize) -> usize {
    ((w * h) as f64 / MAX_POINTS as f64).sqrt().ceil().max(1.0) as usize
}

/// Writes `cameras`, `images` and `points3D` (the three paths, in that order) of `pred`, whose
/// photo is called `name` (COLMAP's image name) and is `image` (for the colours; grey without).
pub fn write(paths: [&Path; 3], pred: &Prediction, image: Option<&RgbImage>, name: &str) -> Result<()> {
    let (w, h) = (pred.width, pred.height);
    let k = pred.intrinsics_pixels();
    let s = step(w, h);
    // The points: every s-th pixel with a finite point, row by row.
    let mut chosen = Vec::new();
    for y in (s / 2..h).step_by(s) {
        for x in (s / 2..w).step_by(s) {
            let i = y * w + x;
            if pred.mask[i] && pred.points[3 * i..3 * i + 3].iter().all(|v| v.is_finite()) {
                chosen.push((x, y, i));
            }
        }
    }
    write_atomic(paths[0], |f| {
        let mut o = std::io::BufWriter::new(f);
        writeln!(o, "# Camera list with one line of data per camera:\n#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]\n# Number of cameras: 1")?;
        writeln!(o, "1 PINHOLE {w} {h} {} {} {} {}", k[0][0], k[1][1], k[0][2], k[1][2])?;
        o.flush()?;
        Ok(())
    })?;
    write_atomic(paths[1], |f| {
        let mut o = std::io::BufWriter::new(f);
        writeln!(
            o,
            "# Image list with two lines of data per image:\n#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME\n#   POINTS2D[] as (X, Y, POINT3D_ID)"
        )?;
        writeln!(o, "# Number of images: 1, mean observations per image: {}", chosen.len())?;
        writeln!(o, "1 1 0 0 0 0 0 0 1 {name}")?;
        for (n, &(x, y, _)) in chosen.iter().enumerate() {
            if n > 0 {
                o.write_all(b" ")?;
            }
            write!(o, "{} {} {}", x as f64 + 0.5, y as f64 + 0.5, n + 1)?;
        }
        writeln!(o)?;
        o.flush()?;
        Ok(())
    })?;
    write_atomic(paths[2], |f| {
        let mut o = std::io::BufWriter::new(f);
        writeln!(o, "# 3D point list with one line of data per point:\n#   POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] as (IMAGE_ID, POINT2D_IDX)")?;
        writeln!(o, "# Number of points: {}, mean track length: 1", chosen.len())?;
        for (n, &(x, y, i)) in chosen.iter().enumerate() {
            let p = &pred.points[3 * i..3 * i + 3];
            let [r, g, b] = image.filter(|im| im.width() as usize == w && im.height() as usize == h).map_or([128; 3], |im| im.get_pixel(x as u32, y as u32).0);
            writeln!(o, "{} {} {} {} {r} {g} {b} 0 1 {n}", n + 1, p[0], p[1], p[2])?;
        }
        o.flush()?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_grid_keeps_within_the_limit() {
        for (w, h) in [(64, 48), (1920, 1080), (4032, 3024), (316, 316)] {
            let s = super::step(w, h);
            assert!(w.div_ceil(s) * h.div_ceil(s) <= super::MAX_POINTS, "{w}x{h}: step {s}");
        }
        assert_eq!(super::step(64, 48), 1);
    }
}
