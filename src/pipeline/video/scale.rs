//! `--video-scale smooth`: MoGe-2 estimates the metric scale of each frame on its own, so it
//! flickers from frame to frame on a steady shot. Each frame's scale is replaced by a running
//! estimate over the frames before it: an exponential moving average of the log scale whose
//! weight decays with the time between frames (time constant `tau` seconds), so that the
//! result does not depend on the frame rate or on `--every` / `--fps`.
//!
//! The estimate of frame k needs the raw scales of frames 0..k in order, while the frames run
//! through the pipeline's threads in parallel. Two rules keep that deterministic and free of
//! deadlock: a video's frames enter the middle stage in their order (a decode thread waits for
//! its turn: [`ScaleSmoother::wait_turn`]), and the middle stage records each raw scale
//! ([`ScaleSmoother::resolve`]) before handing the frame on, so an encode thread that waits
//! for the frames before its own ([`ScaleSmoother::smoothed`]) waits only on work already in
//! the middle stage. A frame that fails before its forward is done, or is skipped, counts as
//! resolved without a scale and leaves the estimate as it was; one that fails after (writing
//! its outputs) has still moved the estimate, as a frame of the video that was seen.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// A frame's raw scale and time, as the middle stage saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Raw {
    pub scale: f32,
    pub time: Option<f64>,
}

/// The smoothed scales of the frames of every video of a run (a video is known by its input
/// index, a frame by its place among the video's frames taken).
pub struct ScaleSmoother {
    /// `None`: the frames are only kept in order, each value its own (`--video-fov smooth`
    /// without `--video-scale smooth` needs the order alone).
    tau: Option<f64>,
    tracks: Mutex<HashMap<usize, Track>>,
    changed: Condvar,
}

#[derive(Default)]
struct Track {
    /// Frames that have gone to the middle stage (or will never go), beyond `turn`.
    passed: BTreeSet<u64>,
    /// Every frame before this one has gone to the middle stage.
    turn: u64,
    /// Raw scales known, beyond `folded`.
    raw: BTreeMap<u64, Option<Raw>>,
    /// Every frame before this one is in the estimate.
    folded: u64,
    /// The estimate (log scale) and the time of the last frame in it.
    state: Option<(f64, Option<f64>)>,
    /// Smoothed scales not yet taken by their frame.
    smoothed: HashMap<u64, Option<f32>>,
}

/// How often a waiting thread looks whether the run has stopped.
const POLL: Duration = Duration::from_millis(50);

impl ScaleSmoother {
    /// `tau`: the time constant in seconds (how long ago a frame's weight fell to 1/e).
    pub fn new(tau: f64) -> Self {
        ScaleSmoother { tau: Some(tau.max(1e-6)), tracks: Mutex::default(), changed: Condvar::new() }
    }

