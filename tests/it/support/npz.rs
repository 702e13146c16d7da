//! Named arrays of an `.npz` file, read with `ndarray_npy`; a missing array or a wrong element
//! type panics with the file and the name.

use std::fs::File;
use std::path::{Path, PathBuf};

use ndarray::ArrayD;
use ndarray_npy::NpzReader;

pub struct Npz {
    path: PathBuf,
    inner: NpzReader<File>,
}

impl Npz {
    pub fn open(path: &Path) -> Self {
        let f = File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Npz { path: path.to_owned(), inner: NpzReader::new(f).unwrap() }
    }
    pub fn has(&mut self, key: &str) -> bool {
        self.inner.names().unwrap().iter().any(|n| n == key || n == &format!("{key}.npy"))
    }
    pub fn f32(&mut self, key: &str) -> ArrayD<f32> {
        self.inner.by_name(key).unwrap_or_else(|e| panic!("{}: {key}: {e}", self.path.display()))
    }
    pub fn vec_f32(&mut self, key: &str) -> Vec<f32> {
        self.f32(key).iter().copied().collect()
    }
    pub fn i64(&mut self, key: &str) -> ArrayD<i64> {
        self.inner.by_name(key).unwrap_or_else(|e| panic!("{}: {key}: {e}", self.path.display()))
    }
    pub fn i32(&mut self, key: &str) -> ArrayD<i32> {
        self.inner.by_name(key).unwrap_or_else(|e| panic!("{}: {key}: {e}", self.path.display()))
    }
    pub fn f64(&mut self, key: &str) -> ArrayD<f64> {
        self.inner.by_name(key).unwrap_or_else(|e| panic!("{}: {key}: {e}", self.path.display()))
    }
    pub fn u8(&mut self, key: &str) -> ArrayD<u8> {
        self.inner.by_name(key).unwrap_or_else(|e| panic!("{}: {key}: {e}", self.path.display()))
    }
    pub fn scalar_f32(&mut self, key: &str) -> f32 {
        *self.f32(key).iter().next().unwrap()
    }
}
