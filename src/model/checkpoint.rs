//! Reading checkpoints: upstream `model.pt` (a `torch.save` zip holding `model_config` and the
//! fp32 state dict under `model`), or safetensors with the config as JSON beside it.

use std::collections::HashMap;
use std::io::{BufReader, Read, Seek};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use candle_core::pickle::{Object, Stack};
use candle_core::{DType, Device, Tensor};

use super::config::ModelConfig;

/// A checkpoint read into host memory.
pub struct Checkpoint {
    pub path: PathBuf,
    pub config: ModelConfig,
    /// The state dict, in f32, on the CPU.
    pub tensors: HashMap<String, Tensor>,
}

impl Checkpoint {
    /// Reads `path`, choosing the format by its first bytes rather than its name.
    pub fn read(path: &Path) -> Result<Self> {
        let mut head = [0u8; 8];
        let mut f = std::fs::File::open(path)
            .with_context(|| format!("{}: cannot open the checkpoint", path.display()))?;
        let n = read_up_to(&mut f, &mut head)
            .with_context(|| format!("{}: cannot read the checkpoint", path.display()))?;
        drop(f);
        let ck = if n >= 4 && &head[..4] == b"PK\x03\x04" {
            read_torch_zip(path)
        } else if n == 8 && u64::from_le_bytes(head) < (1 << 30) {
            read_safetensors(path)
        } else {
            Err(anyhow!(
                "not a checkpoint: expected a PyTorch model.pt (zip archive) or a .safetensors file"
            ))
        };
        ck.with_context(|| format!("{}: cannot load the checkpoint", path.display()))
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn read_torch_zip(path: &Path) -> Result<Checkpoint> {
    let file = std::fs::File::open(path)?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file))
        .context("the zip archive is damaged or truncated")?;
    let pkl_name = zip
        .file_names()
        .filter_map(|n| n.ok().map(|n| n.into_owned()))
        .find(|n| n.ends_with("/data.pkl") || n == "data.pkl")
        .ok_or_else(|| anyhow!("no data.pkl inside: not a torch.save archive"))?;
    let dir = PathBuf::from(pkl_name.strip_suffix(".pkl").unwrap_or(&pkl_name));
    let root = {
        let reader = zip.by_name(&pkl_name).context("cannot read data.pkl")?;
        let mut reader = BufReader::new(reader);
        let mut stack = Stack::empty();
        stack.read_loop(&mut reader).map_err(|e| anyhow!("data.pkl is not a readable pickle: {e}"))?;
        stack.finalize().map_err(|e| anyhow!("data.pkl is not a readable pickle: {e}"))?
    };
    let Object::Dict(entries) = root else {
        bail!("the pickle holds no dict; expected {{'model_config': ..., 'model': state_dict}}");
    };
    let mut config = None;
    let mut state = None;
    for (k, v) in entries {
        match k {
            Object::Unicode(k) if k == "model_config" => config = Some(v),
            Object::Unicode(k) if k == "model" => state = Some(v),
            _ => {}
        }
    }
    let config = config.ok_or_else(|| anyhow!("no 'model_config' entry: not a MoGe checkpoint"))?;
    let state = state.ok_or_else(|| anyhow!("no 'model' entry (state dict): not a MoGe checkpoint"))?;
    let config_json = object_to_json(config)?;
    let config: ModelConfig = serde_json::from_value(config_json.clone())
        .with_context(|| format!("model_config is not a MoGe-2 configuration: {config_json}"))?;

    let state = unwrap_ordered_dict(state);
    let Object::Dict(items) = state else { bail!("'model' is not a state dict") };
    let mut tensors = HashMap::with_capacity(items.len());
    for (name, value) in items {
        let Object::Unicode(key) = name.clone() else { continue };
        let info = value
            .into_tensor_info(name, &dir)
            .map_err(|e| anyhow!("{key}: not a tensor: {e}"))?
            .ok_or_else(|| anyhow!("{key}: not a tensor"))?;
        let t = read_zip_tensor(&mut zip, &info).with_context(|| format!("{key}: cannot read the tensor data"))?;
        tensors.insert(key, t);
    }
    Ok(Checkpoint { path: path.to_owned(), config, tensors })
}

fn unwrap_ordered_dict(o: Object) -> Object {
    // `collections.OrderedDict` arrives as a reduce of the class with a list of pairs, or
    // already as a dict depending on the protocol; accept both.
    match o {
        Object::Reduce { callable, args } => match (*callable, *args) {
            (Object::Class { class_name, .. }, Object::Tuple(mut a)) if class_name == "OrderedDict" && a.len() == 1 => {
                match a.remove(0) {
                    Object::List(pairs) => Object::Dict(
                        pairs
                            .into_iter()
                            .filter_map(|p| match p {
                                Object::Tuple(mut kv) if kv.len() == 2 => {
                                    let v = kv.pop().unwrap();
                                    let k = kv.pop().unwrap();
                                    Some((k, v))
                                }
                                _ => None,
                            })
                            .collect(),
                    ),
                    other => other,
                }
            }
            (c, a) => Object::Reduce { callable: Box::new(c), args: Box::new(a) },
        },
        Object::Build { callable, .. } => unwrap_ordered_dict(*callable),
        other => other,
    }
}

