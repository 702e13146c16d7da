//! `--format mp4`: each video's frames, as they are finished, become `clip.depth.mp4` beside
//! its folder of frames: the depth colourised as `x.depth_vis.png` is (disparity through
//! Spectral), over one disparity range for the whole video (the first frame's), so that a
//! colour means one depth throughout; encoded by ffmpeg (H.264) at the rate of the frames taken.
//!
//! The encode threads finish frames out of order; frames are held until those before them
//! are in (or known to be missing: failed or skipped) and then written in order. The file is
//! written under a temporary name and renamed once every frame of the video is in; a run that
//! stops before leaves none.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::{Mutex, MutexGuard};

use anyhow::{bail, Context, Result};

use crate::image_io::video::ffmpeg;
use crate::outputs::vis;

/// One frame's depth map, (width, height, depth).
pub type Depth = (usize, usize, Vec<f32>);

/// The depth videos of a run, one per video (known by its input index).
#[derive(Default)]
pub struct DepthVideos {
    videos: Mutex<HashMap<usize, Video>>,
}

struct Video {
    path: PathBuf,
    /// Frames per second of the video written.
    rate: f64,
    /// The next frame to write, and those that came before their turn.
    next: u64,
    waiting: BTreeMap<u64, Option<Depth>>,
    /// How many frames the video has, once its reading is over.
    count: Option<u64>,
    writer: Option<Writer>,
    /// The first frame's disparity range, for every frame.
    range: Option<(f32, f32)>,
    /// What went wrong; the video is given up.
    failed: Option<String>,
    /// Frames left out by `--skip-existing` whose depth could not be read back.
    unread: u64,
}

struct Writer {
    /// Taken by `close`; one still here when dropped is stopped.
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    /// ffmpeg's messages, read as they come (a full pipe would stall it).
    log: Option<std::thread::JoinHandle<String>>,
    size: (usize, usize),
    tmp: PathBuf,
    /// The temporary file was renamed into place or removed.
    settled: bool,
}

impl Drop for Writer {
    fn drop(&mut self) {
        // A writer dropped before `close` (an error, a stop): no half-written video is left.
        if let Some(mut child) = self.child.take() {
            drop(self.stdin.take());
            let _ = child.kill();
            let _ = child.wait();
        }
        if !self.settled {
            let _ = std::fs::remove_file(&self.tmp);
            crate::outputs::pending(false, &self.tmp);
        }
    }
}

impl Writer {
    fn start(path: &Path, (w, h): (usize, usize), rate: f64) -> Result<Writer> {
        let tmp = path.with_extension("moge-tmp.mp4");
        // With `--format mp4` alone nothing else has made the folder.
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
            crate::outputs::written_into(dir);
        }
        // Removed by a second Ctrl-C, as every output's temporary file is.
        crate::outputs::pending(true, &tmp);
        let mut child = ffmpeg()?
            .args(["-nostdin", "-hide_banner", "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24"])
            .args(["-s", &format!("{w}x{h}"), "-framerate", &format!("{rate}"), "-i", "-"])
            // yuv420p needs even sides: the last row or column is repeated where one is odd.
            .args(["-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", "-c:v", "libx264", "-preset", "veryfast", "-crf", "18", "-pix_fmt", "yuv420p"])
            .args(["-f", "mp4"])
            .arg(&tmp)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start ffmpeg")?;
        let stdin = child.stdin.take();
        let log = child.stderr.take().map(|mut e| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = std::io::Read::read_to_string(&mut e, &mut s);
                s
            })
        });
        Ok(Writer { child: Some(child), stdin, log, size: (w, h), tmp, settled: false })
    }

    fn write(&mut self, rgb: &[u8]) -> Result<()> {
        let stdin = self.stdin.as_mut().context("ffmpeg's input is closed")?;
        if stdin.write_all(rgb).is_ok() {
            return Ok(());
        }
        // ffmpeg stopped: what it said is the reason.
        let (status, said) = self.end();
        bail!("ffmpeg stopped taking frames ({}): {said}", status.map_or("gone".to_owned(), |s| s.to_string()))
    }

    /// Closes ffmpeg's input and waits for it: its exit status and what it said.
    fn end(&mut self) -> (Option<std::process::ExitStatus>, String) {
        drop(self.stdin.take());
        let status = self.child.take().and_then(|mut c| c.wait().ok());
        let said = self.log.take().and_then(|h| h.join().ok()).unwrap_or_default();
        (status, said.trim().to_owned())
    }

    /// Ends the video and puts it in place (the temporary file is removed by `Drop` otherwise).
    fn close(mut self, path: &Path) -> Result<()> {
        match self.end() {
            (Some(s), _) if s.success() => {
                std::fs::rename(&self.tmp, path).with_context(|| format!("{}: cannot write", path.display()))?;
                self.settled = true;
                crate::outputs::pending(false, &self.tmp);
                Ok(())
            }
            (status, said) => bail!("ffmpeg failed ({}): {said}", status.map_or("gone".to_owned(), |s| s.to_string())),
        }
    }
}

