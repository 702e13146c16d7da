//! Which photos a run processes and where their outputs go: directories walked recursively
//! (sorted, hidden entries skipped, image and video extensions only), explicit lists, and a
//! deterministic shard of the whole set (a video's frames stay together in its shard).

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use image::RgbImage;

use anyhow::{bail, Context, Result};

use crate::console::Notice;

/// Extensions taken from directories (compared case-insensitively). HEIC/HEIF and AVIF, which
/// this build does not decode, are taken too, so that a phone's photos are each reported with
/// what to do rather than skipped without a word.
pub const EXTENSIONS: [&str; 10] = ["jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "heic", "heif", "avif"];

/// One photo to process: a file, or a frame of a video.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    /// The photo's file, or the video's.
    pub path: PathBuf,
    /// The output stem relative to the output directory: `sub/x` for `DIR/sub/x.jpg`,
    /// `sub/clip/000012` for frame 12 of `DIR/sub/clip.mp4`.
    pub rel: PathBuf,
    /// Set when this input cannot be processed before it starts (e.g. an output-name clash).
    pub problem: Option<String>,
    /// Its place in the run's list, set by the run (its records carry it; a video's frames
    /// share the video's).
    pub index: usize,
    /// The frame, where the input is one frame of the video at `path`.
    pub frame: Option<VideoFrame>,
    /// Its own camera (`--intrinsics-from`), used whole in place of the run's.
    pub camera: Option<crate::camera::Pinhole>,
    /// Its camera's field of view (and scale) shared with its folder or video (`--camera shared`).
    pub shared: Option<std::sync::Arc<crate::camera::SharedCamera>>,
}

/// A frame of a video as an input of its own, made by the run as it reads the video.
#[derive(Clone)]
pub struct VideoFrame {
    /// Its number in the video (every decoded frame counted, from 0).
    pub index: u64,
    /// Its presentation time, seconds.
    pub time: Option<f64>,
    /// Its place among the frames taken from the video (0, 1, 2, ...).
    pub seq: u64,
    /// Milliseconds that ffmpeg took to hand it over (its decode time).
    pub read_ms: f64,
    /// The decoded pixels, handed to the decode thread that takes them.
    pub pixels: Arc<Mutex<Option<RgbImage>>>,
}

impl VideoFrame {
    pub fn new(frame: crate::image_io::video::Frame, seq: u64) -> Self {
        VideoFrame { index: frame.index, time: frame.time, seq, read_ms: frame.read_ms, pixels: Arc::new(Mutex::new(Some(frame.image))) }
    }

    /// The pixels, once: a second call is an error (no input is decoded twice).
    pub fn take_pixels(&self) -> Result<RgbImage> {
        self.pixels.lock().unwrap_or_else(|e| e.into_inner()).take().context("the frame's pixels were already used")
    }
}

impl std::fmt::Debug for VideoFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VideoFrame").field("index", &self.index).field("time", &self.time).field("seq", &self.seq).finish_non_exhaustive()
    }
}

impl PartialEq for VideoFrame {
    fn eq(&self, other: &Self) -> bool {
        (self.index, self.seq) == (other.index, other.seq) && self.time.map(f64::to_bits) == other.time.map(f64::to_bits)
    }
}

impl Eq for VideoFrame {}

impl Input {
    /// How messages name the input: its path, and the frame of a video.
    pub fn name(&self) -> String {
        match &self.frame {
            Some(f) => format!("{} frame {}{}", self.path.display(), f.index, f.time.map(|t| format!(" ({t:.3} s)")).unwrap_or_default()),
            None => self.path.display().to_string(),
        }
    }

    /// Whether this is a video that the run reads frame by frame.
    pub fn is_video(&self) -> bool {
        self.frame.is_none() && crate::image_io::video::is_video(&self.path)
    }

    /// The input of one frame of this video: its outputs in a folder named after the video.
    pub fn frame(&self, frame: VideoFrame) -> Input {
        let rel = self.rel.join(format!("{:06}", frame.index));
        Input { path: self.path.clone(), rel, problem: None, index: self.index, frame: Some(frame), camera: self.camera, shared: self.shared.clone() }
    }

