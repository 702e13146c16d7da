// The entry points shared by the cargo-fuzz targets (tests/fuzz/fuzz_targets/) and the CI replay
// test (tests/it/fuzz_replay.rs): each takes arbitrary bytes the way the program takes them from a
// file or a server, and must answer with a value or an error: never a panic, a hang or an
// allocation out of proportion to its input.

/// A photo, as `predict` and `batch` read it (format sniffing, integrity check, size limit,
/// EXIF orientation and focal length, conversion to 8-bit RGB). Odd lengths also try
/// `--allow-truncated`.
pub fn decode(data: &[u8]) {
    let opts = moge::image_io::DecodeOptions {
        apply_exif: true,
        // 4 megapixels: keeps the fuzzer's memory limit for real decodes of claimed sizes.
        max_pixels: 1 << 22,
        allow_truncated: data.len() % 2 == 1,
        fov: moge::image_io::FovFrom::Exif,
    };
    if let Ok(d) = moge::image_io::decode_bytes(data, &opts) {
        assert_eq!(d.image.as_raw().len(), d.image.width() as usize * d.image.height() as usize * 3);
        assert!(d.known_fov.is_none_or(|f| f.degrees > 0.0 && f.degrees < 180.0));
    }
}

/// A `model.pt` (`torch.save` zip + pickle), then the model bound to it.
pub fn checkpoint_pt(data: &[u8]) {
    if let Ok(ck) = moge::model::checkpoint::Checkpoint::from_torch_bytes(data) {
        let _ = moge::Model::build(ck.config, ck.tensors, &moge::model::BuildOptions::default());
    }
}

/// A `.safetensors` file and its JSON config: the bytes up to the first NUL are the JSON.
pub fn checkpoint_safetensors(data: &[u8]) {
    let split = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let json = String::from_utf8_lossy(&data[..split]);
    let st = data.get(split + 1..).unwrap_or_default();
    if let Ok(ck) = moge::model::checkpoint::Checkpoint::from_safetensors_bytes(st, &json) {
        let _ = moge::Model::build(ck.config, ck.tensors, &moge::model::BuildOptions::default());
    }
}

/// The hub's answer to `HEAD .../resolve/REV/model.pt`, as text: a status line, then
/// `name: value` header lines; the last header also stands for a resumed download's
/// `Content-Range`.
pub fn hub_head(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.lines();
    let status = lines.next().and_then(|l| l.trim().parse::<u16>().ok()).unwrap_or(200);
    let headers: Vec<(String, String)> = lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.to_owned())).collect();
    let url = "http://127.0.0.1:9/Ruicheng/moge-2-vits-normal/resolve/main/model.pt";
    match moge::hub::answer::read_head(url, status, |name| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())) {
        moge::hub::answer::Head::File { etag, commit, .. } => {
            assert!(moge::hub::answer::is_safe_name(&etag) && moge::hub::answer::is_safe_name(&commit));
        }
        moge::hub::answer::Head::Redirect(next) => assert!(next.starts_with("http://127.0.0.1:9/")),
        _ => {}
    }
    let have = data.len() as u64;
    let _ = moge::hub::answer::range_continues(headers.last().map(|(_, v)| v.as_str()), have);
}

/// A `data.pkl` inside an otherwise valid archive whose storages `0`..`7` hold 64 bytes each:
/// the pickle reader and the tensor interpretation, past the zip's checksums (which would
/// reject almost every mutation of a whole `.pt`).
pub fn checkpoint_pickle(data: &[u8]) {
    let _ = moge::model::checkpoint::Checkpoint::from_torch_bytes(&pickle_archive(data));
}

pub fn pickle_archive(pickle: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut out = std::io::Cursor::new(Vec::new());
    {
        let mut z = zip::ZipWriter::new(&mut out);
        let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        z.start_file("archive/data.pkl", opts).unwrap();
        z.write_all(pickle).unwrap();
        for k in 0..8 {
            z.start_file(format!("archive/data/{k}"), opts).unwrap();
            z.write_all(&[0x3F; 64]).unwrap();
        }
        z.finish().unwrap();
    }
    out.into_inner()
}
