//! Each photo's camera from a table (`--intrinsics-from FILE`):
//! - CSV: `name,fx,fy,cx,cy` per line, with or without a header (a header may order the
//!   columns: `name` (or `image`, `file`, `path`), `fx`, `fy`, `cx`, `cy`); `#` starts a comment line.
//! - JSON: `{"name": [fx, fy, cx, cy], ...}` or `{"name": {"fx": .., "fy": .., "cx": .., "cy": ..}}`;
//!   or nerfstudio's / instant-ngp's `transforms.json` (`fl_x`, `fl_y`, `cx`, `cy` at the top
//!   or per frame, `frames[].file_path`), whose distortion terms must be zero.
//!
//! A name is a photo's path, or its end: `x.jpg` names every `x.jpg`, `sub/x.jpg` only that one;
//! the longest name that ends a photo's path is its camera.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::Pinhole;

/// The cameras of a table, by name.
#[derive(Debug, Clone, Default)]
pub struct Table {
    by_name: HashMap<String, Pinhole>,
}

/// Largest table read: a million photos' lines are some 60 MB.
const MAX_BYTES: u64 = 256 << 20;

impl Table {
    /// Reads `path`: JSON by its extension `.json`, else CSV.
    pub fn read(path: &Path) -> Result<Table> {
        let name = path.display();
        let size = std::fs::metadata(path).with_context(|| format!("cannot read the camera table {name}"))?.len();
        if size > MAX_BYTES {
            bail!("the camera table {name} is {size} bytes, over the limit of {MAX_BYTES}");
        }
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the camera table {name}"))?;
        let is_json = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
        let table = if is_json { Self::from_json(&text) } else { Self::from_csv(&text) }.with_context(|| format!("camera table {name}"))?;
        if table.by_name.is_empty() {
            bail!("the camera table {name} has no cameras");
        }
        Ok(table)
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The camera of the photo at `path`: that of the longest name that ends its path.
    pub fn lookup(&self, path: &Path) -> Option<Pinhole> {
        let parts: Vec<String> = path.components().filter_map(|c| c.as_os_str().to_str()).map(str::to_owned).collect();
        (0..parts.len()).find_map(|from| self.by_name.get(&parts[from..].join("/")).copied())
    }

    fn insert(&mut self, name: &str, k: [f64; 4]) -> Result<()> {
        let key = normalise(name);
        if key.is_empty() {
            bail!("an empty name");
        }
        let cam = Pinhole::new(k).map_err(anyhow::Error::msg).with_context(|| format!("'{name}'"))?;
        if self.by_name.insert(key, cam).is_some_and(|old| old != cam) {
            bail!("'{name}' is given two different cameras");
        }
        Ok(())
    }

    fn from_csv(text: &str) -> Result<Table> {
        let mut reader = csv::ReaderBuilder::new().has_headers(false).comment(Some(b'#')).trim(csv::Trim::All).flexible(true).from_reader(text.as_bytes());
        let mut table = Table::default();
        // Columns of name, fx, fy, cx, cy: as a header orders them, else in that order.
        let mut columns = [0usize, 1, 2, 3, 4];
        for (n, record) in reader.records().enumerate() {
            let record = record.with_context(|| format!("row {}", n + 1))?;
            let line = record.position().map_or(n as u64 + 1, |p| p.line());
            if n == 0 && record.get(1).is_some_and(|f| f.parse::<f64>().is_err()) {
                let find = |names: &[&str]| record.iter().position(|h| names.iter().any(|n| h.eq_ignore_ascii_case(n)));
                let want = [&["name", "image", "file", "path", "image_name", "file_path"][..], &["fx"], &["fy"], &["cx"], &["cy"]];
                for (slot, names) in columns.iter_mut().zip(want) {
                    *slot = find(names).with_context(|| format!("line {line}: the header has no column {}", names[0]))?;
                }
                continue;
            }
            let field = |i: usize| record.get(columns[i]).with_context(|| format!("line {line}: {} columns, not name,fx,fy,cx,cy", record.len()));
            let mut k = [0f64; 4];
            for (i, v) in k.iter_mut().enumerate() {
                let s = field(i + 1)?;
                *v = s.parse().map_err(|_| anyhow::anyhow!("line {line}: '{s}' is not a number"))?;
            }
            table.insert(field(0)?, k).with_context(|| format!("line {line}"))?;
        }
        Ok(table)
    }

    fn from_json(text: &str) -> Result<Table> {
        let doc: Value = serde_json::from_str(text).context("not JSON")?;
        let Some(obj) = doc.as_object() else { bail!("not a JSON object of name: camera") };
        let mut table = Table::default();
        if let Some(frames) = obj.get("frames") {
            // nerfstudio / instant-ngp: shared intrinsics at the top, a frame's own over them.
            let frames = frames.as_array().context("'frames' is not a list")?;
            for (i, frame) in frames.iter().enumerate() {
                let f = frame.as_object().with_context(|| format!("frame {i} is not an object"))?;
                let name = f.get("file_path").and_then(Value::as_str).with_context(|| format!("frame {i} has no file_path"))?;
                let term = |key: &str| f.get(key).or_else(|| obj.get(key)).and_then(Value::as_f64);
                for d in ["k1", "k2", "k3", "k4", "p1", "p2"] {
                    if term(d).is_some_and(|v| v != 0.0) {
                        bail!("frame {i} ('{name}') has distortion {d} = {}: undistort the photos first (MoGe takes pinhole photos)", term(d).unwrap_or(0.0));
                    }
                }
                let k = ["fl_x", "fl_y", "cx", "cy"].map(term);
                let [Some(fx), fy, Some(cx), Some(cy)] = k else { bail!("frame {i} ('{name}') lacks fl_x, cx or cy") };
                table.insert(name, [fx, fy.unwrap_or(fx), cx, cy]).with_context(|| format!("frame {i}"))?;
            }
            return Ok(table);
        }
        for (name, v) in obj {
            let k = match v {
                Value::Array(a) if a.len() == 4 => a.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>(),
                Value::Object(o) => ["fx", "fy", "cx", "cy"].iter().map(|k| o.get(*k).and_then(Value::as_f64)).collect(),
                _ => None,
            };
            let Some(k) = k else { bail!("'{name}': not [fx, fy, cx, cy] or {{\"fx\", \"fy\", \"cx\", \"cy\"}}") };
            table.insert(name, [k[0], k[1], k[2], k[3]])?;
        }
        Ok(table)
    }
}

/// A name as a path's end: `/` between parts, no `./`.
fn normalise(name: &str) -> String {
    name.replace('\\', "/").split('/').filter(|p| !p.is_empty() && *p != ".").collect::<Vec<_>>().join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_with_and_without_a_header_and_json_give_the_same_cameras() {
        let a = Table::from_csv("# cameras\na.jpg,70,75,10,30\nsub/b.png, 80, 80, 40.5, 30\n").unwrap();
        let b = Table::from_csv("cy,cx,name,fy,fx\n30,10,a.jpg,75,70\n30,40.5,sub/b.png,80,80\n").unwrap();
        let c = Table::from_json(r#"{"a.jpg": [70, 75, 10, 30], "./sub/b.png": {"fx": 80, "fy": 80, "cx": 40.5, "cy": 30}}"#).unwrap();
        let d = Table::from_json(
            r#"{"fl_x": 80, "fl_y": 80, "cx": 40.5, "cy": 30, "k1": 0.0, "frames": [{"file_path": "a.jpg", "fl_x": 70, "fl_y": 75, "cx": 10}, {"file_path": "sub/b.png"}]}"#,
        )
        .unwrap();
        for t in [&a, &b, &c, &d] {
            assert_eq!(t.by_name, a.by_name);
            assert_eq!(t.lookup(Path::new("/data/a.jpg")), Some(Pinhole { fx: 70.0, fy: 75.0, cx: 10.0, cy: 30.0 }));
            assert_eq!(t.lookup(Path::new("/data/sub/b.png")).map(|k| k.cx), Some(40.5));
            // `sub/b.png` names that photo only; no name ends `/data/b.png`.
            assert_eq!(t.lookup(Path::new("/data/b.png")), None);
        }
    }

    #[test]
    fn the_longest_name_that_ends_the_path_wins() {
        let t = Table::from_csv("x.jpg,1,1,1,1\nsub/x.jpg,2,2,2,2\n").unwrap();
        assert_eq!(t.lookup(Path::new("d/sub/x.jpg")).unwrap().fx, 2.0);
        assert_eq!(t.lookup(Path::new("d/other/x.jpg")).unwrap().fx, 1.0);
    }

    #[test]
    fn bad_tables_say_where() {
        let e = |r: Result<Table>| format!("{:#}", r.unwrap_err());
        assert!(e(Table::from_csv("a.jpg,70,75,10\n")).contains("line 1: 4 columns"));
        assert!(e(Table::from_csv("a.jpg,70,75,10,30\nb.jpg,70,x,10,30\n")).contains("line 2: 'x' is not a number"));
        assert!(e(Table::from_csv("a.jpg,0,75,10,30\n")).contains("'a.jpg': focal lengths"));
        assert!(e(Table::from_csv("a.jpg,1,1,1,1\na.jpg,2,2,2,2\n")).contains("two different cameras"));
        assert!(e(Table::from_json(r#"{"fl_x": 1, "cx": 1, "cy": 1, "k1": 0.1, "frames": [{"file_path": "a.jpg"}]}"#)).contains("distortion k1"));
        assert!(e(Table::from_json(r#"{"a.jpg": [1, 2]}"#)).contains("'a.jpg': not [fx, fy, cx, cy]"));
    }
}
