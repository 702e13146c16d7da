//! Reading a prediction back from an npz: what [`crate::outputs::npz::encode`] writes, and what
//! numpy writes for the same arrays (`np.savez` or `np.savez_compressed`, float16 normals,
//! a bool mask, float64 scalars).

use std::io::{Cursor, Read, Seek};

use anyhow::{anyhow, bail, Context, Result};
use ndarray::{ArrayD, IxDyn, ShapeBuilder};
use ndarray_npy::npy::header::Header;
use ndarray_npy::{ReadNpyExt, ReadableElement};
use zip::result::ZipError;
use zip::ZipArchive;

use crate::infer::Prediction;

/// The prediction in an npz held in memory.
///
/// Required: `points` (H,W,3), `depth` (H,W), `mask` (H,W, uint8 with nonzero = valid, or
/// bool), `intrinsics` (3,3) and `metric_scale` (one element); `normal` (H,W,3) is optional.
/// Float arrays may be float16, float32 or float64. `intrinsics_pixels`, `fov_x` and `fov_y`
/// follow from the others and are not read.
///
/// The npz does not hold the focal/shift solve nor the token grid: `focal` is recovered from
/// the intrinsics (relative to the half diagonal, as `infer()` defines it), `shift` is 0 and
/// `grid` is (0, 0), both meaning "not known".
pub fn read_prediction(bytes: &[u8]) -> Result<Prediction> {
    let mut zip = ZipArchive::new(Cursor::new(bytes)).map_err(|e| anyhow!("not a valid npz (zip) file: {e}"))?;
    let depth = read_floats(&mut zip, "depth", None)?.ok_or_else(|| missing("depth"))?;
    let &[height, width] = depth.shape.as_slice() else {
        bail!("depth.npy has shape {:?}, expected (height, width)", depth.shape);
    };
    if height == 0 || width == 0 {
        bail!("depth.npy is empty (shape {:?})", depth.shape);
    }
    let n = height * width;
    let points = read_floats(&mut zip, "points", Some(&[height, width, 3]))?.ok_or_else(|| missing("points"))?;
    let normal = read_floats(&mut zip, "normal", Some(&[height, width, 3]))?;
    let mask = read_mask(&mut zip, &[height, width])?;
    debug_assert_eq!(mask.len(), n);
    let k = read_floats(&mut zip, "intrinsics", Some(&[3, 3]))?.ok_or_else(|| missing("intrinsics"))?;
    let intrinsics = [[k.data[0], k.data[1], k.data[2]], [k.data[3], k.data[4], k.data[5]], [k.data[6], k.data[7], k.data[8]]];
    let scale = read_floats(&mut zip, "metric_scale", None)?.ok_or_else(|| missing("metric_scale"))?;
    let &[metric_scale] = scale.data.as_slice() else {
        bail!("metric_scale.npy has shape {:?}, expected a scalar", scale.shape);
    };
    // fy = focal/2 · diagonal, with the image's long sides normalised as infer() does.
    let aspect = width as f64 / height as f64;
    let focal = (2.0 * intrinsics[1][1] as f64 / (1.0 + aspect * aspect).sqrt()) as f32;
    Ok(Prediction {
        width,
        height,
        points: points.data,
        depth: depth.data,
        normal: normal.map(|a| a.data),
        normal_png: None,
        mask,
        intrinsics,
        metric_scale,
        focal,
        shift: 0.0,
        per_step: Vec::new(),
        grid: (0, 0),
    })
}

fn missing(name: &str) -> anyhow::Error {
    anyhow!("the npz has no `{name}` array")
}

struct Floats {
    shape: Vec<usize>,
    /// Row-major (C order), whatever the file's order.
    data: Vec<f32>,
}

