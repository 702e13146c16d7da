//! Writing predictions to files. Every file is written under a temporary name in its target
//! directory and renamed into place, so an interrupted run never leaves a partial file. The
//! data reach the disk once per run ([`sync_written`]), not once per file: a per-file fsync
//! made the process wait on the disk for every image (half the npz write time).
//!
//! One module per format; [`write_all`] writes the formats a run asked for, for one image.

pub mod colmap;
pub mod edges;
pub mod exr;
pub mod glb;
pub mod json;
pub mod npz;
pub mod panorama;
pub mod ply;
pub mod png;
pub mod vis;

use std::collections::HashSet;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result};
use image::RgbImage;

use crate::infer::Prediction;

/// An output format of `moge batch` / `moge predict` (`--format`, a comma list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Format {
    /// `x.npz`: the npz of the Tenstorrent MoGe-2 server (tt-MoGe): points, depth, normal, mask, intrinsics, ...
    Npz,
    /// `x.depth.png` (16-bit, metres = value x scale, 0 = invalid), `x.normal.png`, `x.mask.png`, and the sidecar.
    Png,
    /// `x.json`: the sidecar (size, field of view, intrinsics, metric scale, depth statistics, ...).
    Json,
    /// `x.depth.exr` and `x.points.exr`: float32, inf where invalid.
    Exr,
    /// `x.ply`: binary point cloud with colours (and normals), upstream axes, edges removed.
    Ply,
    /// `x.glb`: textured triangle mesh, upstream axes, edges removed.
    Glb,
    /// `x.depth_vis.png` and `x.normal_vis.png`: colourised images to look at.
    Vis,
    /// `clip.depth.mp4` beside a video's frames: their depth, colourised, as a video (videos only).
    Mp4,
    /// `x.colmap/`: the photo as a COLMAP text model (its camera, the identity pose, the point map's points).
    Colmap,
}

crate::names::names!(Format, "output format", {
    Npz => "npz", Png => "png", Json => "json", Exr => "exr", Ply => "ply", Glb => "glb", Vis => "vis", Mp4 => "mp4", Colmap => "colmap",
});

/// How the formats are written; fixed for a run.
#[derive(Debug, Clone)]
pub struct OutputOptions {
    pub formats: Vec<Format>,
    /// Metres per unit of `x.depth.png`.
    pub depth_png_scale: f32,
    /// Relative depth jump that removes a pixel from the ply / glb (upstream `--threshold`).
    pub edge_rtol: f32,
    pub npz_compression: npz::Compression,
    pub npz_normal: npz::NormalDtype,
}

impl Default for OutputOptions {
    fn default() -> Self {
        Self {
            formats: vec![Format::Npz],
            depth_png_scale: 0.001,
            edge_rtol: 0.04,
            npz_compression: npz::Compression::default(),
            npz_normal: npz::NormalDtype::default(),
        }
    }
}

impl OutputOptions {
    pub fn wants(&self, f: Format) -> bool {
        self.formats.contains(&f)
    }
    /// The sidecar comes with `json` and with `png` (whose depth scale it records).
    pub fn wants_sidecar(&self) -> bool {
        self.wants(Format::Json) || self.wants(Format::Png)
    }
    /// The formats that read `Prediction::points` (the others let the post-processing skip it).
    pub fn needs_points(&self) -> bool {
        [Format::Npz, Format::Ply, Format::Glb, Format::Exr, Format::Colmap].iter().any(|&f| self.wants(f))
    }
    /// The formats that read `Prediction::normal` as floats (png alone takes the codes the
    /// post-processing can make in its place).
    pub fn needs_normal_floats(&self) -> bool {
        [Format::Npz, Format::Ply, Format::Glb, Format::Vis].iter().any(|&f| self.wants(f))
    }
    /// ply and glb take their colours from the photo.
    pub fn needs_image(&self) -> bool {
        self.wants(Format::Ply) || self.wants(Format::Glb) || self.wants(Format::Colmap)
    }
}

