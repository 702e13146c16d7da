//! Frames of a video, decoded by the system's `ffmpeg` and read from its output as they come:
//! no folder of extracted frames, one frame in memory at a time on this side.
//!
//! ffmpeg writes each frame as a binary PPM (8-bit RGB, the video's rotation applied) on its
//! stdout, and its `showinfo` filter prints each frame's number and presentation time on
//! stderr, in the same order. The conversion to RGB is ffmpeg's own, so a frame here has the
//! samples of the PNG that `ffmpeg -i clip.mp4 -fps_mode passthrough -start_number 0
//! f%06d.png` writes of it.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{mpsc, Arc, OnceLock};
use std::thread::JoinHandle;

use anyhow::{bail, Context, Result};
use image::RgbImage;

/// Extensions read as videos (compared case-insensitively).
pub const EXTENSIONS: [&str; 12] = ["mp4", "m4v", "mov", "mkv", "webm", "avi", "mts", "m2ts", "mpg", "mpeg", "wmv", "3gp"];

pub fn is_video(p: &Path) -> bool {
    p.extension().and_then(|e| e.to_str()).is_some_and(|e| EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
}

/// Which frames of a video are taken.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sampling {
    /// Every Nth frame, from the first (`--every N`); 0 and 1 take every frame.
    pub every: u64,
    /// At most this many frames per second of the video's time (`--fps F`): the first frame at
    /// or after each 1/F s from the first frame's time.
    pub fps: Option<f64>,
    /// At most this many frames taken, from the first (a first pass over a video's start).
    pub first: Option<u64>,
}

impl Sampling {
    /// A filter over the frames in order: whether the frame `index` at `time` is taken.
    pub fn selector(self) -> impl FnMut(u64, Option<f64>) -> bool {
        let mut next: Option<(f64, f64)> = None; // (first frame's time, next time due)
        move |index, time| {
            if self.every > 1 && index % self.every != 0 {
                return false;
            }
            let (Some(fps), Some(t)) = (self.fps, time) else { return true };
            let period = 1.0 / fps;
            match next {
                None => {
                    next = Some((t, t + period));
                    true
                }
                // A thousandth of a period of slack absorbs timestamps rounded to the time base.
                Some((t0, due)) if t >= due - period * 1e-3 => {
                    let k = ((t - t0) / period + 1e-3).floor() + 1.0;
                    next = Some((t0, t0 + k * period));
                    true
                }
                Some(_) => false,
            }
        }
    }
}

/// One decoded frame.
pub struct Frame {
    /// Its number in the video, from 0, counting every frame decoded.
    pub index: u64,
    /// Its presentation time in seconds, where ffmpeg gave one.
    pub time: Option<f64>,
    pub image: RgbImage,
    /// Milliseconds spent waiting for it from ffmpeg.
    pub read_ms: f64,
}

/// A command running the ffmpeg found on PATH (or an error saying how to get one), in its
/// own process group: a Ctrl-C at the terminal stops moge, which then stops ffmpeg, rather
/// than ffmpeg ending a video early as if it were cut or leaving one half-written. Its log
/// lines are plain (no colour codes in what is parsed).
pub fn ffmpeg() -> Result<Command> {
    let path = which::which("ffmpeg").map_err(|_| {
        anyhow::anyhow!(
            "videos are decoded by ffmpeg, which is not on PATH: install it (Debian and Ubuntu: apt install ffmpeg; Fedora: dnf install ffmpeg; macOS: brew install ffmpeg)"
        )
    })?;
    let mut command = Command::new(path);
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    command.env("AV_LOG_FORCE_NOCOLOR", "1").env_remove("AV_LOG_FORCE_COLOR");
    Ok(command)
}

/// The frames of one video, in order, from a running ffmpeg. Dropping it stops ffmpeg.
pub struct Frames {
    child: Child,
    stdout: BufReader<ChildStdout>,
    /// Each frame's time, in the frames' order.
    times: mpsc::Receiver<Option<f64>>,
    /// Frames per second, as the stream declares it.
    rate: Arc<OnceLock<f64>>,
    log: Option<JoinHandle<Vec<String>>>,
    /// Frames read so far (the last one's number is one less), and the last one's time.
    read: u64,
    last_time: Option<f64>,
    /// ffmpeg's output came to its end (`Some(true)`), or stopped inside a frame (`Some(false)`).
    ended: Option<bool>,
}

