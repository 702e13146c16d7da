"""moge_rs from a real interpreter, against the moge command line and upstream's reference outputs.

Run by scripts/test.sh after `cargo test` (which builds the `moge` binary these tests compare
with) and after the wheel is installed into a fresh virtual environment. Servers started here
listen on loopback only, and every wait is bounded.
"""

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import moge_rs
from moge_rs import MoGeError, MoGeModel, MoGeOutput

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "tests" / "fixtures"
IMAGES = FIX / "images"
TINY = FIX / "tiny_normal.pt"
MOGE = Path(os.environ.get("MOGE_BIN", ROOT / "target" / "ci" / "moge"))
ARRAYS = ("points", "depth", "normal", "mask")


@pytest.fixture(scope="module")
def model():
    with MoGeModel.from_pretrained(TINY, precision="f32", device="cpu") as m:
        yield m


def bits(a):
    a = np.asarray(a)
    return a.view(np.uint8 if a.dtype == np.bool_ else np.uint32) if a.dtype != np.uint8 else a


def assert_same(a: MoGeOutput, b: MoGeOutput, what=""):
    for k in ARRAYS + ("intrinsics",):
        x, y = a[k], b[k]
        if x is None or y is None:
            assert x is None and y is None, f"{what}{k}: one is None"
            continue
        assert x.shape == y.shape and x.dtype == y.dtype, f"{what}{k}: {x.shape} {x.dtype} vs {y.shape} {y.dtype}"
        assert np.array_equal(bits(x), bits(y)), f"{what}{k}: values differ"
    assert a.metric_scale == b.metric_scale and a.fov_x == b.fov_x


