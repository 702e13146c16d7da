//! `split_panorama_image`: each view's pixels sampled from the equirectangular picture.

use image::RgbImage;
use rayon::prelude::*;

use super::cameras::{centres, spherical_uv, View};
use crate::geometry::remap;

/// Where view `view`'s `size` x `size` pixels fall in a `width` x `height` panorama, in its
/// pixels (float32, as upstream casts them for `cv2.remap`): (x map, y map).
pub fn view_map(view: &View, size: usize, width: usize, height: usize) -> (Vec<f32>, Vec<f32>) {
    let uv = centres(size);
    let mut mx = Vec::with_capacity(size * size);
    let mut my = Vec::with_capacity(size * size);
    for &v in &uv {
        for &u in &uv {
            let (su, sv) = spherical_uv(view.unproject(u as f64, v as f64));
            mx.push((su * width as f64 - 0.5) as f32);
            my.push((sv * height as f64 - 0.5) as f32);
        }
    }
    (mx, my)
}

/// The view's picture, bilinear with black outside (upstream's `cv2.remap` defaults).
pub fn view_image(panorama: &RgbImage, view: &View, size: usize) -> RgbImage {
    let (w, h) = (panorama.width() as usize, panorama.height() as usize);
    let (mx, my) = view_map(view, size, w, h);
    let px = remap::rgb8_linear(panorama.as_raw(), w, h, &mx, &my);
    RgbImage::from_raw(size as u32, size as u32, px).expect("size x size x 3 bytes")
}

/// Every view's picture, the views in parallel.
pub fn split(panorama: &RgbImage, views: &[View], size: usize) -> Vec<RgbImage> {
    views.par_iter().map(|v| view_image(panorama, v, size)).collect()
}