impl Frames {
    /// Starts ffmpeg on `path`. Errors: ffmpeg missing, or not startable.
    pub fn open(path: &Path) -> Result<Frames> {
        let mut child = ffmpeg()?
            .args(["-nostdin", "-hide_banner", "-nostats", "-loglevel", "level+info", "-i"])
            .arg(path)
            // The first video stream; frames as decoded (no frame-rate conversion); 8-bit RGB.
            .args(["-map", "0:v:0", "-vf", "showinfo=checksum=0", "-fps_mode", "passthrough", "-an", "-sn", "-dn"])
            .args(["-pix_fmt", "rgb24", "-f", "image2pipe", "-c:v", "ppm", "-"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start ffmpeg")?;
        let stdout = BufReader::with_capacity(1 << 20, child.stdout.take().expect("piped"));
        let stderr = child.stderr.take().expect("piped");
        let (tx, times) = mpsc::channel();
        let rate = Arc::new(OnceLock::new());
        let log_rate = rate.clone();
        let log = std::thread::Builder::new().name("moge-ffmpeg-log".into()).spawn(move || read_log(stderr, tx, &log_rate)).context("cannot start a thread")?;
        Ok(Frames { child, rate, stdout, times, log: Some(log), read: 0, last_time: None, ended: None })
    }

    /// The next frame; `Ok(None)` at the end of what ffmpeg decoded.
    pub fn next_frame(&mut self) -> Result<Option<Frame>> {
        if self.ended.is_some() {
            return Ok(None);
        }
        let started = std::time::Instant::now();
        let image = match read_ppm(&mut self.stdout) {
            Ok(Some(img)) => img,
            Ok(None) => {
                self.ended = Some(true);
                return Ok(None);
            }
            Err(e) => {
                // A frame cut short, or one this reader refuses: the frames before it stand.
                self.ended = Some(false);
                return Err(e.context(format!("ffmpeg's output stopped inside frame {}", self.read)));
            }
        };
        // Frames are numbered here, as they come: showinfo's own count restarts where ffmpeg
        // rebuilds its filters (a stream that changes size midway). Its time for the frame was
        // printed before the frame was written, so it is there or never will be; a bound
        // keeps a log line that did not parse from stalling the run.
        let time = self.times.recv_timeout(std::time::Duration::from_secs(10)).ok().flatten();
        let index = self.read;
        self.read += 1;
        self.last_time = time;
        Ok(Some(Frame { index, time, image, read_ms: started.elapsed().as_secs_f64() * 1e3 }))
    }

    /// The stream's frame rate, once its first frame is read (where ffmpeg gave one).
    pub fn frame_rate(&self) -> Option<f64> {
        self.rate.get().copied()
    }

    /// Stops reading and says how the video ended: `None` if ffmpeg decoded it to the end
    /// without an error, else what went wrong and after which frame.
    pub fn finish(mut self) -> Result<Option<String>> {
        // Whatever is left unread is not wanted: stop ffmpeg rather than drain it (it would
        // block on a full pipe).
        if self.ended != Some(true) {
            let _ = self.child.kill();
        }
        let status = self.child.wait().context("ffmpeg")?;
        let errors = self.log.take().and_then(|h| h.join().ok()).unwrap_or_default();
        if self.ended.is_none() {
            return Ok(None);
        }
        let at = match (self.read.checked_sub(1), self.last_time) {
            (Some(i), Some(t)) => format!("after frame {i}, at {t:.3} s"),
            (Some(i), None) => format!("after frame {i}"),
            (None, _) => "before its first frame".to_owned(),
        };
        let why = errors.first().cloned().or_else(|| (!status.success()).then(|| format!("ffmpeg exited with {status}")));
        if self.read == 0 {
            bail!("cannot read the video: {}", why.unwrap_or_else(|| "ffmpeg decoded no frame".into()));
        }
        Ok(why.map(|w| format!("the video is damaged or cut short: it stops {at}, {} frames read; ffmpeg: {w}", self.read)))
    }
}

impl Drop for Frames {
    fn drop(&mut self) {
        if self.log.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Reads ffmpeg's stderr to its end: each frame's time to `times`, and returns
/// the error lines (without their `[... @ 0x...]` prefixes).
fn read_log(stderr: impl Read, times: mpsc::Sender<Option<f64>>, rate: &OnceLock<f64>) -> Vec<String> {
    let mut errors = Vec::new();
    for line in BufReader::new(stderr).split(b'\n') {
        let Ok(line) = line else { break };
        let line = String::from_utf8_lossy(&line);
        if let Some(r) = showinfo_rate(&line) {
            let _ = rate.set(r);
        } else if let Some((_, time)) = showinfo_frame(&line) {
            let _ = times.send(time);
        } else if let Some(at) = line.find("[error] ").or_else(|| line.find("[fatal] ")) {
            if errors.len() < 8 {
                errors.push(line[at + 8..].trim().to_owned());
            }
        }
    }
    errors
}

/// `frame_rate: 30000/1001` of showinfo's line on its input, in frames per second.
fn showinfo_rate(line: &str) -> Option<f64> {
    if !line.contains("showinfo") || !line.contains("config in") {
        return None;
    }
    let r = line[line.find("frame_rate:")? + 11..].split_whitespace().next()?.trim_end_matches(',');
    let (n, d) = r.split_once('/')?;
    let v = n.parse::<f64>().ok()? / d.parse::<f64>().ok()?;
    (v.is_finite() && v > 0.0).then_some(v)
}

/// `n: 12 pts: 6144 pts_time:0.48 ...` of a showinfo line: the frame's number and time.
fn showinfo_frame(line: &str) -> Option<(u64, Option<f64>)> {
    if !line.contains("showinfo") {
        return None;
    }
    let rest = &line[line.find(" n:")? + 3..];
    let n = rest.split_whitespace().next()?.parse().ok()?;
    let time = line.find("pts_time:").and_then(|p| line[p + 9..].split_whitespace().next()).and_then(|t| t.parse::<f64>().ok()).filter(|t| t.is_finite());
    Some((n, time))
}

/// One binary PPM (`P6 W H 255`, then W*H*3 bytes); `None` at a clean end of the stream.
fn read_ppm(r: &mut impl BufRead) -> Result<Option<RgbImage>> {
    if r.fill_buf()?.is_empty() {
        return Ok(None);
    }
    let mut fields = [0u32; 3];
    let mut magic = [0u8; 2];
    r.read_exact(&mut magic)?;
    if &magic != b"P6" {
        bail!("not a PPM frame");
    }
    for f in &mut fields {
        *f = header_number(r)?;
    }
    let [w, h, max] = fields;
    if max != 255 || w == 0 || h == 0 || w as u64 * h as u64 > super::MAX_PIXELS {
        bail!("unexpected frame header {w}x{h}, maximum {max}");
    }
    let mut data = vec![0u8; w as usize * h as usize * 3];
    r.read_exact(&mut data)?;
    Ok(Some(RgbImage::from_raw(w, h, data).expect("sized")))
}

/// A decimal field of a PPM header after its whitespace; consumes the one whitespace after it.
fn header_number(r: &mut impl BufRead) -> Result<u32> {
    let mut byte = [0u8; 1];
    let mut value: Option<u32> = None;
    loop {
        r.read_exact(&mut byte)?;
        match byte[0] {
            b'0'..=b'9' => value = Some(value.unwrap_or(0).checked_mul(10).and_then(|v| v.checked_add((byte[0] - b'0') as u32)).context("header field")?),
            c if c.is_ascii_whitespace() => {
                if let Some(v) = value {
                    return Ok(v);
                }
            }
            _ => bail!("bad PPM header"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ppm_frames_are_read_back_to_back() {
        let mut stream = Vec::new();
        for v in [10u8, 20] {
            stream.extend_from_slice(b"P6\n3 2\n255\n");
            stream.extend(std::iter::repeat_n(v, 18));
        }
        let mut r = std::io::Cursor::new(stream);
        assert_eq!(read_ppm(&mut r).unwrap().unwrap().get_pixel(2, 1).0, [10; 3]);
        let second = read_ppm(&mut r).unwrap().unwrap();
        assert_eq!((second.width(), second.height(), second.get_pixel(0, 0).0), (3, 2, [20; 3]));
        assert!(read_ppm(&mut r).unwrap().is_none());
        // Cut inside the pixels: an error, not a short frame.
        let mut cut = std::io::Cursor::new(b"P6\n3 2\n255\n\x01\x02".to_vec());
        assert!(read_ppm(&mut cut).is_err());
    }

    #[test]
    fn showinfo_lines_give_number_and_time() {
        let l = "[Parsed_showinfo_0 @ 0x55ed4d1a6f40] [info] n:  12 pts:   6144 pts_time:0.48    pos:    10516 fmt:yuv420p";
        assert_eq!(showinfo_frame(l), Some((12, Some(0.48))));
        assert_eq!(showinfo_frame("[Parsed_showinfo_0 @ 0x1] [info] config in time_base: 1/12800, frame_rate: 25/1"), None);
        assert_eq!(showinfo_frame("[Parsed_showinfo_0 @ 0x1] [info] n:   3 pts: NOPTS pts_time:NOPTS pos: -1"), Some((3, None)));
        let config = "[Parsed_showinfo_0 @ 0x1] [info] config in time_base: 1/30000, frame_rate: 30000/1001";
        assert!((showinfo_rate(config).unwrap() - 29.97).abs() < 1e-3);
        assert_eq!(showinfo_rate("[Parsed_showinfo_0 @ 0x1] [info] config out time_base: 0/0, frame_rate: 0/0"), None);
    }

    #[test]
    fn sampling_by_count_and_by_rate() {
        let take = |s: Sampling, times: &[f64]| -> Vec<u64> {
            let mut sel = s.selector();
            (0..times.len() as u64).filter(|&i| sel(i, Some(times[i as usize]))).collect()
        };
        let at30: Vec<f64> = (0..30).map(|i| i as f64 / 30.0).collect();
        assert_eq!(take(Sampling { every: 10, fps: None, first: None }, &at30), [0, 10, 20]);
        assert_eq!(take(Sampling::default(), &at30).len(), 30);
        // 30 fps down to 4: frames at 0, 0.25, 0.5, 0.75 s (8 of 30 frames apart, rounded up).
        assert_eq!(take(Sampling { every: 0, fps: Some(4.0), first: None }, &at30), [0, 8, 15, 23]);
        // A rate above the video's takes every frame.
        assert_eq!(take(Sampling { every: 0, fps: Some(60.0), first: None }, &at30).len(), 30);
        // Irregular times (variable frame rate): one per period, the first at or after it.
        assert_eq!(take(Sampling { every: 0, fps: Some(1.0), first: None }, &[0.1, 0.7, 1.05, 1.2, 2.5, 2.9, 3.1]), [0, 3, 4, 6]);
    }
}