    /// The photo decoded: the file read, or the frame's pixels taken.
    /// The run's decode options for this input: with its own camera, where it has one.
    pub fn decode_options<'a>(&self, opts: &'a crate::image_io::DecodeOptions) -> std::borrow::Cow<'a, crate::image_io::DecodeOptions> {
        use crate::image_io::{DecodeOptions, FovFrom};
        match (self.camera, &self.shared) {
            (Some(k), _) => std::borrow::Cow::Owned(DecodeOptions { fov: FovFrom::Intrinsics(k), ..opts.clone() }),
            (None, Some(s)) => std::borrow::Cow::Owned(DecodeOptions { fov: FovFrom::Shared(s.fov_x), ..opts.clone() }),
            (None, None) => std::borrow::Cow::Borrowed(opts),
        }
    }

    pub fn decode(&self, opts: &crate::image_io::DecodeOptions) -> Result<crate::image_io::Decoded> {
        let opts = &*self.decode_options(opts);
        match &self.frame {
            Some(f) => crate::image_io::from_pixels(f.take_pixels()?, opts).with_context(|| self.name()),
            None => crate::image_io::load_rgb_with(&self.path, opts),
        }
    }
}

pub fn has_image_extension(p: &Path) -> bool {
    p.extension().and_then(|e| e.to_str()).is_some_and(|e| EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
}

/// A photo or a video, by its extension.
fn is_input_file(p: &Path) -> bool {
    has_image_extension(p) || crate::image_io::video::is_video(p)
}

fn is_hidden(name: &std::ffi::OsStr) -> bool {
    name.to_string_lossy().starts_with('.')
}

/// The stem relative to the output directory, with only normal components (no root, no
/// `..`), so no output can land outside it.
pub fn rel_stem(rel: &Path) -> PathBuf {
    let mut out: PathBuf = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s),
            _ => None,
        })
        .collect();
    if let Some(stem) = out.file_stem().map(|s| s.to_owned()) {
        out.set_file_name(stem);
    }
    out
}

/// Every image under `root`, recursively, in sorted order of the relative path. The
/// directory `skip` (the output directory, when it lies inside the tree) is left out, so
/// that a second run does not take the outputs of the first for photos. An unreadable
/// subdirectory is told to `notify`, and the rest of the tree is still used.
pub fn walk(root: &Path, skip: Option<&Path>, notify: &dyn Fn(Notice)) -> Result<Vec<Input>> {
    let mut out = Vec::new();
    let walker = walkdir::WalkDir::new(root).follow_links(true).sort_by_file_name().into_iter();
    let skipped = |e: &walkdir::DirEntry| e.file_type().is_dir() && skip.is_some_and(|s| e.path().canonicalize().is_ok_and(|c| c == s));
    // The root itself may be hidden (`./.photos`); only entries below it are filtered.
    for entry in walker.filter_entry(|e| e.depth() == 0 || !(is_hidden(e.file_name()) || skipped(e))) {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                let path = e.path().map(|p| p.display().to_string()).unwrap_or_else(|| root.display().to_string());
                notify(Notice::Error(format!("{path}: cannot read ({})", e.io_error().map(|x| x.to_string()).unwrap_or_else(|| e.to_string()))));
                continue;
            }
        };
        if entry.file_type().is_file() && is_input_file(entry.path()) {
            let rel = entry.path().strip_prefix(root).unwrap_or(entry.path());
            out.push(Input { path: entry.path().to_owned(), rel: rel_stem(rel), problem: None, index: 0, frame: None, camera: None, shared: None });
        }
    }
    Ok(out)
}

/// One file given by name: its outputs go to the top of the output directory.
pub fn file_input(p: &Path) -> Input {
    let name = p.file_name().map(PathBuf::from).unwrap_or_else(|| p.to_owned());
    Input { path: p.to_owned(), rel: rel_stem(&name), problem: None, index: 0, frame: None, camera: None, shared: None }
}