    /// The frames kept in order, their values their own.
    pub fn ordering() -> Self {
        ScaleSmoother { tau: None, tracks: Mutex::default(), changed: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<usize, Track>> {
        self.tracks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until `cond` holds of the video's track; false if `halted` first.
    fn wait(&self, video: usize, halted: &dyn Fn() -> bool, cond: impl Fn(&Track) -> bool) -> bool {
        let mut tracks = self.lock();
        loop {
            if cond(tracks.entry(video).or_default()) {
                return true;
            }
            if halted() {
                return false;
            }
            tracks = self.changed.wait_timeout(tracks, POLL).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Waits until every frame before `seq` has gone to the middle stage; false if the run
    /// stopped first.
    pub fn wait_turn(&self, video: usize, seq: u64, halted: &dyn Fn() -> bool) -> bool {
        self.wait(video, halted, |t| t.turn >= seq)
    }

    /// Frame `seq` has gone to the middle stage, or never will.
    pub fn pass(&self, video: usize, seq: u64) {
        let mut tracks = self.lock();
        let t = tracks.entry(video).or_default();
        t.passed.insert(seq);
        while t.passed.remove(&t.turn) {
            t.turn += 1;
        }
        drop(tracks);
        self.changed.notify_all();
    }

    /// Frame `seq`'s raw scale, or `None` where it has none (failed, skipped). A frame is
    /// resolved once: later calls for it (a failure after it was resolved) change nothing.
    pub fn resolve(&self, video: usize, seq: u64, raw: Option<Raw>) {
        let mut tracks = self.lock();
        let t = tracks.entry(video).or_default();
        if seq < t.folded || t.raw.contains_key(&seq) {
            return;
        }
        t.raw.insert(seq, raw);
        while let Some(r) = t.raw.remove(&t.folded) {
            let value = r.map(|r| self.fold(&mut t.state, r));
            t.smoothed.insert(t.folded, value);
            t.folded += 1;
        }
        drop(tracks);
        self.changed.notify_all();
    }

    /// Adds a frame to the estimate; returns the frame's smoothed scale.
    fn fold(&self, state: &mut Option<(f64, Option<f64>)>, r: Raw) -> f32 {
        let Some(tau) = self.tau else { return r.scale };
        let x = (r.scale as f64).max(f64::MIN_POSITIVE).ln();
        let next = match *state {
            None => x,
            Some((s, last)) => {
                // Without times (a stream that has none), frames count as 1/25 s apart.
                let dt = match (last, r.time) {
                    (Some(a), Some(b)) => (b - a).max(0.0),
                    _ => 0.04,
                };
                let alpha = 1.0 - (-dt / tau).exp();
                s + alpha * (x - s)
            }
        };
        *state = Some((next, r.time));
        next.exp() as f32
    }

    /// Frame `seq`'s smoothed scale (`None` where it has no raw scale), once every frame
    /// before it is resolved; `None` if the run stopped first.
    pub fn smoothed(&self, video: usize, seq: u64, halted: &dyn Fn() -> bool) -> Option<Option<f32>> {
        if !self.wait(video, halted, |t| t.folded > seq) {
            return None;
        }
        Some(self.lock().get_mut(&video).and_then(|t| t.smoothed.remove(&seq)).flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNNING: &dyn Fn() -> bool = &|| false;

    fn raw(scale: f32, time: f64) -> Option<Raw> {
        Some(Raw { scale, time: Some(time) })
    }

    #[test]
    fn the_estimate_follows_the_frames_in_order_whatever_order_they_resolve_in() {
        let s = ScaleSmoother::new(1.0);
        // Frame 1 resolves first: frame 0 is still missing, so nothing is folded yet.
        s.resolve(0, 1, raw(4.0, 0.5));
        s.resolve(0, 0, raw(2.0, 0.0));
        assert_eq!(s.smoothed(0, 0, RUNNING), Some(Some(2.0)));
        // ln s1 = ln 2 + (1 - e^-0.5)(ln 4 - ln 2)
        let want = (2f64.ln() + (1.0 - (-0.5f64).exp()) * (4f64.ln() - 2f64.ln())).exp() as f32;
        assert!((s.smoothed(0, 1, RUNNING).flatten().unwrap() - want).abs() < 1e-6);
        // A failed frame leaves the estimate as it was and has no scale of its own.
        s.resolve(0, 2, None);
        s.resolve(0, 3, raw(4.0, 0.5));
        assert_eq!(s.smoothed(0, 2, RUNNING), Some(None));
        assert!((s.smoothed(0, 3, RUNNING).flatten().unwrap() - want).abs() < 1e-6, "no time passed since frame 1");
        // A frame resolved once is not resolved again (a failure after its value was in),
        // whether it is in the estimate yet or waits for the frames before it.
        s.resolve(0, 3, raw(50.0, 9.0));
        s.resolve(0, 5, raw(4.0, 0.5));
        s.resolve(0, 5, None);
        s.resolve(0, 4, raw(4.0, 0.5));
        assert!((s.smoothed(0, 4, RUNNING).flatten().unwrap() - want).abs() < 1e-6);
        assert!((s.smoothed(0, 5, RUNNING).flatten().unwrap() - want).abs() < 1e-6);
        // Another video has its own estimate.
        s.resolve(7, 0, raw(9.0, 3.0));
        assert_eq!(s.smoothed(7, 0, RUNNING), Some(Some(9.0)));
    }

    #[test]
    fn a_steady_scale_stays_and_a_jump_is_followed_at_the_time_constant() {
        let s = ScaleSmoother::new(0.5);
        for i in 0..10 {
            s.resolve(0, i, raw(3.0, i as f64 * 0.1));
            assert!((s.smoothed(0, i, RUNNING).flatten().unwrap() - 3.0).abs() < 1e-6);
        }
        // A jump to 6 held for one time constant covers 1 - 1/e of the way (in log scale).
        for i in 10..16 {
            s.resolve(0, i, raw(6.0, i as f64 * 0.1));
        }
        let got = s.smoothed(0, 14, RUNNING).flatten().unwrap() as f64;
        let want = (3f64.ln() + (1.0 - (-1f64).exp()) * 2f64.ln()).exp();
        assert!((got - want).abs() < 1e-4, "{got} vs {want}");
    }

    #[test]
    fn turns_pass_in_order_and_waits_end_when_the_run_stops() {
        let s = std::sync::Arc::new(ScaleSmoother::new(1.0));
        s.pass(0, 1);
        assert!(!s.wait_turn(0, 2, &|| true), "frame 0 has not gone yet");
        let t = {
            let s = s.clone();
            std::thread::spawn(move || s.wait_turn(0, 2, RUNNING))
        };
        s.pass(0, 0);
        assert!(t.join().unwrap());
        // Nothing resolved: a stopped run does not wait.
        assert_eq!(s.smoothed(0, 0, &|| true), None);
    }
}
