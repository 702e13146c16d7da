//! Strict weight binding: every tensor the network asks for must be in the checkpoint with the
//! right shape, and every tensor in the checkpoint must be used. Problems are collected, not
//! thrown one at a time, so a single error lists everything that is wrong.

use std::collections::{BTreeSet, HashMap};

use anyhow::{bail, Result};
use candle_core::{DType, Tensor};

use super::build::BuildOptions;

pub struct Weights {
    tensors: HashMap<String, Tensor>,
    used: BTreeSet<String>,
    /// Every (key, shape) the network asked for, in order.
    requested: Vec<(String, Vec<usize>)>,
    missing: Vec<String>,
    mismatched: Vec<String>,
    /// Elements of the zeros handed out for missing or misshapen tensors.
    placeholder_elems: usize,
    /// The device, the products' dtype ([`Weights::get_product`]) and the ops each layer binds.
    build: BuildOptions,
}

impl Weights {
    pub fn new(tensors: HashMap<String, Tensor>, build: &BuildOptions) -> Self {
        Self { tensors, used: BTreeSet::new(), requested: vec![], missing: vec![], mismatched: vec![], placeholder_elems: 0, build: build.clone() }
    }

    /// The tensor `key` moved to the model device, checked against `shape`. A missing or
    /// misshapen tensor is recorded and replaced by zeros so that binding can go on.
    pub fn get(&mut self, key: &str, shape: &[usize]) -> Result<Tensor> {
        self.get_as(key, shape, DType::F32)
    }

    /// As [`Weights::get`], as f32 values on the host (for what is computed from the weights at
    /// load: the refiner's host kernels, the decoder's folded level).
    pub fn host(&mut self, key: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.get(key, shape)?.to_device(&candle_core::Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?)
    }

    /// As [`Weights::get`] for the weight of a matrix product (linear, convolution), in the
    /// dtype of the products: f32, or bf16 on a GPU (activations stay f32 either way).
    pub fn get_product(&mut self, key: &str, shape: &[usize]) -> Result<Tensor> {
        self.get_as(key, shape, self.build.dtype())
    }

    fn get_as(&mut self, key: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.requested.push((key.to_owned(), shape.to_vec()));
        match self.tensors.get(key) {
            None => {
                self.missing.push(format!("{key} {shape:?}"));
                self.placeholder(key, shape, dtype)
            }
            Some(t) if t.dims() != shape => {
                self.mismatched.push(format!("{key}: checkpoint {:?}, model {shape:?}", t.dims()));
                self.used.insert(key.to_owned());
                self.placeholder(key, shape, dtype)
            }
            Some(t) => {
                self.used.insert(key.to_owned());
                // Widened or narrowed on the host, so the device receives the final dtype.
                Ok(t.to_dtype(dtype)?.to_device(self.build.device())?)
            }
        }
    }

    /// Zeros standing in for a tensor the checkpoint lacks. Their shapes come from the
    /// `model_config`, which is the user's file too: a damaged one may ask for any size, so
    /// the stand-ins together are capped a little above the largest model's size (MoGe-3 ViT-g,
    /// ~1.25 G values; a real mismatch lists everything long before that).
    fn placeholder(&mut self, key: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        const MAX_PLACEHOLDER_ELEMS: usize = 1_500_000_000;
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        self.placeholder_elems = n.and_then(|n| self.placeholder_elems.checked_add(n)).unwrap_or(usize::MAX);
        if self.placeholder_elems > MAX_PLACEHOLDER_ELEMS {
            bail!("the model_config asks for {key} of shape {shape:?}, far beyond any MoGe model: the configuration is damaged");
        }
        Ok(Tensor::zeros(shape, dtype, self.build.device())?)
    }

    /// How the layers are built: each takes its route from these.
    pub fn build(&self) -> &BuildOptions {
        &self.build
    }