/// Inputs from command-line paths: directories are walked (leaving out `skip`), files are
/// taken as given (their outputs go to the top of the output directory); see [`walk`] for
/// `notify`.
pub fn from_args(paths: &[PathBuf], skip: Option<&Path>, notify: &dyn Fn(Notice)) -> Result<Vec<Input>> {
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).with_context(|| format!("{}: cannot read", p.display()))?;
        if meta.is_dir() {
            out.extend(walk(p, skip, notify)?);
        } else {
            out.push(file_input(p));
        }
    }
    Ok(out)
}

/// Inputs from a list file (or stdin for `-`): one path per line, blank lines and lines
/// starting with `#` skipped. A relative path keeps its directories in the output tree.
pub fn from_list(list: &Path) -> Result<Vec<Input>> {
    let reader: Box<dyn BufRead> = if list == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        let f = std::fs::File::open(list).with_context(|| format!("{}: cannot open the list", list.display()))?;
        Box::new(std::io::BufReader::new(f))
    };
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("{}: cannot read line {}", list.display(), i + 1))?;
        let t = line.trim_end_matches(['\r', '\n']);
        if t.trim().is_empty() || t.trim_start().starts_with('#') {
            continue;
        }
        let p = PathBuf::from(t);
        out.push(Input { rel: rel_stem(&p), path: p, problem: None, index: 0, frame: None, camera: None, shared: None });
    }
    Ok(out)
}

/// Marks every input whose output stem was already taken by an earlier one (`x.jpg` and
/// `x.png` in one directory, or the same relative path under two roots).
pub fn mark_collisions(inputs: &mut [Input]) {
    let mut seen: HashMap<PathBuf, PathBuf> = HashMap::new();
    for inp in inputs.iter_mut() {
        match seen.get(&inp.rel) {
            Some(first) => {
                inp.problem = Some(format!("its outputs ({}.*) would overwrite those of {}; rename one of them", inp.rel.display(), first.display()))
            }
            None => {
                seen.insert(inp.rel.clone(), inp.path.clone());
            }
        }
    }
}

/// `--shard I/N`: this machine's share is the inputs whose output stem hashes to I mod N.
/// Hashing the stem (not the position in the list) keeps the assignment stable when photos
/// are added or the list is built in another order or on another mount point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: u64,
    pub count: u64,
}

/// `auto` and `auto/N`: the shard from the scheduler's environment, read by [`Shard::from_env`].
impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(rest) = s.strip_prefix("auto") {
            let count = match rest.strip_prefix('/') {
                Some(n) => Some(n.trim().parse::<u64>().map_err(|_| format!("'{n}' is not a shard count"))?),
                None if rest.is_empty() => None,
                None => return Err(format!("'{s}' is not auto, auto/N or I/N")),
            };
            return Shard::from_env(count, |k| std::env::var(k).ok());
        }
        let (i, n) = s.split_once('/').ok_or_else(|| format!("'{s}' is not I/N (e.g. 0/4)"))?;
        let index: u64 = i.trim().parse().map_err(|_| format!("'{i}' is not a shard index"))?;
        let count: u64 = n.trim().parse().map_err(|_| format!("'{n}' is not a shard count"))?;
        if count == 0 || index >= count {
            return Err(format!("shard {index}/{count}: need 0 <= I < N"));
        }
        Ok(Shard { index, count })
    }
}

