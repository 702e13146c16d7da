//! Reading checkpoints: upstream `model.pt` (a `torch.save` zip holding `model_config` and the
//! state dict under `model`, as a plain dict or the `OrderedDict` of `model.state_dict()`), or
//! safetensors with the config as JSON beside it. Weights stored as float16, bfloat16 or float64
//! are widened to f32 here, as upstream's `load_state_dict` into an fp32 model does; the
//! precision mode then decides how the products are computed.

use std::collections::HashMap;
use std::io::{BufReader, Read, Seek};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device, Tensor};

use super::config::ModelConfig;
use super::pickle::{self, Value};

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
        let mut f = std::fs::File::open(path).with_context(|| format!("{}: cannot open the checkpoint", path.display()))?;
        let n = read_up_to(&mut f, &mut head).with_context(|| format!("{}: cannot read the checkpoint", path.display()))?;
        let ck = if n >= 4 && &head[..4] == b"PK\x03\x04" {
            std::io::Seek::rewind(&mut f).map_err(anyhow::Error::from).and_then(|_| read_torch_zip(BufReader::new(f)))
        } else if n == 8 && u64::from_le_bytes(head) < (1 << 30) {
            drop(f);
            read_safetensors_file(path)
        } else {
            Err(anyhow!("not a checkpoint: expected a PyTorch model.pt (zip archive) or a .safetensors file"))
        };
        let (config, tensors) = ck.with_context(|| format!("{}: cannot load the checkpoint", path.display()))?;
        Ok(Checkpoint { path: path.to_owned(), config, tensors })
    }

    /// A `torch.save` archive held in memory (what [`Checkpoint::read`] does for a `model.pt`).
    pub fn from_torch_bytes(bytes: &[u8]) -> Result<Self> {
        let (config, tensors) = read_torch_zip(std::io::Cursor::new(bytes))?;
        Ok(Checkpoint { path: PathBuf::from("<memory>"), config, tensors })
    }

    /// A safetensors file and its JSON `model_config`, held in memory.
    pub fn from_safetensors_bytes(bytes: &[u8], config_json: &str) -> Result<Self> {
        let config = parse_config_json(config_json)?;
        let tensors = parse_safetensors(bytes)?;
        Ok(Checkpoint { path: PathBuf::from("<memory>"), config, tensors })
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

/// Largest `data.pkl` read (ViT-L's is about 100 KB).
const MAX_PICKLE: u64 = 64 << 20;
/// Most numbers in a state dict (ViT-L's holds about 0.33 billion).
const MAX_ELEMENTS: usize = 2_000_000_000;

type Loaded = (ModelConfig, HashMap<String, Tensor>);

fn read_torch_zip<R: Read + Seek>(reader: R) -> Result<Loaded> {
    let mut zip = zip::ZipArchive::new(reader).context("the zip archive is damaged or truncated")?;
    let pkl_name = zip
        .file_names()
        .filter_map(|n| n.ok().map(|n| n.into_owned()))
        .find(|n| n.ends_with("/data.pkl") || n == "data.pkl")
        .ok_or_else(|| anyhow!("no data.pkl inside: not a torch.save archive"))?;
    let prefix = pkl_name.strip_suffix("data.pkl").unwrap_or_default().to_owned();
    if let Ok(mut f) = zip.by_name(&format!("{prefix}byteorder")) {
        let mut order = String::new();
        f.by_ref().take(16).read_to_string(&mut order).context("cannot read the byteorder entry")?;
        if order.trim() != "little" {
            bail!("the tensors are stored {order:?}-endian; only little-endian checkpoints are supported");
        }
    }
    let root = {
        let mut bytes = Vec::new();
        zip.by_name(&pkl_name).context("cannot read data.pkl")?.take(MAX_PICKLE + 1).read_to_end(&mut bytes).context("cannot read data.pkl")?;
        if bytes.len() as u64 > MAX_PICKLE {
            bail!("data.pkl is over {} MB: not a checkpoint's", MAX_PICKLE >> 20);
        }
        pickle::parse(&bytes).context("data.pkl is not a readable checkpoint pickle")?
    };
    let Value::Dict(entries) = root else {
        bail!("the pickle holds a {}; expected {{'model_config': ..., 'model': state_dict}}", root.kind());
    };
    let mut config = None;
    let mut state = None;
    let mut bare_tensors = false;
    for (k, v) in entries {
        match k {
            Value::Str(k) if k == "model_config" => config = Some(v),
            Value::Str(k) if k == "model" => state = Some(v),
            _ => bare_tensors |= tensor_ref(&v).is_ok(),
        }
    }
    let Some(config) = config else {
        if bare_tensors {
            bail!(
                "this is a bare state dict with no 'model_config': moge needs the architecture too, saved as upstream \
                 does: torch.save({{'model_config': config, 'model': model.state_dict()}}, path)"
            );
        }
        bail!("no 'model_config' entry: not a MoGe checkpoint");
    };
    let state = state.ok_or_else(|| anyhow!("no 'model' entry (state dict): not a MoGe checkpoint"))?;
    let config_json = value_to_json(config)?;
    let config: ModelConfig =
        serde_json::from_value(config_json.clone()).with_context(|| format!("model_config is not a MoGe-2 configuration: {config_json}"))?;

    let Value::Dict(items) = state else { bail!("'model' is a {}, not a state dict", state.kind()) };
    let mut tensors = HashMap::with_capacity(items.len());
    let mut elements = 0usize;
    for (name, value) in items {
        let Value::Str(key) = name else { bail!("the state dict has a {} key; expected names", name.kind()) };
        // A plain-dict copy of `state_dict()` may carry its per-module versions as an item.
        if key == "_metadata" && matches!(value, Value::Dict(_)) {
            continue;
        }
        let r = tensor_ref(&value).map_err(|e| anyhow!("{key}: {e}"))?;
        // Storages may be shared between keys; what they add up to is capped all the same.
        elements = elements.saturating_add(r.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).unwrap_or(usize::MAX));
        if elements > MAX_ELEMENTS {
            bail!("the state dict holds more than {MAX_ELEMENTS} numbers: far beyond any MoGe-2 model");
        }
        let t = read_zip_tensor(&mut zip, &prefix, &r).with_context(|| format!("{key}: cannot read the tensor data"))?;
        if tensors.insert(key.clone(), t).is_some() {
            bail!("{key}: appears twice in the state dict");
        }
    }
    Ok((config, strip_wrapper_prefix(tensors)))
}