/// `stem` + `.suffix`, keeping dots already in the stem (`a.b` → `a.b.npz`).
pub fn with_suffix(stem: &Path, suffix: &str) -> PathBuf {
    let mut s: OsString = stem.as_os_str().to_owned();
    s.push(".");
    s.push(suffix);
    PathBuf::from(s)
}

/// One file of one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Npz,
    DepthPng,
    NormalPng,
    MaskPng,
    DepthExr,
    PointsExr,
    Ply,
    Glb,
    DepthVis,
    NormalVis,
    ColmapCameras,
    ColmapImages,
    ColmapPoints,
    Sidecar,
}

impl FileKind {
    pub fn suffix(self) -> &'static str {
        match self {
            FileKind::Npz => "npz",
            FileKind::DepthPng => "depth.png",
            FileKind::NormalPng => "normal.png",
            FileKind::MaskPng => "mask.png",
            FileKind::DepthExr => "depth.exr",
            FileKind::PointsExr => "points.exr",
            FileKind::Ply => "ply",
            FileKind::Glb => "glb",
            FileKind::DepthVis => "depth_vis.png",
            FileKind::NormalVis => "normal_vis.png",
            FileKind::ColmapCameras => "colmap/cameras.txt",
            FileKind::ColmapImages => "colmap/images.txt",
            FileKind::ColmapPoints => "colmap/points3D.txt",
            FileKind::Sidecar => "json",
        }
    }
}

/// Every file one image produces, sidecar last. `has_normal`: the model has a normal head.
pub fn planned_files(opts: &OutputOptions, has_normal: bool) -> Vec<FileKind> {
    use FileKind as K;
    let mut v = Vec::new();
    let mut formats = opts.formats.clone();
    formats.sort();
    formats.dedup();
    for f in formats {
        match f {
            Format::Npz => v.push(K::Npz),
            Format::Png => {
                v.push(K::DepthPng);
                if has_normal {
                    v.push(K::NormalPng);
                }
                v.push(K::MaskPng);
            }
            // Written per video by the run (`pipeline::video::depth`), not per image.
            Format::Json | Format::Mp4 => {}
            Format::Exr => v.extend([K::DepthExr, K::PointsExr]),
            Format::Ply => v.push(K::Ply),
            Format::Glb => v.push(K::Glb),
            Format::Colmap => v.extend([K::ColmapCameras, K::ColmapImages, K::ColmapPoints]),
            Format::Vis => {
                v.push(K::DepthVis);
                if has_normal {
                    v.push(K::NormalVis);
                }
            }
        }
    }
    if opts.wants_sidecar() {
        v.push(K::Sidecar);
    }
    v
}

/// The paths of [`planned_files`] under `stem`.
pub fn planned_paths(stem: &Path, opts: &OutputOptions, has_normal: bool) -> Vec<PathBuf> {
    planned_files(opts, has_normal).into_iter().map(|k| with_suffix(stem, k.suffix())).collect()
}