    /// Drops the checkpoint's copy of `key` once the network holds the tensor in another form
    /// (a linear's weight packed for the CPU kernels), so that the two are not in memory together
    /// at the end of loading. The key stays used: asking for it again reports it missing.
    pub fn release(&mut self, key: &str) {
        if self.used.contains(key) {
            self.tensors.remove(key);
        }
    }

    /// The shape of `key` in the checkpoint, if present (to read architecture from it).
    pub fn shape_of(&self, key: &str) -> Option<Vec<usize>> {
        self.tensors.get(key).map(|t| t.dims().to_vec())
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.tensors.keys()
    }

    /// The keys and shapes the network asked for.
    pub fn requested(&self) -> &[(String, Vec<usize>)] {
        &self.requested
    }

    /// Fails, listing every problem, unless the checkpoint matched the network exactly.
    pub fn finish(self) -> Result<()> {
        let mut unexpected: Vec<&String> = self.tensors.keys().filter(|k| !self.used.contains(*k)).collect();
        unexpected.sort();
        if self.missing.is_empty() && self.mismatched.is_empty() && unexpected.is_empty() {
            return Ok(());
        }
        let mut msg = String::from("the state dict does not match the architecture in its model_config");
        let list = |msg: &mut String, title: &str, items: &[String]| {
            if !items.is_empty() {
                msg.push_str(&format!("\n  {title} ({}):", items.len()));
                for it in items.iter().take(40) {
                    msg.push_str(&format!("\n    {it}"));
                }
                if items.len() > 40 {
                    msg.push_str(&format!("\n    ... and {} more", items.len() - 40));
                }
            }
        };
        list(&mut msg, "missing keys", &self.missing);
        list(&mut msg, "unexpected keys", &unexpected.into_iter().cloned().collect::<Vec<_>>());
        list(&mut msg, "shape mismatches", &self.mismatched);
        bail!(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A released tensor leaves the checkpoint's map (its memory with it) and stays used: the
    /// binding still finishes clean, and asking for it again reports it missing. A key not yet
    /// used is not released.
    #[test]
    fn release_drops_the_checkpoints_copy_of_a_used_tensor() {
        let t = |n: usize| Tensor::zeros(n, DType::F32, &candle_core::Device::Cpu).unwrap();
        let tensors = HashMap::from([("a".to_owned(), t(4)), ("b".to_owned(), t(2))]);
        let mut w = Weights::new(tensors, &BuildOptions::default());
        w.release("b");
        assert_eq!(w.shape_of("b"), Some(vec![2]), "an unused key is kept");
        w.get("a", &[4]).unwrap();
        w.get("b", &[2]).unwrap();
        w.release("a");
        assert_eq!(w.shape_of("a"), None);
        w.finish().unwrap();

        let tensors = HashMap::from([("a".to_owned(), t(4))]);
        let mut w = Weights::new(tensors, &BuildOptions::default());
        w.get("a", &[4]).unwrap();
        w.release("a");
        w.get("a", &[4]).unwrap();
        let err = w.finish().unwrap_err().to_string();
        assert!(err.contains("missing keys (1)") && err.contains("a [4]"), "{err}");
    }

    /// The stand-ins for missing tensors are refused past the cap before any is allocated.
    #[test]
    fn stand_ins_for_a_damaged_config_are_capped() {
        let mut w = Weights::new(HashMap::new(), &BuildOptions::default());
        // ViT-g's qkv fits.
        assert_eq!(w.get("blocks.0.attn.qkv.weight", &[4608, 1536]).unwrap().dims(), [4608, 1536]);
        let err = w.get("neck.weight", &[1 << 20, 1 << 20]).unwrap_err().to_string();
        assert!(err.contains("neck.weight") && err.contains("the configuration is damaged"), "{err}");
        let err = w.get("overflow", &[usize::MAX, 2]).unwrap_err().to_string();
        assert!(err.contains("overflow"), "{err}");
    }
}