def cli(*args, timeout=120):
    assert MOGE.is_file(), f"{MOGE}: build it first (cargo test --profile ci)"
    r = subprocess.run([str(MOGE), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    return r


def cli_npz(tmp_path, photo, *opts):
    out = tmp_path / "cli"
    r = cli("predict", photo, "-o", out, "--weights", TINY, "--precision", "f32", "--device", "cpu", *opts)
    assert r.returncode == 0, r.stderr
    return out / (Path(photo).stem + ".npz")


# -- the command line's numbers


@pytest.mark.parametrize("photo", ["rgb_64x48.png", "rgb_40x72.png", "gray_50x50.png", "rgba_45x30.png", "rgb16_48x36.png"])
def test_a_path_gives_the_clis_npz_bit_for_bit(model, tmp_path, photo):
    npz = cli_npz(tmp_path, IMAGES / photo, "--num-tokens", "1200")
    out = model(IMAGES / photo, num_tokens=1200)
    with np.load(npz) as z:
        for k in ARRAYS + ("intrinsics", "intrinsics_pixels"):
            want = z[k].astype(bool) if k == "mask" else z[k]
            assert np.array_equal(bits(out[k]), bits(want)), f"{photo}: {k} differs from moge predict's"
        assert out.metric_scale == z["metric_scale"] and out.fov_x == z["fov_x"] and out.fov_y == z["fov_y"]
    mine = tmp_path / "mine.npz"
    out.save_npz(mine)
    assert mine.read_bytes() == npz.read_bytes(), "save_npz's bytes differ from moge predict's npz"


def test_options_reach_the_engine_as_the_clis_flags(model, tmp_path):
    photo = IMAGES / "rgb_64x48.png"
    npz = cli_npz(tmp_path, photo, "--num-tokens", "900", "--fov-x", "70", "--no-mask", "--no-force-projection")
    out = model(str(photo), num_tokens=900, fov_x=70, apply_mask=False, force_projection=False)
    with np.load(npz) as z:
        for k in ("points", "depth", "normal"):
            assert np.array_equal(bits(out[k]), bits(z[k])), k
    # and they do change the numbers
    plain = model(str(photo), num_tokens=900)
    assert not np.array_equal(bits(plain.depth), bits(out.depth))
    assert abs(out.fov_x - 70) < 1e-3


def test_int8_is_the_clis_int8_and_close_to_f32(model, tmp_path):
    photo = IMAGES / "rgb_64x48.png"
    out_dir = tmp_path / "int8"
    r = cli("predict", photo, "-o", out_dir, "--weights", TINY, "--precision", "int8", "--device", "cpu", "--num-tokens", "1200")
    assert r.returncode == 0, r.stderr
    with MoGeModel.from_pretrained(TINY, precision="int8", device="cpu") as m:
        out = m(photo, num_tokens=1200)
    with np.load(out_dir / "rgb_64x48.npz") as z:
        for k in ("points", "depth", "normal"):
            assert np.array_equal(bits(out[k]), bits(z[k])), k
    f32 = model(photo, num_tokens=1200)
    assert not np.array_equal(bits(f32.depth), bits(out.depth)), "int8 changed nothing"
    both = np.isfinite(f32.depth) & np.isfinite(out.depth)
    assert both.mean() > 0.5
    assert np.median(np.abs(out.depth[both] / f32.depth[both] - 1)) < 0.01


def test_fov_x_exif_reads_each_photo_files_focal_length_as_the_cli_does(model, tmp_path):
    photo = IMAGES / "exif_f35_26mm_80x60.jpg"
    npz = cli_npz(tmp_path, photo, "--num-tokens", "900", "--fov-x", "exif")
    out = model(photo, num_tokens=900, fov_x="exif")
    want = np.degrees(2 * np.arctan(np.hypot(36, 24) / 52 * 0.8))
    with np.load(npz) as z:
        assert np.array_equal(bits(out.depth), bits(z["depth"])) and out.fov_x == z["fov_x"]
    assert abs(out.fov_x - want) < 1e-3
    # Through the pipeline too; a photo without the tags is estimated.
    many = model.predict_many([photo, IMAGES / "rgb_64x48.png"], num_tokens=900, fov_x="exif")
    assert np.array_equal(bits(many[0].depth), bits(out.depth))
    assert np.array_equal(bits(many[1].depth), bits(model(IMAGES / "rgb_64x48.png", num_tokens=900).depth))
    # An image in memory has no EXIF; a word that is not "exif" is no field of view.
    with pytest.raises(MoGeError, match="needs a photo file"):
        model(np.zeros((48, 64, 3), np.uint8), fov_x="exif")
    with pytest.raises(ValueError, match="exif"):
        model(photo, fov_x="exify")


@pytest.mark.parametrize("fit", ["pad", "stretch"])
def test_fit_on_a_canvas_as_batch_does(model, tmp_path, fit):
    photo = IMAGES / "rgb_40x72.png"
    out_dir = tmp_path / "b"
    r = cli("batch", photo, "-o", out_dir, "--weights", TINY, "--precision", "f32", "--device", "cpu", "--num-tokens", "1200", "--fit", fit, "--canvas", "64x48")
    assert r.returncode == 0, r.stderr
    out = model(photo, fit=fit, canvas=(64, 48), num_tokens=1200)
    with np.load(out_dir / "rgb_40x72.npz") as z:
        assert np.array_equal(bits(out.depth), bits(z["depth"]))
    assert out.depth.shape == (72, 40)


# -- every input form


def test_every_input_form_gives_the_same_arrays(model):
    from PIL import Image

    photo = IMAGES / "rgb_64x48.png"
    ref = model(photo)
    rgb = np.asarray(Image.open(photo).convert("RGB"))
    forms = {
        "str": str(photo),
        "PIL": Image.open(photo),
        "HxWx3 uint8": rgb,
        "3xHxW uint8": np.ascontiguousarray(rgb.transpose(2, 0, 1)),
        "HxWx3 uint8, not contiguous": np.asfortranarray(rgb),
        "HxWx4 uint8": np.dstack([rgb, np.full(rgb.shape[:2], 255, np.uint8)]),
    }
    for name, image in forms.items():
        assert_same(model(image), ref, f"{name}: ")
    # a list gives a list
    outs = model([photo, rgb])
    assert isinstance(outs, list) and len(outs) == 2
    assert_same(outs[0], ref), assert_same(outs[1], ref)


def test_float_images_follow_upstream_infer(model):
    rng = np.random.default_rng(3)
    img = rng.random((3, 40, 56), dtype=np.float32)
    chw = model(img)
    assert_same(model(np.ascontiguousarray(img.transpose(1, 2, 0))), chw, "HxWx3 float: ")
    assert_same(model(img.astype(np.float64)), chw, "float64: ")
    # upstream infer(): the same numbers as a dict, batched as the input
    d = model.infer(img)  # upstream's defaults: resolution level 9
    assert set(d) == {"points", "intrinsics", "depth", "mask", "normal"}
    level9 = model(img, resolution_level=9)
    assert np.array_equal(bits(d["depth"]), bits(level9.depth)) and d["mask"].dtype == np.bool_
    assert not np.array_equal(bits(level9.depth), bits(chw.depth))  # 3600 tokens, not the CLI's 1800
    b = model.infer(np.stack([img, img[:, ::-1].copy()]), fov_x=[60.0, 80.0])
    assert b["depth"].shape == (2, 40, 56) and b["intrinsics"].shape == (2, 3, 3)
    assert np.array_equal(bits(b["depth"][0]), bits(model(img, fov_x=60.0, resolution_level=9).depth))
    fx = b["intrinsics"][:, 0, 0]
    assert np.allclose(np.degrees(2 * np.arctan(0.5 / fx)), [60.0, 80.0], atol=1e-3)


def test_grayscale_arrays_are_the_grayscale_photo(model):
    from PIL import Image

    photo = IMAGES / "gray_50x50.png"
    gray = np.asarray(Image.open(photo).convert("L"))
    assert gray.ndim == 2
    assert_same(model(gray), model(photo))


def test_torch_tensors_when_torch_is_installed(model):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    img = rng.random((3, 32, 48), dtype=np.float32)
    ref = model(img)
    assert_same(model(torch.from_numpy(img)), ref)
    d = model.infer(torch.from_numpy(img))
    level9 = model(img, resolution_level=9)  # infer()'s default, upstream's
    assert isinstance(d["depth"], torch.Tensor) and np.array_equal(bits(d["depth"].numpy()), bits(level9.depth))
    batch = model.infer(torch.from_numpy(np.stack([img, img])))
    assert tuple(batch["points"].shape) == (2, 32, 48, 3) and batch["mask"].dtype == torch.bool
    t = model(img).to_torch()
    assert isinstance(t["points"], torch.Tensor)


def test_infer_panorama_is_the_clis_panorama(model, tmp_path):
    pano = IMAGES / "pano_384x192.png"
    r = cli("panorama", pano, "-o", tmp_path, "--weights", TINY, "--precision", "f32", "--view-size", 96, "--num-tokens", 300)
    assert r.returncode == 0, r.stderr
    out = model.infer_panorama(pano, view_size=96, num_tokens=300)
    with np.load(tmp_path / "pano_384x192.npz") as z:
        for k in ("points", "depth", "view_metric_scale"):
            assert np.array_equal(bits(out[k]), bits(z[k])), f"{k} differs from moge panorama's"
        assert np.array_equal(out["mask"], z["mask"].astype(bool))
        assert out["metric_scale"] == z["metric_scale"]
    assert out["depth"].shape == (192, 384) and out["points"].shape == (192, 384, 3)
    # An array gives the same as the file.
    from PIL import Image

    arr = np.asarray(Image.open(pano).convert("RGB"))
    same = model.infer_panorama(arr, view_size=96, num_tokens=300)
    assert np.array_equal(bits(same["depth"]), bits(out["depth"]))
    with pytest.raises(MoGeError, match="twice its height"):
        model.infer_panorama(IMAGES / "rgb_64x48.png", view_size=96, num_tokens=300)


# -- against upstream's reference outputs (made by tests/make_fixtures.py with dlr-moge 2.0.0)

CASES = json.loads((FIX / "cases.json").read_text())["cases"]
WELL_POSED = [c for c in CASES if not c["name"].startswith("r_")]


def pcc(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    ok = np.isfinite(a) & np.isfinite(b)
    return float(np.corrcoef(a[ok], b[ok])[0, 1])


MOGE3 = FIX / "moge3"


def test_moge3_infer_per_step_follows_the_reference():
    """MoGe-3 through upstream's ``infer`` signature (v3: ``refine_steps``, ``return_per_step``)
    against tests/make_moge3_fixtures.py's reference: every step's depth, and the per-step lists
    batched as upstream's. Focal is judged against the solve run to convergence (SciPy's stops
    at ftol 1e-3; the Rust test explains)."""
    z = np.load(MOGE3 / "m3_rgb_60.npz")
    steps = int(z["refine_steps"])
    with MoGeModel.from_pretrained(MOGE3 / "tiny_moge3.pt", precision="f32", device="cpu") as m:
        img = z["image_u8"].astype(np.float32).transpose(2, 0, 1) / 255.0
        r = m.infer(img, num_tokens=int(z["num_tokens"]), refine_steps=steps, return_per_step=True)
        assert len(r["depth_per_step"]) == steps + 1 and len(r["intrinsics_per_step"]) == steps + 1
        np.testing.assert_array_equal(r["depth_per_step"][-1], r["depth"])
        for s in range(steps + 1):
            want = z[f"depth_{s}"] + (z[f"shift_converged_{s}"] - z[f"shift_{s}"]) * z["metric_scale"]
            got = r["depth_per_step"][s]
            both = np.isfinite(got) & np.isfinite(want)
            assert (np.isfinite(got) == np.isfinite(want)).mean() >= 0.999, s
            assert np.median(np.abs(got[both] - want[both]) / want[both]) <= 1e-4, s
            fx = r["intrinsics_per_step"][s][0, 0] / z[f"intrinsics_{s}"][0, 0] * z[f"focal_{s}"]
            assert abs(fx / z[f"focal_converged_{s}"] - 1) <= 1e-4, s
        # A batch of two: per-step lists of batched arrays.
        rb = m.infer(np.stack([img, img]), num_tokens=int(z["num_tokens"]), refine_steps=1, return_per_step=True)
        assert [d.shape for d in rb["depth_per_step"]] == [(2,) + z["depth"].shape] * 2
        # refine_steps 0 is the MoGe-2 output of the same network, and the default is 3 steps.
        out0 = m(z["image_u8"], num_tokens=int(z["num_tokens"]), refine_steps=0)
        np.testing.assert_array_equal(out0.depth, r["depth_per_step"][0])
        assert out0.per_step is None
        out = m(z["image_u8"], num_tokens=int(z["num_tokens"]))
        np.testing.assert_array_equal(out.depth, r["depth"])
    with MoGeModel.from_pretrained(TINY, precision="f32", device="cpu") as v2:
        with pytest.raises(MoGeError, match="no refiner"):
            v2(z["image_u8"], num_tokens=60, refine_steps=1)


@pytest.mark.parametrize("case", WELL_POSED, ids=[c["name"] for c in WELL_POSED])
def test_upstream_parity_on_the_fixture_cases(case):
    """The f32 gates of the Rust parity tests (tests/it/support/reference.rs, STRICT)."""
    z = np.load(FIX / "cases" / f"{case['name']}.npz")
    with MoGeModel.from_pretrained(FIX / case["checkpoint"], precision="f32", device="cpu") as m:
        out = m(z["image_u8"], num_tokens=case["num_tokens"], resolution_level=case["resolution_level"], fov_x=case["fov_x"],
                force_projection=case["force_projection"], apply_mask=case["apply_mask"])
    mask_ref = z["mask"].astype(bool)
    assert (out.mask == mask_ref).mean() >= 0.999
    assert pcc(out.depth, z["depth"]) >= 0.99999 and pcc(out.points, z["points"]) >= 0.99999
    both = np.isfinite(out.depth) & np.isfinite(z["depth"])
    assert np.max(np.abs(out.depth[both] - z["depth"][both]) / np.abs(z["depth"][both])) <= 1e-3
    if "normal" in z:
        v = out.mask & mask_ref
        assert pcc(out.normal[v], z["normal"][v]) >= 0.99999
    k, kr = out.intrinsics, z["intrinsics"]
    assert np.max(np.abs(k - kr) / np.maximum(np.abs(kr), 1e-6)) <= 1e-4
    assert abs(out.metric_scale - float(z["fwd_metric_scale"])) / float(z["fwd_metric_scale"]) <= 1e-4


def test_upstream_in_the_same_interpreter_when_installed(model):
    """Upstream's package (PyPI dlr-moge, `import moge`) beside moge_rs, where this environment has
    it and PyTorch: the same tensor through both `infer()`s, held to the same f32 gates."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("cv2")
    upstream = pytest.importorskip("moge.model.v2")
    sys.path.insert(0, str(ROOT / "tests"))
    import make_fixtures  # registers the test-only tiny backbone that the fixture checkpoints name

    ck = make_fixtures.CHECKPOINTS["tiny_normal"]
    make_fixtures.register_tiny_backbone(ck["embed_dim"], ck["depth"])
    theirs_model = upstream.MoGeModel.from_pretrained(str(TINY)).eval()
    from PIL import Image

    img = np.asarray(Image.open(IMAGES / "rgb_64x48.png").convert("RGB"), np.float32) / 255
    chw = np.ascontiguousarray(img.transpose(2, 0, 1))
    for kw in ({"num_tokens": 1200}, {"num_tokens": 2000, "fov_x": 60.0}):
        with torch.no_grad():
            theirs = {k: v.numpy() for k, v in theirs_model.infer(torch.from_numpy(chw), use_fp16=False, **kw).items()}
        ours = model.infer(torch.from_numpy(chw), **kw)
        assert isinstance(ours["depth"], torch.Tensor)
        ours = {k: v.numpy() for k, v in ours.items()}
        assert set(ours) == set(theirs)
        assert (ours["mask"] == theirs["mask"]).mean() >= 0.999
        for k in ("points", "depth"):
            assert pcc(ours[k], theirs[k]) >= 0.99999, k
        v = ours["mask"] & theirs["mask"]
        assert pcc(ours["normal"][v], theirs["normal"][v]) >= 0.99999
        assert np.max(np.abs(ours["depth"][v] - theirs["depth"][v]) / np.abs(theirs["depth"][v])) <= 1e-3
        assert np.allclose(ours["intrinsics"], theirs["intrinsics"], rtol=1e-4)


# -- the outputs


def test_the_output_reads_like_tt_moges(model):
    out = model(IMAGES / "rgb_64x48.png")
    assert repr(out).startswith("MoGeOutput(64x48, valid ") and "fov_x" in repr(out) and "metric_scale" in repr(out)
    assert (out.width, out.height) == (64, 48)
    assert out.points.shape == (48, 64, 3) and out.points.dtype == np.float32
    assert out.mask.dtype == np.bool_ and out.normal.shape == (48, 64, 3)
    assert out["depth"] is out.depth
    with pytest.raises(KeyError):
        out["nope"]
    assert np.isinf(out.depth[~out.mask]).all() and np.isfinite(out.depth[out.mask]).all()
    K = out.intrinsics_pixels
    assert np.isclose(K[0, 0], out.intrinsics[0, 0] * 64) and np.isclose(K[1, 2], out.intrinsics[1, 2] * 48)
    assert set(out.to_dict()) == {"points", "intrinsics", "depth", "mask", "normal"}
    # the arrays are the user's: writable, and save_npz writes what they hold
    out.depth[0, 0] = 7.0


# -- many images


def test_predict_many_equals_single_calls_in_order(model, tmp_path):
    photos = [IMAGES / n for n in ("rgb_64x48.png", "rgb_40x72.png", "gray_50x50.png", "tiny_8x8.png", "rgb_64x48.png")]
    many = model.predict_many(photos, num_tokens=800)
    assert len(many) == len(photos)
    for p, o in zip(photos, many):
        assert_same(o, model(p, num_tokens=800), f"{p.name}: ")
    # arrays and paths mixed: in order too, and an image that fails does not end the iteration
    gray = np.asarray(model(photos[0]).mask, np.uint8) * 255
    mixed = model.imap([photos[1], np.zeros((4, 4, 3), np.uint8), gray])
    assert len(mixed) == 3 and next(mixed).depth.shape == (72, 40)
    with pytest.raises(ValueError, match="4x4"):
        next(mixed)
    assert next(mixed).depth.shape == (48, 64)
    with pytest.raises(StopIteration):
        next(mixed)


def test_a_failed_photo_raises_at_its_turn_and_the_rest_come(model, tmp_path):
    bad = tmp_path / "cut.jpg"
    bad.write_bytes(jpeg_bytes()[:400])
    it = model.imap([IMAGES / "rgb_64x48.png", bad, tmp_path / "missing.png", IMAGES / "rgb_40x72.png"])
    assert next(it).depth.shape == (48, 64)
    with pytest.raises(MoGeError, match="cut.jpg") as e:
        next(it)
    assert type(e.value).__module__ == "moge_rs" and isinstance(e.value, RuntimeError)
    with pytest.raises(FileNotFoundError, match="missing.png"):
        next(it)
    assert next(it).depth.shape == (72, 40)
    with pytest.raises(StopIteration):
        next(it)


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_imap_keeps_memory_flat_over_hundreds_of_photos(model, tmp_path):
    from PIL import Image

    rng = np.random.default_rng(1)
    photo = tmp_path / "p.png"
    Image.fromarray(rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)).save(photo)
    n, seen, at = 300, 0, {}
    # each output is ~1.6 MB. Bounded, the pipeline holds a dozen or so ahead of its reader
    # (~40 MiB more seen after the pause); with its queues unbounded it ran ahead through the
    # pause (109 MiB more after 3 s, tried), and the 270 photos left would all fit in ~430 MB
    for out in model.imap([photo] * n, num_tokens=300):
        seen += 1
        assert out.depth.shape == (240, 320)
        del out
        if seen == 30:
            at["before the pause"] = rss_mib()
            time.sleep(5)  # a reader slower than the pipeline: it must wait, not pile up
            at["after the pause"] = rss_mib()
    at["at the end"] = rss_mib()
    assert seen == n
    print(", ".join(f"RSS {k} {v:.0f} MiB" for k, v in at.items()))
    for k in ("after the pause", "at the end"):
        grew = at[k] - at["before the pause"]
        assert grew < 64, f"memory grew by {grew:.0f} MiB {k}"


def test_dropping_an_iterator_stops_the_pipeline(model):
    it = model.imap([IMAGES / "rgb_64x48.png"] * 50)
    next(it)
    it.close()  # the photos still queued are dropped: this returns, nothing hangs
    with pytest.raises(StopIteration):
        next(it)
    assert model(IMAGES / "rgb_64x48.png").depth.shape == (48, 64)


# -- threads


def test_threads_share_one_model_and_match_serial_calls(model):
    photos = [IMAGES / "rgb_64x48.png", IMAGES / "rgb_40x72.png", IMAGES / "gray_50x50.png", IMAGES / "rgba_45x30.png"]
    serial = [model(p) for p in photos]
    results = [None] * 4
    errors = []

    def work(i):
        try:
            for _ in range(3):
                results[i] = model(photos[i])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and all(not t.is_alive() for t in threads)
    for s, r in zip(serial, results):
        assert_same(r, s)


def test_the_gil_is_released_during_a_forward(model):
    rng = np.random.default_rng(2)
    big = rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)
    ticks = 0
    running = threading.Event()
    stop = threading.Event()

    def spin():
        nonlocal ticks
        running.set()
        while not stop.is_set():
            ticks += 1

    t = threading.Thread(target=spin)
    t.start()
    running.wait(5)
    before = ticks
    start = time.perf_counter()
    model(big, num_tokens=3600)
    took = time.perf_counter() - start
    during = ticks - before
    stop.set()
    t.join(5)
    # with the GIL held through the call, the other thread would not run until it returned
    print(f"forward {took * 1e3:.0f} ms, other thread ran {during} loops")
    assert during > 1000, f"the other thread ran {during} loops during a {took:.2f} s call"


# -- errors


def jpeg_bytes():
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def test_errors_name_the_file_and_the_reason(model, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.png"):
        model(tmp_path / "nope.png")
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(jpeg_bytes()[:500])  # a copy that stopped early
    with pytest.raises(MoGeError, match="cut.jpg") as e:
        model(cut)
    assert "truncated" in str(e.value) or "damaged" in str(e.value) or "end" in str(e.value), str(e.value)
    with pytest.raises(FileNotFoundError, match="no_such.pt"):
        MoGeModel.from_pretrained(tmp_path / "no_such.pt")


def test_bad_arrays_and_options_are_refused_before_any_work(model):
    with pytest.raises(TypeError, match="int32"):
        model(np.zeros((16, 16, 3), np.int32))
    with pytest.raises(ValueError, match="5 x 16 x 16"):
        model(np.zeros((5, 16, 16), np.uint8))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        model(np.full((3, 16, 16), 200.0, np.float32))
    with pytest.raises(ValueError, match="4x4"):
        model(np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(TypeError, match="dict"):
        model({})
    for bad in ({"num_tokens": 0}, {"resolution_level": 1000}, {"fov_x": 500.0}, {"fit": "squash"}):
        with pytest.raises(ValueError):
            model(IMAGES / "rgb_64x48.png", **bad)
    with pytest.raises(ValueError, match="precision"):
        MoGeModel.from_pretrained(TINY, precision="int3")
    with pytest.raises(ValueError, match="device"):
        MoGeModel.from_pretrained(TINY, device="tpu")


def test_a_closed_model_says_so():
    m = MoGeModel.from_pretrained(TINY, precision="f32", device="cpu")
    with m:
        assert m(IMAGES / "tiny_8x8.png").depth.shape == (8, 8)
    with pytest.raises(MoGeError, match="closed"):
        m(IMAGES / "tiny_8x8.png")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_server_is_a_connection_error():
    port = free_port()  # closed again: nothing listens there
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}"):
        MoGeModel.from_pretrained(server=f"http://127.0.0.1:{port}", timeout=5)
    assert time.monotonic() - start < 60


# -- a server as the device


@pytest.fixture(scope="module")
def server():
    from engines import serve

    with serve() as url:
        yield url


def test_a_moge_server_as_the_device_gives_the_local_arrays(model, server):
    with MoGeModel.from_pretrained(server=server, timeout=30) as remote:
        assert server in remote.device
        for photo in ("rgb_64x48.png", "rgb_40x72.png"):
            assert_same(remote(IMAGES / photo), model(IMAGES / photo), f"{photo}: ")
        rgb = np.asarray(__import__("PIL.Image", fromlist=["Image"]).open(IMAGES / "rgb_64x48.png").convert("RGB"))
        assert_same(remote(rgb), model(rgb), "array: ")
        many = remote.predict_many([IMAGES / "rgb_64x48.png", IMAGES / "gray_50x50.png"])
        assert_same(many[1], model(IMAGES / "gray_50x50.png"))


def test_version_and_stubs_ship_with_the_package():
    pkg = Path(moge_rs.__file__).parent
    assert (pkg / "py.typed").is_file() and (pkg / "_native.pyi").is_file()
    assert moge_rs.__version__.count(".") == 2
    assert "MoGeModel" in (moge_rs.MoGeModel.__doc__ or "") or moge_rs.MoGeModel.from_pretrained.__doc__