/// Writes every requested format for one image under `stem`; the sidecar (when asked for) is
/// written last, so that a present sidecar means the others are complete.
/// `image` is the photo at the prediction's size (needed by ply / glb), `name` its file's name
/// (the COLMAP model's image name).
pub fn write_all(
    stem: &Path,
    pred: &Prediction,
    image: Option<&RgbImage>,
    name: &str,
    opts: &OutputOptions,
    mut sidecar: Option<&mut json::Sidecar>,
) -> Result<Vec<PathBuf>> {
    let started = std::time::Instant::now();
    let mut written = Vec::new();
    let mut surface: Option<edges::Surface> = None;
    let mut depth_saturated = None;
    use FileKind as K;
    for kind in planned_files(opts, pred.has_normal()) {
        let path = with_suffix(stem, kind.suffix());
        match kind {
            FileKind::Npz => npz::write(&path, pred, opts.npz_compression, opts.npz_normal)?,
            FileKind::DepthPng => depth_saturated = Some(png::write_depth(&path, pred, opts.depth_png_scale)?),
            FileKind::NormalPng => png::write_normal(&path, pred)?,
            FileKind::MaskPng => png::write_mask(&path, pred)?,
            FileKind::DepthExr => exr::write_depth(&path, pred)?,
            FileKind::PointsExr => exr::write_points(&path, pred)?,
            FileKind::ColmapCameras => {
                let paths = [K::ColmapCameras, K::ColmapImages, K::ColmapPoints].map(|k| with_suffix(stem, k.suffix()));
                colmap::write([&paths[0], &paths[1], &paths[2]], pred, image, name)?
            }
            // Written with the cameras.
            FileKind::ColmapImages | FileKind::ColmapPoints => {}
            FileKind::DepthVis => vis::write_depth(&path, pred)?,
            FileKind::NormalVis => vis::write_normal(&path, pred)?,
            FileKind::Ply | FileKind::Glb => {
                let image = image.context("internal: the photo is needed for ply / glb")?;
                // Built once when both ply and glb are asked for.
                let s = surface.get_or_insert_with(|| edges::Surface::build(pred, image, opts.edge_rtol));
                if kind == FileKind::Ply {
                    ply::write(&path, s)?
                } else {
                    glb::write(&path, s, image)?
                }
            }
            FileKind::Sidecar => {
                let s = sidecar.as_deref_mut().context("internal: no sidecar data")?;
                s.depth_png.saturated = depth_saturated.unwrap_or_else(|| png::count_saturated(pred, opts.depth_png_scale));
                s.timings_ms.write = Some(started.elapsed().as_secs_f64() * 1e3);
                json::write(&path, s)?
            }
        }
        written.push(path);
    }
    Ok(written)
}

/// Temporary files being written now, removed by [`remove_pending_temp_files`] when the
/// process must exit before they are renamed (a second Ctrl-C).
static PENDING: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

pub(crate) fn pending(add: bool, p: &Path) {
    let mut g = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    let set = g.get_or_insert_with(HashSet::new);
    if add {
        set.insert(p.to_owned());
    } else {
        set.remove(p);
    }
}

/// Deletes the temporary files of writes still in progress; returns how many.
pub fn remove_pending_temp_files() -> usize {
    let g = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    let mut n = 0;
    if let Some(set) = g.as_ref() {
        for p in set {
            if std::fs::remove_file(p).is_ok() {
                n += 1;
            }
        }
    }
    n
}

/// The directories written into since the last [`sync_written`].
static WRITTEN: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

pub(crate) fn written_into(dir: &Path) {
    let mut g = WRITTEN.lock().unwrap_or_else(|e| e.into_inner());
    let set = g.get_or_insert_with(HashSet::new);
    if !set.contains(dir) {
        set.insert(dir.to_owned());
    }
}

/// Flushes every file written by [`write_atomic`] so far to its disk: one `syncfs` per file
/// system (Linux; `sync` elsewhere on Unix), at the end of a run, so that a run that reports
/// success has its outputs on disk, and a disk error that only shows when the data are
/// written back (a full network volume) still fails the run. Returns the first error, naming
/// the directory.
pub fn sync_written() -> Result<()> {
    let dirs = WRITTEN.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default();
    sync_dirs(dirs)
}

#[cfg(target_os = "linux")]
fn sync_dirs(dirs: HashSet<PathBuf>) -> Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let mut done = HashSet::new();
    for dir in dirs {
        let f = match std::fs::File::open(&dir) {
            Ok(f) => f,
            // Removed since (by the user): nothing of it left to flush.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("{}: cannot open to flush the outputs to disk", dir.display())),
        };
        let dev = f.metadata().map(|m| m.dev()).ok();
        if dev.is_some_and(|d| !done.insert(d)) {
            continue;
        }
        // SAFETY: the descriptor is open for the duration of the call.
        if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("{}: cannot flush the outputs to disk", dir.display()));
        }
    }
    Ok(())
}