/// FNV-1a over the stem with `/` separators: the same on every platform and run.
pub fn stem_hash(rel: &Path) -> u64 {
    let s: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.join("/").bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Shard {
    /// The shard of this task under a scheduler, from `env` (the process environment):
    /// - a Slurm job array: `SLURM_ARRAY_TASK_ID` from `SLURM_ARRAY_TASK_MIN` (arrays may start
    ///   at 1) and `SLURM_ARRAY_TASK_COUNT` tasks (`count`, where given, must agree);
    /// - a Kubernetes indexed Job: `JOB_COMPLETION_INDEX`, of `count` shards, or of
    ///   `JOB_COMPLETIONS` where the Job's spec passes its `completions` in the environment.
    pub fn from_env(count: Option<u64>, env: impl Fn(&str) -> Option<String>) -> Result<Shard, String> {
        let num = |k: &str| -> Result<Option<u64>, String> {
            env(k).map(|v| v.trim().parse::<u64>().map_err(|_| format!("--shard auto: {k}={v} is not a number"))).transpose()
        };
        let (index, found) = if let Some(id) = num("SLURM_ARRAY_TASK_ID")? {
            let min = num("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
            let n = num("SLURM_ARRAY_TASK_COUNT")?.ok_or("--shard auto: SLURM_ARRAY_TASK_ID is set but not SLURM_ARRAY_TASK_COUNT")?;
            if let Some(c) = count.filter(|&c| c != n) {
                return Err(format!("--shard auto/{c}: the Slurm array has {n} tasks (SLURM_ARRAY_TASK_COUNT)"));
            }
            let index = id.checked_sub(min).ok_or_else(|| format!("--shard auto: SLURM_ARRAY_TASK_ID {id} is below SLURM_ARRAY_TASK_MIN {min}"))?;
            (index, Some(n))
        } else if let Some(index) = num("JOB_COMPLETION_INDEX")? {
            let n = count.or(num("JOB_COMPLETIONS")?);
            (
                index,
                Some(n.ok_or(
                    "--shard auto: JOB_COMPLETION_INDEX is set but not the count: give --shard auto/N (the Job's completions) or set JOB_COMPLETIONS",
                )?),
            )
        } else {
            (0, None)
        };
        let Some(count) = found else {
            return Err("--shard auto: not under a scheduler that moge knows: set SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT (a Slurm job array) or JOB_COMPLETION_INDEX (a Kubernetes indexed Job), or give --shard I/N".into());
        };
        if count == 0 || index >= count {
            return Err(format!("--shard auto: shard {index} of {count} from the environment: need 0 <= I < N"));
        }
        Ok(Shard { index, count })
    }

    pub fn contains(&self, rel: &Path) -> bool {
        stem_hash(rel) % self.count == self.index
    }
}

/// The inputs of a run: from the paths and/or a list, collisions marked, then sharded.
/// `output`: the output directory, never searched for photos; see [`walk`] for `notify`.
pub fn collect(paths: &[PathBuf], list: Option<&Path>, shard: Option<Shard>, output: &Path, notify: &dyn Fn(Notice)) -> Result<(Vec<Input>, usize)> {
    let skip = output.canonicalize().ok();
    let mut inputs = from_args(paths, skip.as_deref(), notify)?;
    if let Some(l) = list {
        inputs.extend(from_list(l)?);
    }
    let total = inputs.len();
    if total == 0 {
        bail!("no images or videos found (extensions: {}, {})", EXTENSIONS.join(", "), crate::image_io::video::EXTENSIONS.join(", "));
    }
    mark_collisions(&mut inputs);
    if let Some(s) = shard {
        inputs.retain(|i| s.contains(&i.rel));
    }
    Ok((inputs, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn shard_auto_reads_slurm_arrays_from_their_first_index() {
        let slurm = [("SLURM_ARRAY_TASK_ID", "5"), ("SLURM_ARRAY_TASK_MIN", "1"), ("SLURM_ARRAY_TASK_COUNT", "16")];
        assert_eq!(Shard::from_env(None, env(&slurm)), Ok(Shard { index: 4, count: 16 }));
        assert_eq!(Shard::from_env(Some(16), env(&slurm)), Ok(Shard { index: 4, count: 16 }));
        let e = Shard::from_env(Some(8), env(&slurm)).unwrap_err();
        assert!(e.contains("auto/8") && e.contains("16 tasks"), "{e}");
        let from0 = [("SLURM_ARRAY_TASK_ID", "0"), ("SLURM_ARRAY_TASK_COUNT", "4")];
        assert_eq!(Shard::from_env(None, env(&from0)), Ok(Shard { index: 0, count: 4 }));
        let e = Shard::from_env(None, env(&[("SLURM_ARRAY_TASK_ID", "3")])).unwrap_err();
        assert!(e.contains("SLURM_ARRAY_TASK_COUNT"), "{e}");
        let e = Shard::from_env(None, env(&[("SLURM_ARRAY_TASK_ID", "x"), ("SLURM_ARRAY_TASK_COUNT", "4")])).unwrap_err();
        assert!(e.contains("SLURM_ARRAY_TASK_ID=x is not a number"), "{e}");
    }

    #[test]
    fn shard_auto_reads_kubernetes_indexed_jobs_with_their_count() {
        let k8s = [("JOB_COMPLETION_INDEX", "3")];
        assert_eq!(Shard::from_env(Some(16), env(&k8s)), Ok(Shard { index: 3, count: 16 }));
        let e = Shard::from_env(None, env(&k8s)).unwrap_err();
        assert!(e.contains("auto/N") && e.contains("JOB_COMPLETIONS"), "{e}");
        let with_count = [("JOB_COMPLETION_INDEX", "3"), ("JOB_COMPLETIONS", "4")];
        assert_eq!(Shard::from_env(None, env(&with_count)), Ok(Shard { index: 3, count: 4 }));
        let e = Shard::from_env(Some(2), env(&k8s)).unwrap_err();
        assert!(e.contains("shard 3 of 2"), "{e}");
    }

    #[test]
    fn shard_auto_outside_a_scheduler_names_the_variables() {
        let e = Shard::from_env(Some(4), env(&[])).unwrap_err();
        for v in ["SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "JOB_COMPLETION_INDEX", "--shard I/N"] {
            assert!(e.contains(v), "{e}");
        }
        assert!("auto/x".parse::<Shard>().unwrap_err().contains("'x' is not a shard count"));
        assert!("automatic".parse::<Shard>().is_err());
    }

    #[test]
    fn stems_drop_roots_and_parent_components() {
        assert_eq!(rel_stem(Path::new("/data/a/b.x.JPG")), PathBuf::from("data/a/b.x"));
        assert_eq!(rel_stem(Path::new("../../c.png")), PathBuf::from("c"));
        assert_eq!(rel_stem(Path::new("./sub/d.tif")), PathBuf::from("sub/d"));
    }

    #[test]
    fn shards_partition_the_inputs() {
        let rels: Vec<PathBuf> = (0..1000).map(|i| PathBuf::from(format!("dir{}/img{i}", i % 7))).collect();
        let n = 4;
        let mut counts = vec![0; n];
        for r in &rels {
            let owners: Vec<u64> = (0..n as u64).filter(|&i| Shard { index: i, count: n as u64 }.contains(r)).collect();
            assert_eq!(owners.len(), 1, "{} belongs to exactly one shard", r.display());
            counts[owners[0] as usize] += 1;
        }
        // Balanced within a few standard deviations of 250.
        assert!(counts.iter().all(|&c| (200..300).contains(&c)), "{counts:?}");
        assert!("3/4".parse::<Shard>().is_ok());
        assert!("4/4".parse::<Shard>().is_err());
        assert!("1/0".parse::<Shard>().is_err());
        assert!("x".parse::<Shard>().is_err());
    }

    #[test]
    fn collisions_are_marked_on_the_later_input() {
        let mk = |p: &str| Input { path: PathBuf::from(p), rel: rel_stem(Path::new(p)), problem: None, index: 0, frame: None, camera: None, shared: None };
        let mut v = vec![mk("a/x.jpg"), mk("a/x.png"), mk("a/y.png")];
        mark_collisions(&mut v);
        assert!(v[0].problem.is_none() && v[2].problem.is_none());
        assert!(v[1].problem.as_deref().unwrap().contains("a/x.jpg"));
    }
}
