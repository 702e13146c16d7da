//! COLMAP's binary format: `cameras.bin`, `images.bin`, `points3D.bin`, little-endian, each a
//! u64 count and then its records. Every count is checked against the bytes left before
//! anything is allocated for it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::model::{read_file, Camera, Format, Image, Model, MAX_FILE, MODELS};

pub fn read(dir: &Path) -> Result<Model> {
    let file = |name: &str| -> Result<(std::path::PathBuf, Vec<u8>)> {
        let path = dir.join(name);
        let bytes = read_file(&path, MAX_FILE)?;
        Ok((path, bytes))
    };
    let (path, b) = file("cameras.bin")?;
    let cameras = cameras(&mut Bytes(&b)).with_context(|| path.display().to_string())?;
    let (path, b) = file("images.bin")?;
    let images = images(&mut Bytes(&b)).with_context(|| path.display().to_string())?;
    let (path, b) = file("points3D.bin")?;
    let points = points(&mut Bytes(&b)).with_context(|| path.display().to_string())?;
    Ok(Model { cameras, images, points, format: Format::Binary })
}

/// The bytes not yet read.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        if self.0.len() < N {
            bail!("cut short: {} bytes left where {N} are needed", self.0.len());
        }
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        Ok(head.try_into().expect("N bytes"))
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_le_bytes(self.take()?))
    }
    /// A count of records of at least `min` bytes each, which the bytes left can hold.
    fn count(&mut self, min: usize) -> Result<usize> {
        let n = self.u64()?;
        if n.saturating_mul(min as u64) > self.0.len() as u64 {
            bail!("a count of {n} records of at least {min} bytes, with {} bytes left", self.0.len());
        }
        Ok(n as usize)
    }
    /// A NUL-terminated UTF-8 string.
    fn string(&mut self) -> Result<String> {
        let end = self.0.iter().position(|&b| b == 0).context("a name without its terminating NUL")?;
        let s = std::str::from_utf8(&self.0[..end]).context("a name that is not UTF-8")?.to_owned();
        self.0 = &self.0[end + 1..];
        Ok(s)
    }
}

fn cameras(b: &mut Bytes) -> Result<BTreeMap<u32, Camera>> {
    let n = b.count(24)?;
    let mut out = BTreeMap::new();
    for i in 0..n {
        let id = b.u32()?;
        let model_id = b.i32()?;
        let (width, height) = (b.u64()?, b.u64()?);
        let &(model, count) = usize::try_from(model_id)
            .ok()
            .and_then(|m| MODELS.get(m))
            .with_context(|| format!("camera {i} (id {id}): model id {model_id} is not one COLMAP defines"))?;
        let params = (0..count).map(|_| b.f64()).collect::<Result<Vec<_>>>().with_context(|| format!("camera {i} (id {id})"))?;
        out.insert(id, Camera { id, model: model.to_owned(), width, height, params });
    }
    Ok(out)
}

fn images(b: &mut Bytes) -> Result<BTreeMap<u32, Image>> {
    let n = b.count(73)?;
    let mut out = BTreeMap::new();
    for i in 0..n {
        let id = b.u32()?;
        let mut read = || -> Result<Image> {
            let q = [b.f64()?, b.f64()?, b.f64()?, b.f64()?];
            let t = [b.f64()?, b.f64()?, b.f64()?];
            let camera_id = b.u32()?;
            let name = b.string()?;
            let m = b.count(24)?;
            let mut points2d = Vec::with_capacity(m);
            for _ in 0..m {
                let xy = [b.f64()?, b.f64()?];
                let pid = b.u64()?;
                // -1 (all ones) where the 2D point observes no 3D point.
                points2d.push((xy, (pid != u64::MAX).then_some(pid)));
            }
            Ok(Image { id, q, t, camera_id, name, points2d })
        };
        let image = read().with_context(|| format!("image {i} (id {id})"))?;
        out.insert(id, image);
    }
    Ok(out)
}

fn points(b: &mut Bytes) -> Result<HashMap<u64, [f64; 3]>> {
    let n = b.count(51)?;
    let mut out = HashMap::with_capacity(n);
    for i in 0..n {
        let mut read = || -> Result<(u64, [f64; 3])> {
            let id = b.u64()?;
            let xyz = [b.f64()?, b.f64()?, b.f64()?];
            for _ in 0..3 {
                b.u8()?; // colour
            }
            b.f64()?; // error
            let track = b.count(8)?;
            for _ in 0..track {
                b.u32()?;
                b.u32()?;
            }
            Ok((id, xyz))
        };
        let (id, xyz) = read().with_context(|| format!("point {i}"))?;
        out.insert(id, xyz);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_beyond_the_bytes_is_refused_before_any_allocation() {
        let mut b = u64::MAX.to_le_bytes().to_vec();
        b.extend([0u8; 30]);
        let e = format!("{:#}", points(&mut Bytes(&b)).unwrap_err());
        assert!(e.contains("a count of 18446744073709551615 records"), "{e}");
        let e = format!("{:#}", cameras(&mut Bytes(&1u64.to_le_bytes())).unwrap_err());
        assert!(e.contains("with 0 bytes left"), "{e}");
    }
}
