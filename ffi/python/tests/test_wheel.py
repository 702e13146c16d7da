"""The installed package as a user without Rust has it (scripts/test.sh installs the manylinux
wheel that scripts/build-wheels.sh built into a fresh virtual environment, and runs these with
no cargo or rustc on PATH): the module comes from that environment, and the `moge` command it
installs is the binary's command line."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import moge_rs
from engines import CLI_MODEL, MOGE, ROOT

WHEEL = os.environ.get("MOGE_WHEEL_TEST") == "1"
IMAGES = ROOT / "tests" / "fixtures" / "images"


@pytest.mark.skipif(not WHEEL, reason="the wheel's own test (MOGE_WHEEL_TEST=1, set by scripts/test.sh)")
def test_the_wheel_is_what_runs_without_a_rust_toolchain():
    assert shutil.which("cargo") is None and shutil.which("rustc") is None, "the wheel test runs with no Rust on PATH"
    here = Path(moge_rs.__file__).resolve()
    assert here.is_relative_to(Path(sys.prefix).resolve()), f"moge_rs from {here}, not from the environment {sys.prefix}"
    assert not here.is_relative_to(ROOT / "ffi" / "python" / "python"), "moge_rs imported from the source tree"
    native = list(here.parent.glob("_native*.so"))
    assert len(native) == 1 and native[0].name == "_native.abi3.so"


def moge_command():
    exe = Path(sys.prefix) / "bin" / "moge"
    if not exe.is_file():
        pytest.skip("the `moge` entry point is installed with the package (pip install), not in a development build")
    return exe


def test_the_installed_moge_command_is_the_binarys(tmp_path):
    exe = moge_command()
    photo = IMAGES / "rgb_64x48.png"
    outs = {}
    for name, cmd in (("binary", [str(MOGE)]), ("wheel", [str(exe)]), ("module", [sys.executable, "-m", "moge_rs"])):
        out = tmp_path / name
        r = subprocess.run([*cmd, "predict", str(photo), "-o", str(out), *CLI_MODEL, "--format", "npz,json"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{name}: {r.stderr}"
        outs[name] = (out / "rgb_64x48.npz").read_bytes()
    assert outs["wheel"] == outs["binary"] and outs["module"] == outs["binary"]
    # Exit codes and messages too: a missing photo beside a good one.
    codes = []
    for cmd in ([str(MOGE)], [str(exe)]):
        r = subprocess.run([*cmd, "predict", str(photo), str(tmp_path / "missing.jpg"), "-o", str(tmp_path / "x"), *CLI_MODEL], capture_output=True, text=True, timeout=120)
        assert "missing.jpg" in r.stderr
        codes.append(r.returncode)
    assert codes[0] == codes[1] != 0
    v = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and v.stdout.split() == ["moge", moge_rs.__version__]


def test_a_photo_files_bytes_are_the_file(tmp_path):
    from moge_rs import MoGeError, MoGeModel

    with MoGeModel.from_pretrained(ROOT / "tests" / "fixtures" / "tiny_normal.pt", precision="f32", device="cpu") as m:
        for name in ("rgb_64x48.png", "rgb_40x72.png"):
            a, b = m(IMAGES / name), m((IMAGES / name).read_bytes())
            for k in ("points", "depth", "mask", "intrinsics"):
                assert np.array_equal(a[k], b[k]), f"{name}: {k}"
        cut = (IMAGES / "rgb_64x48.png").read_bytes()[:200]
        with pytest.raises(MoGeError, match="image's bytes"):
            m(cut)


def test_ctrl_c_stops_the_installed_command_as_it_stops_the_binary(tmp_path):
    """SIGINT part way through `moge batch`: exit status 130, no partial file, as the binary
    (tests/it/batch.rs); Python's own handler must not turn it into a KeyboardInterrupt."""
    import json
    import signal

    from PIL import Image

    exe = moge_command()
    photos = tmp_path / "in"
    photos.mkdir()
    rng = np.random.default_rng(1)
    for i in range(40):
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(photos / f"p{i:03d}.png")
    out = tmp_path / "out"
    cmd = [str(exe), "batch", str(photos), "-o", str(out), *CLI_MODEL, "--format", "npz,png,glb", "--json", "--jobs", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        assert all(lines), "the batch ended before the interruption"
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 130, err
    assert "KeyboardInterrupt" not in err and "--skip-existing" in err, err
    done = [json.loads(x) for x in lines + rest.splitlines() if x.strip()]
    ok = {Path(d["input"]).stem for d in done if d["status"] == "ok"}
    assert 3 <= len(ok) < 40
    files = [f for f in out.rglob("*") if f.is_file()]
    assert not [f for f in files if "moge-tmp" in f.name]
    # Every file present belongs to a photo that finished (x.npz, x.depth.png, x.glb, ...).
    assert files and {f.name.split(".")[0] for f in files} <= ok