/// `torch.nn.parallel.DistributedDataParallel` (and `DataParallel`) name every parameter
/// `module.<key>`; a state dict saved from the wrapper loads as the bare model's.
fn strip_wrapper_prefix(tensors: HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    if tensors.is_empty() || !tensors.keys().all(|k| k.starts_with("module.")) {
        return tensors;
    }
    tensors.into_iter().map(|(k, v)| (k["module.".len()..].to_owned(), v)).collect()
}

/// Where a tensor's numbers are in the archive and how to read them.
#[derive(Debug)]
struct TensorRef {
    storage: String,
    dtype: DType,
    storage_len: usize,
    offset: usize,
    shape: Vec<usize>,
    stride: Vec<usize>,
}

fn int_of(v: &Value, what: &str) -> Result<usize> {
    match v {
        Value::Int(i) if *i >= 0 => Ok(*i as usize),
        other => bail!("{what} is {other:?}, expected a non-negative int"),
    }
}

fn ints_of(v: &Value, what: &str) -> Result<Vec<usize>> {
    match v {
        Value::Tuple(items) | Value::List(items) => items.iter().map(|i| int_of(i, what)).collect(),
        other => bail!("{what} is a {}, expected a tuple of ints", other.kind()),
    }
}

/// A state-dict value as `torch.save` pickles a tensor: `_rebuild_tensor_v2(storage, offset,
/// size, stride, ...)`, possibly wrapped by `_rebuild_parameter(tensor, ...)`.
fn tensor_ref(v: &Value) -> Result<TensorRef> {
    let Value::Call { func, args } = v else { bail!("not a tensor (a {})", v.kind()) };
    let Value::Tuple(args) = args.as_ref() else { bail!("not a tensor (malformed call)") };
    if func.is_global("torch._utils", "_rebuild_parameter") || func.is_global("torch._utils", "_rebuild_parameter_with_state") {
        return tensor_ref(args.first().ok_or_else(|| anyhow!("an empty parameter"))?);
    }
    if !func.is_global("torch._utils", "_rebuild_tensor_v2") {
        bail!("not a tensor (an object of {func:?}); only dense tensors are supported");
    }
    if args.len() < 4 {
        bail!("not a tensor (_rebuild_tensor_v2 with {} arguments)", args.len());
    }
    let Value::Persistent(id) = &args[0] else { bail!("not a tensor (no storage)") };
    let Value::Tuple(id) = id.as_ref() else { bail!("not a tensor (malformed storage id)") };
    let [Value::Str(tag), Value::Global { module, name }, Value::Str(storage), _location, numel] = id.as_slice() else {
        bail!("not a tensor (malformed storage id)");
    };
    if tag != "storage" || module != "torch" {
        bail!("not a tensor (storage {tag}, {module}.{name})");
    }
    let dtype = match name.as_str() {
        "FloatStorage" => DType::F32,
        "HalfStorage" => DType::F16,
        "BFloat16Storage" => DType::BF16,
        "DoubleStorage" => DType::F64,
        other => bail!("tensors of {other} are not supported (expected float32, float16, bfloat16 or float64)"),
    };
    let shape = ints_of(&args[2], "the tensor's size")?;
    let stride = ints_of(&args[3], "the tensor's stride")?;
    if shape.len() != stride.len() {
        bail!("the tensor's size and stride have different ranks");
    }
    if storage.is_empty() || storage.contains("..") || storage.starts_with('/') {
        bail!("not a tensor (storage name {storage:?})");
    }
    Ok(TensorRef {
        storage: storage.clone(),
        dtype,
        storage_len: int_of(numel, "the storage's length")?,
        offset: int_of(&args[1], "the storage offset")?,
        shape,
        stride,
    })
}