#[cfg(all(unix, not(target_os = "linux")))]
fn sync_dirs(dirs: HashSet<PathBuf>) -> Result<()> {
    if !dirs.is_empty() {
        // SAFETY: no arguments; it only schedules the write-back of every file system.
        unsafe { libc::sync() };
    }
    Ok(())
}

#[cfg(not(unix))]
fn sync_dirs(dirs: HashSet<PathBuf>) -> Result<()> {
    let _ = dirs;
    Ok(())
}

/// Writes `path` atomically: `write` fills a temporary file beside it, which is renamed over
/// `path` only after it was written and flushed completely.
pub fn write_atomic(path: &Path, write: impl FnOnce(&mut std::fs::File) -> Result<()>) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create the directory", dir.display()))?;
    let tmp = temp_name(path);
    pending(true, &tmp);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).with_context(|| format!("{}: cannot create", tmp.display()))?;
        write(&mut f).with_context(|| format!("{}: cannot write", path.display()))?;
        f.flush().with_context(|| format!("{}: cannot write", path.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("{}: cannot rename into place", path.display()))
    })();
    if result.is_ok() {
        written_into(dir);
    }
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    pending(false, &tmp);
    result
}

/// Reserves `len` bytes of disk for `f` past its end before it is written (Linux `fallocate`,
/// keeping the size; nothing elsewhere), so that a full disk fails before any of it is copied,
/// and ext4 allocates the blocks once instead of page by page as the data arrive (60 MB: 21.9 ->
/// 16.9 ms, median of 30; PERFORMANCE.md, "Host stages"). The size stays what was written
/// (writers that seek, as zip's, see no tail); the caller frees what it did not use with
/// `set_len` at the end, which ext4 does even at an unchanged size. A file system that cannot
/// preallocate is not an error: the write goes on without.
#[cfg(target_os = "linux")]
pub fn reserve(f: &std::fs::File, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let Ok(len) = libc::off_t::try_from(len) else { return Ok(()) };
    // SAFETY: the descriptor is open for the duration of the call; KEEP_SIZE only allocates.
    if unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, len) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => Err(e),
        _ => Ok(()),
    }
}

#[cfg(not(target_os = "linux"))]
pub fn reserve(f: &std::fs::File, len: u64) -> std::io::Result<()> {
    let _ = (f, len);
    Ok(())
}

/// `dir/.name.moge-tmp-PID-N`: hidden, unique per process and write, recognisable for cleanup.
pub fn temp_name(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.moge-tmp-{}-{n}", std::process::id()))
}

/// True when `name` is one of our temporary files.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(".moge-tmp-")
}

/// Whether an error chain ends in a condition that will fail every later write too (disk
/// full, read-only file system, permission denied): the batch stops instead of failing
/// each remaining image.
pub fn is_fatal_io(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::StorageFull
                    | std::io::ErrorKind::ReadOnlyFilesystem
                    | std::io::ErrorKind::PermissionDenied
                    | std::io::ErrorKind::QuotaExceeded
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_written_flushes_the_directories_written_into_once() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a").join("x.bin"), tmp.path().join("b").join("y.bin"));
        for p in [&a, &b] {
            write_atomic(p, |f| Ok(f.write_all(b"moge")?)).unwrap();
        }
        let listed = WRITTEN.lock().unwrap().clone().unwrap_or_default();
        assert!(listed.contains(a.parent().unwrap()) && listed.contains(b.parent().unwrap()), "{listed:?}");
        sync_written().unwrap();
        let left = WRITTEN.lock().unwrap().clone().unwrap_or_default();
        assert!(!left.contains(a.parent().unwrap()), "the set is emptied: {left:?}");
        // A directory removed before the flush has nothing left to flush.
        let c = tmp.path().join("c").join("z.bin");
        write_atomic(&c, |f| Ok(f.write_all(b"moge")?)).unwrap();
        std::fs::remove_dir_all(c.parent().unwrap()).unwrap();
        sync_written().unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), b"moge");
    }
}