fn read_zip_tensor<R: Read + Seek>(zip: &mut zip::ZipArchive<R>, info: &candle_core::pickle::TensorInfo) -> Result<Tensor> {
    let mut reader = zip.by_name(&info.path).with_context(|| format!("missing storage {}", info.path))?;
    let layout = &info.layout;
    let fortran = layout.is_fortran_contiguous() && !layout.is_contiguous();
    if !layout.is_contiguous() && !fortran {
        bail!("strided tensor storage is not supported");
    }
    let elem = info.dtype.size_in_bytes();
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes)?;
    let start = layout.start_offset() * elem;
    let len = layout.shape().elem_count() * elem;
    if bytes.len() < start + len {
        bail!("storage holds {} bytes, the tensor needs {}", bytes.len(), start + len);
    }
    let data = &bytes[start..start + len];
    let t = if fortran {
        let rev: Vec<usize> = layout.dims().iter().rev().copied().collect();
        let rank = rev.len();
        Tensor::from_raw_buffer(data, info.dtype, &rev, &Device::Cpu)?
            .permute((0..rank).rev().collect::<Vec<_>>())?
            .contiguous()?
    } else {
        Tensor::from_raw_buffer(data, info.dtype, layout.dims(), &Device::Cpu)?
    };
    Ok(t.to_dtype(DType::F32)?)
}

/// The pickled config is plain data (dicts, lists, str, int, float, bool, None).
fn object_to_json(o: Object) -> Result<serde_json::Value> {
    use serde_json::Value;
    Ok(match o {
        Object::Int(i) => Value::from(i),
        Object::Long(i) => Value::from(i),
        Object::Float(f) => serde_json::Number::from_f64(f).map(Value::Number).unwrap_or(Value::Null),
        Object::Unicode(s) => Value::String(s),
        Object::Bool(b) => Value::Bool(b),
        Object::None => Value::Null,
        Object::List(v) | Object::Tuple(v) => Value::Array(v.into_iter().map(object_to_json).collect::<Result<_>>()?),
        Object::Dict(kv) => {
            let mut m = serde_json::Map::new();
            for (k, v) in kv {
                let Object::Unicode(k) = k else { bail!("model_config has a non-string key") };
                m.insert(k, object_to_json(v)?);
            }
            Value::Object(m)
        }
        other @ (Object::Reduce { .. } | Object::Build { .. }) => match unwrap_ordered_dict(other) {
            d @ Object::Dict(_) => object_to_json(d)?,
            o => bail!("model_config holds an unsupported object: {o:?}"),
        },
        o => bail!("model_config holds an unsupported object: {o:?}"),
    })
}

/// safetensors with the config in `<stem>.json` or `config.json` beside it.
fn read_safetensors(path: &Path) -> Result<Checkpoint> {
    let candidates = [path.with_extension("json"), path.with_file_name("config.json")];
    let cfg_path = candidates
        .iter()
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("a safetensors checkpoint needs its model_config as {} or {}", candidates[0].display(), candidates[1].display()))?;
    let text = std::fs::read_to_string(cfg_path).with_context(|| format!("cannot read {}", cfg_path.display()))?;
    let mut value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", cfg_path.display()))?;
    // Accept either the bare config or {"model_config": {...}}.
    if let Some(inner) = value.get("model_config") {
        value = inner.clone();
    }
    let config: ModelConfig = serde_json::from_value(value)
        .with_context(|| format!("{} is not a MoGe-2 model_config", cfg_path.display()))?;
    let loaded = candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| anyhow!("not a readable safetensors file: {e}"))?;
    let tensors = loaded
        .into_iter()
        .map(|(k, t)| Ok((k, t.to_dtype(DType::F32)?)))
        .collect::<Result<HashMap<_, _>>>()?;
    Ok(Checkpoint { path: path.to_owned(), config, tensors })
}

/// Writes a checkpoint as safetensors plus `<stem>.json`, the form `moge` also reads.
pub fn write_safetensors(ck: &Checkpoint, path: &Path) -> Result<()> {
    candle_core::safetensors::save(&ck.tensors, path)?;
    std::fs::write(path.with_extension("json"), serde_json::to_string_pretty(&ck.config)?)?;
    Ok(())
}