fn read_zip_tensor<R: Read + Seek>(zip: &mut zip::ZipArchive<R>, prefix: &str, r: &TensorRef) -> Result<Tensor> {
    let elem = r.dtype.size_in_bytes();
    // The last element the view touches must lie inside the storage.
    let count = r.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| anyhow!("the tensor's size overflows"))?;
    let span = if count == 0 {
        0
    } else {
        r.shape
            .iter()
            .zip(&r.stride)
            .try_fold(r.offset, |a, (&d, &s)| (d - 1).checked_mul(s).and_then(|x| a.checked_add(x)))
            .and_then(|last| last.checked_add(1))
            .ok_or_else(|| anyhow!("the tensor's layout overflows"))?
    };
    if span > r.storage_len {
        bail!("the tensor reaches element {span} of a storage of {}", r.storage_len);
    }
    // A view that repeats storage elements (an `expand`ed tensor) has more elements than its
    // storage; state dicts hold none, and the count would not be bounded by the file.
    if count > r.storage_len {
        bail!("the tensor has {count} elements over a storage of {}: views that repeat elements are not supported", r.storage_len);
    }
    let want = span.checked_mul(elem).ok_or_else(|| anyhow!("the storage is too large"))?;
    let name = format!("{prefix}data/{}", r.storage);
    let mut reader = zip.by_name(&name).with_context(|| format!("missing storage {name}"))?;
    // Sized from what the file claims only up to a point: the data itself must then arrive.
    let mut bytes = Vec::with_capacity(want.min(reader.size() as usize).min(64 << 20));
    reader.by_ref().take(want as u64).read_to_end(&mut bytes)?;
    if bytes.len() < want {
        bail!("storage {name} holds {} bytes, the tensor needs {want}", bytes.len());
    }
    let value = |i: usize| -> f32 {
        let b = &bytes[i * elem..(i + 1) * elem];
        match r.dtype {
            DType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
            DType::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
            DType::F64 => f64::from_le_bytes(b.try_into().unwrap()) as f32,
            _ => f32::from_le_bytes(b.try_into().unwrap()),
        }
    };
    // Row-major walk of the view through its strides (contiguous, transposed or any view).
    let mut data = Vec::with_capacity(count);
    let rank = r.shape.len();
    let mut idx = vec![0usize; rank];
    for _ in 0..count {
        let at = r.offset + idx.iter().zip(&r.stride).map(|(i, s)| i * s).sum::<usize>();
        data.push(value(at));
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < r.shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(Tensor::from_vec(data, r.shape.as_slice(), &Device::Cpu)?)
}