/// One entry's header, with the entry open after it; `None` when the npz has no such array.
/// Checks the shape against `expect` and the data size against the entry's before anything
/// is allocated, so a lying header cannot ask for more memory than the entry holds.
fn open<'a, R: Read + Seek>(
    zip: &'a mut ZipArchive<R>,
    name: &str,
    expect: Option<&[usize]>,
    item_size: impl Fn(&str) -> Option<usize>,
) -> Result<Option<(Header, String, zip::read::ZipFile<'a, R>)>> {
    let file = format!("{name}.npy");
    let mut entry = match zip.by_name(&file) {
        Ok(e) => e,
        Err(ZipError::FileNotFound) => return Ok(None),
        Err(e) => bail!("cannot read {file} in the npz: {e}"),
    };
    let header = Header::from_reader(&mut entry).map_err(|e| anyhow!("{file} is not a valid .npy: {e}"))?;
    let descr = header.type_descriptor.to_string();
    let descr = descr.trim_matches('\'').to_owned();
    if let Some(shape) = expect {
        if header.shape != shape {
            bail!("{file} has shape {:?}, expected {:?}", header.shape, shape);
        }
    }
    let Some(size) = item_size(&descr) else {
        bail!("{file} has element type {descr}, which is not one this array may have");
    };
    let elements = header.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    match elements.and_then(|e| Some((e, e.checked_mul(size)?))) {
        Some((e, bytes)) if bytes as u64 <= entry.size() && e as u64 <= 3 * crate::image_io::MAX_PIXELS => {}
        _ => {
            bail!("{file} is damaged: its header claims shape {:?} of {descr}, more than the entry's {} bytes or than any image's", header.shape, entry.size())
        }
    }
    Ok(Some((header, descr, entry)))
}

/// An array of float16, float32 or float64 as f32.
fn read_floats<R: Read + Seek>(zip: &mut ZipArchive<R>, name: &str, expect: Option<&[usize]>) -> Result<Option<Floats>> {
    let size = |d: &str| match d {
        "<f2" | ">f2" => Some(2),
        "<f4" | ">f4" => Some(4),
        "<f8" | ">f8" => Some(8),
        _ => None,
    };
    let Some((header, descr, entry)) = open(zip, name, expect, size)? else { return Ok(None) };
    let file = format!("{name}.npy");
    let shape = header.shape.clone();
    let data = match descr.as_str() {
        "<f2" | ">f2" => read_f16(header, descr == "<f2", entry).with_context(|| format!("cannot read {file}"))?,
        "<f4" | ">f4" => read_npy::<f32, _>(header, entry).with_context(|| format!("cannot read {file}"))?,
        _ => read_npy::<f64, _>(header, entry).with_context(|| format!("cannot read {file}"))?.into_iter().map(|v| v as f32).collect(),
    };
    Ok(Some(Floats { shape, data }))
}

/// `mask` as uint8 (nonzero = valid) or bool.
fn read_mask<R: Read + Seek>(zip: &mut ZipArchive<R>, shape: &[usize]) -> Result<Vec<bool>> {
    let size = |d: &str| matches!(d, "|u1" | "u1" | "B" | "|b1").then_some(1);
    let Some((header, descr, entry)) = open(zip, "mask", Some(shape), size)? else { return Err(missing("mask")) };
    if descr != "|b1" {
        Ok(read_npy::<u8, _>(header, entry).context("cannot read mask.npy")?.into_iter().map(|v| v != 0).collect())
    } else {
        read_npy::<bool, _>(header, entry).context("cannot read mask.npy")
    }
}

/// The rest of an entry whose header was read, through ndarray-npy (given the header again),
/// in row-major order.
fn read_npy<T: ReadableElement + Clone, R: Read>(header: Header, rest: R) -> Result<Vec<T>> {
    let head = header.to_bytes().map_err(|e| anyhow!("{e}"))?;
    let a = ArrayD::<T>::read_npy(Cursor::new(head).chain(rest)).map_err(|e| anyhow!("{e}"))?;
    Ok(row_major(a))
}

/// float16 data, which ndarray-npy does not read.
fn read_f16(header: Header, little: bool, mut rest: impl Read) -> Result<Vec<f32>> {
    use half::slice::HalfFloatSliceExt;
    let n: usize = header.shape.iter().product();
    let mut bytes = vec![0u8; 2 * n];
    rest.read_exact(&mut bytes).map_err(|e| anyhow!("the data ends early ({e})"))?;
    if rest.read(&mut [0u8; 1])? != 0 {
        bail!("bytes left over after the data of shape {:?}", header.shape);
    }
    let halves: Vec<half::f16> =
        bytes.chunks_exact(2).map(|b| if little { half::f16::from_le_bytes([b[0], b[1]]) } else { half::f16::from_be_bytes([b[0], b[1]]) }).collect();
    drop(bytes);
    let mut out = vec![0f32; n];
    halves.convert_to_f32_slice(&mut out);
    if header.layout.is_fortran() {
        let a = ArrayD::from_shape_vec(IxDyn(&header.shape).f(), out).map_err(|e| anyhow!("{e}"))?;
        return Ok(row_major(a));
    }
    Ok(out)
}

fn row_major<T: Clone>(a: ArrayD<T>) -> Vec<T> {
    if a.is_standard_layout() {
        a.into_raw_vec_and_offset().0
    } else {
        a.iter().cloned().collect()
    }
}
