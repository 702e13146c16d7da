//! What a run tells people and scripts, drawn here from what the library reports: the progress
//! bar, each image's error and warning lines, one JSON line per image (`--json`), the notices
//! between them, the summary line and the per-stage report of `--stats`.

use std::io::Write;

use moge::console::Notice;
use moge::pipeline::record::{Observer, Record};
use moge::pipeline::report::Summary;

/// The command line's observer of a run; `then` is the command's own use of each record.
pub struct Reporter<F> {
    bar: indicatif::ProgressBar,
    json: bool,
    then: F,
}

impl<F: FnMut(&Record)> Reporter<F> {
    /// A progress bar of `total` inputs where `progress` and stderr is a terminal.
    pub fn new(progress: bool, total: usize, json: bool, then: F) -> Self {
        Reporter { bar: progress_bar(progress, total), json, then }
    }
}

impl<F: FnMut(&Record)> Observer for Reporter<F> {
    fn record(&mut self, rec: Record, so_far: &Summary) {
        let pb = &self.bar;
        pb.set_length(so_far.total as u64);
        if let Some(w) = &rec.warning {
            pb.suspend(|| moge::errln!("moge: warning: {w}"));
        }
        if let Some(err) = &rec.error {
            pb.suspend(|| moge::errln!("moge: {err}"));
        }
        if self.json {
            json_line(&rec);
        }
        pb.suspend(|| (self.then)(&rec));
        pb.inc(1);
        if so_far.failed > 0 {
            pb.set_message(format!("{} failed", so_far.failed));
        }
    }

    fn notice(&mut self, notice: &Notice) {
        self.bar.suspend(|| moge::errln!("moge: {notice}"));
    }

    fn records_done(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// The image's line for `--json` on stdout. A closed stdout (`| head`) must not stop the batch.
fn json_line(rec: &Record) {
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
fn progress_bar(show: bool, total: usize) -> indicatif::ProgressBar {
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

/// A notice of the library's on stderr, as the run's are.
pub fn print_notice(notice: moge::console::Notice) {
    moge::errln!("moge: {notice}");
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
