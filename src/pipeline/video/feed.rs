//! A video as the run's inputs: its frames fed one by one as ffmpeg decodes them, and what
//! the run's threads share of its videos (the scale smoothed from frame to frame, the depth
//! videos being written).

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use crossbeam_channel::Sender;

use super::depth;
use super::scale::ScaleSmoother;
use crate::console::Notice;
use crate::image_io::video::{Frames, Sampling};
use crate::outputs;
use crate::outputs::json::Timings;
use crate::pipeline::config::Config;
use crate::pipeline::inputs::{Input, VideoFrame};
use crate::pipeline::record::Record;
use crate::pipeline::shared::Shared;

impl<S> Shared<S> {
    /// `f(smoother, video, frame)` where the input is a frame whose scale is smoothed.
    pub(in crate::pipeline) fn smoothing(&self, input: &Input, f: impl FnOnce(&ScaleSmoother, usize, u64)) {
        if let (Some(s), Some(frame)) = (&self.smoother, &input.frame) {
            f(s, input.index, frame.seq)
        }
    }

    /// Hands a frame's depth (`None`: it has none) to its video's depth video, if one is made.
    pub(in crate::pipeline) fn to_depth_video(&self, input: &Input, depth: Option<depth::Depth>) {
        if let (Some(d), Some(frame)) = (&self.depth_videos, &input.frame) {
            self.video_error(d.put(input.index, frame.seq, depth));
        }
    }

    /// A depth video that could not be written: counted as a failed output, and said.
    pub(in crate::pipeline) fn video_error(&self, error: Option<String>) {
        if let Some(e) = error {
            self.video_errors.fetch_add(1, Ordering::Relaxed);
            self.notice(Notice::Error(e));
        }
    }

    /// A frame that will have no prediction (skipped, failed, dropped): the frames after it do
    /// not wait for it.
    pub(in crate::pipeline) fn frame_missing(&self, input: &Input) {
        self.smoothing(input, |s, video, seq| s.resolve(video, seq, None));
        self.fov_resolve(input, None);
        self.to_depth_video(input, None);
    }

    /// A frame's own tan(fov/2) for `--video-fov smooth` (`None`: it has none), where its
    /// field of view is smoothed.
    pub(in crate::pipeline) fn fov_resolve(&self, input: &Input, raw: Option<f32>) {
        if let (Some(s), Some(frame)) = (&self.fov_smoother, &input.frame) {
            s.resolve(input.index, frame.seq, raw.map(|scale| super::scale::Raw { scale, time: frame.time }));
        }
    }
}

/// The frames of `video` that `--every` / `--fps` take, each an input of its own. A video
/// that ffmpeg cannot read fails as one input; one that stops early keeps the frames it gave,
/// with a warning naming where it stopped.
pub(in crate::pipeline) fn feed_video<S>(cfg: &Config, shared: &Shared<S>, video: &Input, records: &Sender<Record>, hand_on: &impl Fn(Input) -> bool) -> bool {
    let mut frames = match Frames::open(&video.path) {
        Ok(f) => f,
        Err(e) => {
            let _ = records.send(Record::failed(video, &e, Timings::default()));
            return true;
        }
    };
    let mut take = cfg.frames.selector();
    let mut seq = 0;
    let mut cut = None;
    let mut capped = false;
    while !shared.halted() {
        if cfg.frames.first.is_some_and(|n| seq >= n) {
            capped = true;
            break;
        }
        match frames.next_frame() {
            Ok(Some(f)) if take(f.index, f.time) => {
                if seq > 0 {
                    shared.more.fetch_add(1, Ordering::Relaxed);
                } else if let Some(d) = &shared.depth_videos {
                    // A depth video already there is kept by --skip-existing.
                    let path = depth_video_path(cfg, video);
                    if !(cfg.skip_existing && path.exists()) {
                        d.begin(video.index, path, taken_rate(&cfg.frames, frames.frame_rate()));
                    }
                }
                if !hand_on(video.frame(VideoFrame::new(f, seq))) {
                    return false;
                }
                seq += 1;
            }
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                cut = Some(crate::console::error_line(&e));
                break;
            }
        }
    }
    if let Some(d) = &shared.depth_videos {
        shared.video_error(d.end(video.index, seq));
    }
    let warning = match frames.finish() {
        // A stop asked for ends the video early, and says nothing of it; so does the cap.
        _ if shared.halted() || capped => None,
        Ok(w) => cut.or(w),
        Err(e) if seq == 0 => {
            let _ = records.send(Record::failed(video, &e, Timings::default()));
            None
        }
        Err(e) => Some(crate::console::error_line(&e)),
    };
    if let Some(w) = warning {
        shared.notice(Notice::Warning(format!("{}: {w}", video.path.display())));
    }
    true
}

/// The depth of a frame done by an earlier run, read back from its npz.
pub(in crate::pipeline) fn done_depth(cfg: &Config, frame: &Input) -> Option<depth::Depth> {
    let npz = outputs::with_suffix(&cfg.stem(frame), outputs::FileKind::Npz.suffix());
    let p = crate::remote::read_prediction(&std::fs::read(npz).ok()?).ok()?;
    Some((p.width, p.height, p.depth))
}

/// `OUT/sub/clip.depth.mp4` for `DIR/sub/clip.mp4`.
fn depth_video_path(cfg: &Config, video: &Input) -> PathBuf {
    outputs::with_suffix(&cfg.stem(video), "depth.mp4")
}

/// Frames per second of the frames taken from a video of `rate` (25 where the video gives
/// none): every Nth of them, or at most `--fps`.
fn taken_rate(sampling: &Sampling, rate: Option<f64>) -> f64 {
    let rate = rate.unwrap_or(25.0) / sampling.every.max(1) as f64;
    sampling.fps.map_or(rate, |f| f.min(rate))
}
