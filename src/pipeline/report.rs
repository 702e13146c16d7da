//! What a run tells people and scripts: the progress bar, one JSON line per image, the
//! summary line and the per-stage report of `--stats`.

use std::io::Write;
use std::time::Duration;

use super::record::Record;

/// Busy time per stage, summed over images (seconds).
#[derive(Debug, Clone, Default)]
pub struct StageTotals {
    pub decode: f64,
    pub prepare: f64,
    pub forward: f64,
    pub postprocess: f64,
    pub write: f64,
}

impl StageTotals {
    pub(crate) fn add(&mut self, t: &crate::outputs::json::Timings) {
        self.decode += t.decode / 1e3;
        self.prepare += t.prepare / 1e3;
        self.forward += t.forward / 1e3;
        self.postprocess += t.postprocess / 1e3;
        self.write += t.write.unwrap_or(0.0) / 1e3;
    }
}

#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub total: usize,
    pub done: usize,
    pub failed: usize,
    pub skipped: usize,
    pub interrupted: bool,
    pub fatal: Option<String>,
    pub wall: Duration,
    pub stages: StageTotals,
    /// Back-to-back forwards on sample images after the run: (seconds per image, samples).
    pub forward_only: Option<(f64, usize)>,
    /// Valid pixels clamped in depth PNGs, over the run.
    pub depth_png_saturated: usize,
}

impl Summary {
    pub fn not_started(&self) -> usize {
        self.total - self.done - self.failed - self.skipped
    }
}

/// The image's line for `--json` on stdout. A closed stdout (`| head`) must not stop the batch.
pub(crate) fn json_line(rec: &Record) {
    let mut line = serde_json::json!({
        "input": rec.input.display().to_string(),
        "status": rec.status,
        "outputs": rec.outputs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "timings_ms": rec.timings,
        "error": rec.error,
        "warning": rec.warning,
    });
    if let Some((index, time)) = rec.frame {
        line["frame"] = serde_json::json!({"index": index, "time_s": time});
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let _ = writeln!(out, "{line}").and_then(|_| out.flush());
}

/// A progress bar on stderr where `show` and stderr is a terminal, else a hidden one.
pub(crate) fn progress_bar(show: bool, total: usize) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !show || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::with_draw_target(Some(total as u64), indicatif::ProgressDrawTarget::stderr());
    let style = indicatif::ProgressStyle::with_template("{elapsed_precise} {wide_bar} {pos}/{len} {rate} ETA {eta} {msg}")
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .with_key("rate", |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{:.2} images/s", s.per_sec());
        });
    pb.set_style(style);
    pb
}

/// The summary and (with `stats`) the per-stage report of a run with `jobs` host threads per
/// host stage, for stderr.
pub fn report(s: &Summary, jobs: usize, stats: bool) -> String {
    let wall = s.wall.as_secs_f64();
    let rate = if wall > 0.0 { s.done as f64 / wall } else { 0.0 };
    let mut out = format!(
        "moge: {} done, {} failed, {} skipped{} in {:.1} s ({:.2} images/s)",
        s.done,
        s.failed,
        s.skipped,
        if s.not_started() > 0 { format!(", {} not started", s.not_started()) } else { String::new() },
        wall,
        rate
    );
    if s.depth_png_saturated > 0 {
        out.push_str(&format!("; {} depth PNG values saturated", s.depth_png_saturated));
    }
    if stats && s.done > 0 {
        out.push_str(&stage_report(s, jobs, wall, rate));
    }
    out
}

fn stage_report(s: &Summary, jobs: usize, wall: f64, rate: f64) -> String {
    let n = s.done as f64;
    let st = &s.stages;
    let mut out = format!("\nmoge: stage busy time over {} images, {} host threads per host stage, wall {:.2} s:", s.done, jobs, wall);
    for (name, busy, threads) in [
        ("decode", st.decode, jobs),
        ("prepare", st.prepare, jobs),
        ("forward", st.forward, 1),
        ("postprocess", st.postprocess, jobs),
        ("write", st.write, jobs),
    ] {
        out.push_str(&format!(
            "\n  {name:<12} {busy:>9.3} s  {:>9.1} ms/image  {:>5.1} % of its threads' wall",
            busy / n * 1e3,
            100.0 * busy / (wall * threads as f64)
        ));
    }
    out.push_str(&format!("\n  device busy {:.1} % of wall", 100.0 * st.forward / wall));
    if let Some((per, k)) = s.forward_only {
        out.push_str(&format!(
            "\n  forward-only: {:.1} ms/image alone ({} of the images again, back to back, after the run) = {:.2} images/s; {:.1} ms/image inside the pipeline\n  batch / forward-only throughput: {:.1} %",
            per * 1e3,
            k,
            1.0 / per,
            st.forward / n * 1e3,
            100.0 * rate * per
        ));
    }
    out
}
