//! Seconds per `Model::infer` on one synthetic photo, for scripts/bench-cxx.sh, which runs it
//! beside the C++ library's `infer_rgb` (ffi/cxx/examples/bench.cpp) on the same pixels:
//!
//! `cargo run --release --example infer_bench -- MODEL WIDTH HEIGHT RUNS`
//!
//! f32 on the CPU, 1800 tokens; one call first (not timed), then RUNS timed calls; prints the
//! median in milliseconds.

use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, w, h, runs] = args.as_slice() else {
        anyhow::bail!("usage: infer_bench MODEL WIDTH HEIGHT RUNS");
    };
    let (w, h, runs): (u32, u32, usize) = (w.parse()?, h.parse()?, runs.parse()?);
    // The pixels ffi/cxx/examples/bench.cpp makes.
    let photo = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 255 / w) as u8, (y * 255 / h) as u8, ((x * 7 + y * 13) % 256) as u8]));
    let opts = moge::LoadOptions { precision: Some(moge::Precision::F32), device: moge::DeviceRequest::Cpu, ..Default::default() };
    let model = moge::load(model, &opts)?;
    let infer = moge::InferOptions { num_tokens: Some(moge::infer::DEFAULT_NUM_TOKENS), ..Default::default() };
    model.infer(&photo, &infer)?;
    let mut ms: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let pred = model.infer(&photo, &infer);
            let took = t.elapsed().as_secs_f64() * 1e3;
            pred.map(|_| took)
        })
        .collect::<anyhow::Result<_>>()?;
    ms.sort_by(f64::total_cmp);
    println!("{:.2}", ms[ms.len() / 2]);
    Ok(())
}