impl DepthVideos {
    fn lock(&self) -> MutexGuard<'_, HashMap<usize, Video>> {
        self.videos.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A video's frames will come, to be written to `path` at `rate` frames per second.
    pub fn begin(&self, video: usize, path: PathBuf, rate: f64) {
        let v = Video { path, rate, next: 0, waiting: BTreeMap::new(), count: None, writer: None, range: None, failed: None, unread: 0 };
        self.lock().insert(video, v);
    }

    /// Frame `seq` of `video`: its depth, or `None` where it has none (failed, skipped).
    /// Returns what went wrong with the video, once.
    pub fn put(&self, video: usize, seq: u64, depth: Option<Depth>) -> Option<String> {
        let mut videos = self.lock();
        let v = videos.get_mut(&video)?;
        // Once per frame: a second word on one (a failure after it was handed in) is ignored.
        if seq >= v.next {
            v.waiting.entry(seq).or_insert(depth);
        }
        v.advance()
    }

    /// Frame `seq` of `video` was done by an earlier run (`--skip-existing`): its depth as read
    /// back from its npz, or `None` where there is none; the video is then not written, rather
    /// than written without that frame.
    pub fn put_done(&self, video: usize, seq: u64, depth: Option<Depth>) -> Option<String> {
        let mut videos = self.lock();
        let v = videos.get_mut(&video)?;
        v.unread += depth.is_none() as u64;
        v.waiting.insert(seq, depth);
        v.advance()
    }

    /// The reading of `video` is over: it has `count` frames.
    pub fn end(&self, video: usize, count: u64) -> Option<String> {
        let mut videos = self.lock();
        let v = videos.get_mut(&video)?;
        v.count = Some(count);
        v.advance()
    }

    /// The run is over: videos not finished are dropped (their temporary files with them);
    /// returns those, for a run that was not stopped, where every frame should have come.
    pub fn abandon(&self) -> Vec<PathBuf> {
        let unfinished = self.lock().drain().filter(|(_, v)| v.failed.is_none() && v.count != Some(v.next)).map(|(_, v)| v.path.clone()).collect();
        unfinished
    }
}

impl Video {
    /// Writes the frames that are next in order; closes the video after its last.
    fn advance(&mut self) -> Option<String> {
        if self.failed.is_some() {
            return None;
        }
        let result = (|| -> Result<()> {
            while let Some(frame) = self.waiting.remove(&self.next) {
                self.next += 1;
                let Some((w, h, depth)) = frame else { continue };
                // The first frame with a range (not black, not without valid depth) sets it.
                let range = self.range.unwrap_or_else(|| vis::disparity_range(&depth));
                if self.range.is_none() && range.0.is_finite() && range.1.is_finite() && range.0 < range.1 {
                    self.range = Some(range);
                }
                if self.writer.is_none() {
                    self.writer = Some(Writer::start(&self.path, (w, h), self.rate)?);
                }
                let writer = self.writer.as_mut().expect("started");
                if writer.size != (w, h) {
                    bail!("frame {} is {w}x{h}, the video's first {}x{}", self.next - 1, writer.size.0, writer.size.1);
                }
                writer.write(&vis::colorize_depth_in(&depth, range))?;
            }
            if self.count == Some(self.next) {
                if self.unread > 0 {
                    bail!("{} of its frames were done by an earlier run and have no npz to read their depth from (run without --skip-existing, or with npz among the formats)", self.unread);
                }
                if let Some(w) = self.writer.take() {
                    w.close(&self.path)?;
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => None,
            Err(e) => {
                self.writer = None;
                self.waiting.clear();
                let why = format!("{}: not written: {}", self.path.display(), crate::console::error_line(&e));
                self.failed = Some(why.clone());
                Some(why)
            }
        }
    }
}