/// The pickled config is plain data (dicts, lists, str, int, float, bool, None).
fn value_to_json(v: Value) -> Result<serde_json::Value> {
    use serde_json::Value as J;
    Ok(match v {
        Value::Int(i) => J::from(i),
        Value::Float(f) => serde_json::Number::from_f64(f).map(J::Number).unwrap_or(J::Null),
        Value::Str(s) => J::String(s),
        Value::Bool(b) => J::Bool(b),
        Value::None => J::Null,
        Value::List(v) | Value::Tuple(v) => J::Array(v.into_iter().map(value_to_json).collect::<Result<_>>()?),
        Value::Dict(kv) => {
            let mut m = serde_json::Map::new();
            for (k, v) in kv {
                let Value::Str(k) = k else { bail!("model_config has a non-string key") };
                m.insert(k, value_to_json(v)?);
            }
            J::Object(m)
        }
        other => bail!("model_config holds an unsupported value (a {})", other.kind()),
    })
}

/// safetensors with the config in `<stem>.json` or `config.json` beside it.
fn read_safetensors_file(path: &Path) -> Result<Loaded> {
    let candidates = [path.with_extension("json"), path.with_file_name("config.json")];
    let cfg_path = candidates
        .iter()
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("a safetensors checkpoint needs its model_config as {} or {}", candidates[0].display(), candidates[1].display()))?;
    let text = std::fs::read_to_string(cfg_path).with_context(|| format!("cannot read {}", cfg_path.display()))?;
    let config = parse_config_json(&text).with_context(|| format!("{}", cfg_path.display()))?;
    let file = std::fs::File::open(path)?;
    // Mapped, not read: the tensors are converted straight from the page cache.
    // SAFETY: the map is read-only and dropped before returning; a file truncated by another
    // process meanwhile is the one case it does not cover (as every mmap-based loader).
    let map = unsafe { memmap2::Mmap::map(&file) }?;
    Ok((config, parse_safetensors(&map)?))
}

fn parse_config_json(text: &str) -> Result<ModelConfig> {
    let mut value: serde_json::Value = serde_json::from_str(text).context("not JSON")?;
    // Accept either the bare config or {"model_config": {...}}.
    if let Some(inner) = value.get_mut("model_config") {
        value = inner.take();
    }
    serde_json::from_value(value).context("not a MoGe-2 model_config")
}

fn parse_safetensors(bytes: &[u8]) -> Result<HashMap<String, Tensor>> {
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| anyhow!("not a readable safetensors file: {e}"))?;
    let mut out = HashMap::new();
    let tensors: HashMap<String, safetensors::tensor::TensorView> = st.tensors().into_iter().collect();
    for (name, view) in &tensors {
        // An int8 weight's scales ([`super::quantize`]) are read with it.
        if let Some(base) = name.strip_suffix(super::quantize::SCALE_SUFFIX) {
            if tensors.get(base).is_some_and(|b| b.dtype() == safetensors::Dtype::I8) {
                continue;
            }
        }
        if view.dtype() == safetensors::Dtype::I8 {
            let scale = tensors.get(&format!("{name}{}", super::quantize::SCALE_SUFFIX)).filter(|s| s.dtype() == safetensors::Dtype::F32);
            out.insert(name.clone(), super::quantize::dequantise(name, view.data(), view.shape(), scale.map(|s| (s.data(), s.shape())))?);
            continue;
        }
        let dtype = match view.dtype() {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::BF16 => DType::BF16,
            safetensors::Dtype::F64 => DType::F64,
            other => bail!("{name}: tensors of {other:?} are not supported (expected F32, F16, BF16 or F64, or I8 with its scales)"),
        };
        let t =
            Tensor::from_raw_buffer(view.data(), dtype, view.shape(), &Device::Cpu).and_then(|t| t.to_dtype(DType::F32)).map_err(|e| anyhow!("{name}: {e}"))?;
        out.insert(name.clone(), t);
    }
    Ok(strip_wrapper_prefix(out))
}

/// Writes a checkpoint as safetensors plus `<stem>.json`, the form `moge` also reads.
pub fn write_safetensors(ck: &Checkpoint, path: &Path) -> Result<()> {
    candle_core::safetensors::save(&ck.tensors, path)?;
    std::fs::write(path.with_extension("json"), serde_json::to_string_pretty(&ck.config)?)?;
    Ok(())
}
