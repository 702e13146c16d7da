//! COLMAP's text format: `cameras.txt`, `images.txt` (two lines per image, the second the
//! image's 2D points, empty where it has none) and `points3D.txt`; `#` starts a comment line.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::model::{read_file, Camera, Format, Image, Model, MAX_FILE};

pub fn read(dir: &Path) -> Result<Model> {
    let text = |name: &str| -> Result<(std::path::PathBuf, String)> {
        let path = dir.join(name);
        let bytes = read_file(&path, MAX_FILE)?;
        let s = String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{}: not UTF-8 text", path.display()))?;
        Ok((path, s))
    };
    let (path, s) = text("cameras.txt")?;
    let cameras = cameras(&s).with_context(|| path.display().to_string())?;
    let (path, s) = text("images.txt")?;
    let images = images(&s).with_context(|| path.display().to_string())?;
    let (path, s) = text("points3D.txt")?;
    let points = points(&s).with_context(|| path.display().to_string())?;
    Ok(Model { cameras, images, points, format: Format::Text })
}

fn num<T: std::str::FromStr>(field: Option<&str>, what: &str, line: usize) -> Result<T> {
    let f = field.with_context(|| format!("line {line}: no {what}"))?;
    f.parse().map_err(|_| anyhow::anyhow!("line {line}: {what} '{f}' is not a number"))
}

fn data_lines(s: &str) -> impl Iterator<Item = (usize, &str)> {
    s.lines().enumerate().map(|(i, l)| (i + 1, l.trim_end_matches('\r'))).filter(|(_, l)| !l.starts_with('#'))
}

fn cameras(s: &str) -> Result<BTreeMap<u32, Camera>> {
    let mut out = BTreeMap::new();
    for (n, line) in data_lines(s).filter(|(_, l)| !l.trim().is_empty()) {
        let mut f = line.split_whitespace();
        let id: u32 = num(f.next(), "CAMERA_ID", n)?;
        let model = f.next().with_context(|| format!("line {n}: no MODEL"))?.to_owned();
        let width = num(f.next(), "WIDTH", n)?;
        let height = num(f.next(), "HEIGHT", n)?;
        let params = f.map(|p| p.parse::<f64>().map_err(|_| anyhow::anyhow!("line {n}: parameter '{p}' is not a number"))).collect::<Result<Vec<_>>>()?;
        if let Some(&(_, count)) = super::model::MODELS.iter().find(|(m, _)| *m == model) {
            if params.len() != count {
                bail!("line {n}: {model} takes {count} parameters, not {}", params.len());
            }
        }
        out.insert(id, Camera { id, model, width, height, params });
    }
    Ok(out)
}

fn images(s: &str) -> Result<BTreeMap<u32, Image>> {
    let mut out = BTreeMap::new();
    let mut lines = data_lines(s);
    while let Some((n, line)) = lines.next() {
        if line.trim().is_empty() {
            continue; // a blank line where an image's first line would be: the file's end
        }
        let mut f = line.split_whitespace();
        let id: u32 = num(f.next(), "IMAGE_ID", n)?;
        let mut q = [0f64; 4];
        for (v, what) in q.iter_mut().zip(["QW", "QX", "QY", "QZ"]) {
            *v = num(f.next(), what, n)?;
        }
        let mut t = [0f64; 3];
        for (v, what) in t.iter_mut().zip(["TX", "TY", "TZ"]) {
            *v = num(f.next(), what, n)?;
        }
        let camera_id: u32 = num(f.next(), "CAMERA_ID", n)?;
        // The name is the rest of the line: it may hold spaces.
        let name = line.split_whitespace().skip(9).collect::<Vec<_>>().join(" ");
        if name.is_empty() {
            bail!("line {n}: no NAME");
        }
        let (m, pts) = lines.next().unwrap_or((n + 1, ""));
        let f: Vec<&str> = pts.split_whitespace().collect();
        if !f.len().is_multiple_of(3) {
            bail!("line {m}: {} values, not (X, Y, POINT3D_ID) triples", f.len());
        }
        let mut points2d = Vec::with_capacity(f.len() / 3);
        for p in f.chunks(3) {
            let x = num(Some(p[0]), "X", m)?;
            let y = num(Some(p[1]), "Y", m)?;
            let id: i64 = num(Some(p[2]), "POINT3D_ID", m)?;
            points2d.push(([x, y], u64::try_from(id).ok()));
        }
        out.insert(id, Image { id, q, t, camera_id, name, points2d });
    }
    Ok(out)
}

fn points(s: &str) -> Result<HashMap<u64, [f64; 3]>> {
    let mut out = HashMap::new();
    for (n, line) in data_lines(s).filter(|(_, l)| !l.trim().is_empty()) {
        let mut f = line.split_whitespace();
        let id: u64 = num(f.next(), "POINT3D_ID", n)?;
        let xyz = [num(f.next(), "X", n)?, num(f.next(), "Y", n)?, num(f.next(), "Z", n)?];
        out.insert(id, xyz);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_without_points_has_an_empty_second_line() {
        let s = "# header\n1 1 0 0 0 0 0 1 1 a b.png\n\n2 1 0 0 0 0 0 2 1 c.png\n10.5 20 7 1 2 -1\n";
        let im = images(s).unwrap();
        assert_eq!(im[&1].name, "a b.png");
        assert!(im[&1].points2d.is_empty());
        assert_eq!(im[&2].points2d, vec![([10.5, 20.0], Some(7)), ([1.0, 2.0], None)]);
        let e = format!("{:#}", images("1 1 0 0 0 0 0 1 1 a.png\n1 2\n").unwrap_err());
        assert!(e.contains("line 2: 2 values"), "{e}");
        let e = format!("{:#}", cameras("1 PINHOLE 64 48 50 50 32\n").unwrap_err());
        assert!(e.contains("line 1: PINHOLE takes 4 parameters, not 3"), "{e}");
    }
}
