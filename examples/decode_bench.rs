//! Milliseconds to decode a photo, or a video's frame, as `moge batch` decodes them:
//!
//! `cargo run --release [--features heif] --example decode_bench -- RUNS FILE...`
//!
//! A photo (JPEG, PNG, HEIC, AVIF, ...) is decoded RUNS times by `moge::image_io`, after one
//! untimed decode; a video (by its extension) is read whole RUNS times through ffmpeg as
//! `moge batch` reads it, and its time is per frame. Prints the median and the spread.

use std::path::Path;
use std::time::Instant;

use moge::image_io::video::{is_video, Frames};
use moge::image_io::{load_rgb_with, DecodeOptions};

/// Milliseconds per photo, or per frame of a video; and the image size.
fn once(path: &Path) -> anyhow::Result<(f64, (u32, u32))> {
    let t = Instant::now();
    if !is_video(path) {
        let img = load_rgb_with(path, &DecodeOptions::default())?.image;
        return Ok((t.elapsed().as_secs_f64() * 1e3, img.dimensions()));
    }
    let mut frames = Frames::open(path)?;
    let (mut n, mut size) = (0, (0, 0));
    while let Some(f) = frames.next_frame()? {
        n += 1;
        size = f.image.dimensions();
    }
    frames.finish()?;
    Ok((t.elapsed().as_secs_f64() * 1e3 / n.max(1) as f64, size))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((runs, files)) = args.split_first() else {
        anyhow::bail!("usage: decode_bench RUNS FILE...");
    };
    let runs: usize = runs.parse()?;
    for f in files {
        let path = Path::new(f);
        once(path)?;
        let mut ms = Vec::with_capacity(runs);
        let mut size = (0, 0);
        for _ in 0..runs {
            let (t, s) = once(path)?;
            ms.push(t);
            size = s;
        }
        ms.sort_by(f64::total_cmp);
        let per = if is_video(path) { "per frame" } else { "per photo" };
        println!("{f}: {}x{}, median {:.1} ms {per} (min {:.1}, max {:.1}, {runs} runs)", size.0, size.1, ms[runs / 2], ms[0], ms[runs - 1]);
    }
    Ok(())
}
