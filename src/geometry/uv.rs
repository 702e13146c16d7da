//! `normalized_view_plane_uv` and PyTorch's float32 `linspace`.

/// `torch.linspace(start, end, steps, dtype=float32)` on the CPU: the first half counts up from
/// `start`, the second half down from `end`, in float32.
pub fn linspace(start: f64, end: f64, steps: usize) -> Vec<f32> {
    let (start, end) = (start as f32, end as f32);
    match steps {
        0 => vec![],
        1 => vec![start],
        _ => {
            let step = (end - start) / (steps - 1) as f32;
            let half = steps / 2;
            (0..steps).map(|i| if i < half { start + step * i as f32 } else { end - step * (steps - 1 - i) as f32 }).collect()
        }
    }
}

/// UV of pixel centres on a plane whose half-diagonal is 1, for an image of aspect `aspect`
/// (W/H), sampled on a `width` x `height` grid. Returns (u per column, v per row).
pub fn view_plane_uv(width: usize, height: usize, aspect: f64) -> (Vec<f32>, Vec<f32>) {
    let span_x = aspect / (1.0 + aspect * aspect).sqrt();
    let span_y = 1.0 / (1.0 + aspect * aspect).sqrt();
    let ex = span_x * (width as f64 - 1.0) / width as f64;
    let ey = span_y * (height as f64 - 1.0) / height as f64;
    (linspace(-ex, ex, width), linspace(-ey, ey, height))
}

/// The same as planar (2, height, width) data: channel 0 is u, channel 1 is v.
pub fn view_plane_uv_planar(width: usize, height: usize, aspect: f64) -> Vec<f32> {
    let (u, v) = view_plane_uv(width, height, aspect);
    let mut out = Vec::with_capacity(2 * width * height);
    for _ in 0..height {
        out.extend_from_slice(&u);
    }
    for &vy in &v {
        out.extend(std::iter::repeat_n(vy, width));
    }
    out
}
