//! Writes `torch.save`-style archives without PyTorch, for checkpoints the fixtures do not cover
//! (a state dict with a non-tensor entry, a bare state dict, ...): the pickle opcodes protocol 2
//! uses (`torch.serialization` default), storages as `archive/data/<key>`.

use std::io::Write;

use serde_json::Value as J;

pub enum Entry {
    /// (storage class, e.g. "FloatStorage"; shape; little-endian bytes, row-major)
    Tensor(&'static str, Vec<usize>, Vec<u8>),
    Int(i64),
    Str(String),
}

#[derive(Default)]
pub struct Pickle(pub Vec<u8>);

impl Pickle {
    pub fn new() -> Self {
        Pickle(vec![0x80, 2])
    }
    pub fn str(&mut self, s: &str) {
        self.0.push(b'X');
        self.0.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
    }
    pub fn int(&mut self, v: i64) {
        self.0.push(b'J');
        self.0.extend_from_slice(&(v as i32).to_le_bytes());
    }
    pub fn global(&mut self, module: &str, name: &str) {
        self.0.extend_from_slice(format!("c{module}\n{name}\n").as_bytes());
    }
    pub fn json(&mut self, v: &J) {
        match v {
            J::Null => self.0.push(b'N'),
            J::Bool(b) => self.0.push(if *b { 0x88 } else { 0x89 }),
            J::Number(n) if n.is_i64() => self.int(n.as_i64().unwrap()),
            J::Number(n) => {
                self.0.push(b'G');
                self.0.extend_from_slice(&n.as_f64().unwrap().to_be_bytes());
            }
            J::String(s) => self.str(s),
            J::Array(a) => {
                self.0.extend_from_slice(b"](");
                for x in a {
                    self.json(x);
                }
                self.0.push(b'e');
            }
            J::Object(m) => {
                self.0.extend_from_slice(b"}(");
                for (k, x) in m {
                    self.str(k);
                    self.json(x);
                }
                self.0.push(b'u');
            }
        }
    }
    fn ints(&mut self, v: &[usize]) {
        self.0.push(b'(');
        for &x in v {
            self.int(x as i64);
        }
        self.0.push(b't');
    }
    /// `_rebuild_tensor_v2(storage, 0, shape, contiguous strides, False, OrderedDict())`.
    pub fn tensor(&mut self, class: &str, key: &str, shape: &[usize]) {
        self.global("torch._utils", "_rebuild_tensor_v2");
        self.0.push(b'(');
        self.0.push(b'(');
        self.str("storage");
        self.global("torch", class);
        self.str(key);
        self.str("cpu");
        self.int(shape.iter().product::<usize>() as i64);
        self.0.extend_from_slice(b"tQ");
        self.int(0);
        self.ints(shape);
        let mut strides = vec![1usize; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        self.ints(&strides);
        self.0.push(0x89);
        self.global("collections", "OrderedDict");
        self.0.extend_from_slice(b")R");
        self.0.extend_from_slice(b"tR");
    }
}

/// `{'model_config': config, 'model': state}` with `state` an `OrderedDict` carrying
/// `_metadata` (as `model.state_dict()`) or a plain dict; `None` config leaves the key out.
pub fn archive(config: Option<&J>, entries: &[(String, Entry)], ordered: bool) -> Vec<u8> {
    let mut p = Pickle::new();
    let mut storages = Vec::new();
    p.0.push(b'}');
    p.0.push(b'(');
    if let Some(c) = config {
        p.str("model_config");
        p.json(c);
    }
    p.str("model");
    if ordered {
        p.global("collections", "OrderedDict");
        p.0.extend_from_slice(b")R");
    } else {
        p.0.push(b'}');
    }
    p.0.push(b'(');
    for (key, e) in entries {
        p.str(key);
        match e {
            Entry::Tensor(class, shape, bytes) => {
                let k = storages.len().to_string();
                p.tensor(class, &k, shape);
                storages.push((k, bytes.clone()));
            }
            Entry::Int(v) => p.int(*v),
            Entry::Str(s) => p.str(s),
        }
    }
    p.0.push(b'u');
    if ordered {
        p.0.push(b'}');
        p.str("_metadata");
        p.global("collections", "OrderedDict");
        p.0.extend_from_slice(b")R");
        p.str("");
        p.json(&serde_json::json!({"version": 1}));
        p.0.extend_from_slice(b"ssb");
    }
    p.0.extend_from_slice(b"u.");
    let mut out = std::io::Cursor::new(Vec::new());
    {
        let mut z = zip::ZipWriter::new(&mut out);
        let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        z.start_file("archive/data.pkl", opts).unwrap();
        z.write_all(&p.0).unwrap();
        z.start_file("archive/byteorder", opts).unwrap();
        z.write_all(b"little").unwrap();
        for (k, bytes) in storages {
            z.start_file(format!("archive/data/{k}"), opts).unwrap();
            z.write_all(&bytes).unwrap();
        }
        z.finish().unwrap();
    }
    out.into_inner()
}

/// Every tensor of a checkpoint as f32 entries (sorted by key).
pub fn entries_of(ck: &moge::model::checkpoint::Checkpoint) -> Vec<(String, Entry)> {
    let mut keys: Vec<&String> = ck.tensors.keys().collect();
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let t = &ck.tensors[k];
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (k.clone(), Entry::Tensor("FloatStorage", t.dims().to_vec(), bytes))
        })
        .collect()
}
