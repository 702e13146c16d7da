"""The engines' adapters called as the engines call them, in this process (no cluster): their
options checked before any work, and the rows of a batch."""

import numpy as np
import pytest

from engines import MODEL, TINY
from moge_rs import _native
from moge_rs.ray import MoGePredictor
from moge_rs.spark import make_predict_fn


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"outputs": ["depth", "nope"]}, "nope"),
        ({"column": "pixels"}, "column"),
        ({"on_error": "ignore"}, "on_error"),
        ({"relative_to": "/data"}, "output_dir"),
        ({"fov_x": 500.0}, "fov"),
        ({"fit": "squash"}, "squash"),
    ],
)
def test_bad_options_are_refused_before_any_work(bad, match):
    with pytest.raises(ValueError, match=match):
        MoGePredictor(**{**MODEL, **bad})


def test_spark_options_are_checked_when_the_udf_is_made():
    with pytest.raises(ValueError, match="image_shape"):
        make_predict_fn(str(TINY), input="image")
    with pytest.raises(ValueError, match="names its row"):
        make_predict_fn(str(TINY), input="path", named=True)
    with pytest.raises(ValueError, match="input"):
        make_predict_fn(str(TINY), input="url")
    assert make_predict_fn(str(TINY), input="image", image_shape=(48, 64)).input_tensor_shapes == [[48, 64, 3]]
    assert make_predict_fn(str(TINY), input="image", image_shape=(48, 64), named=True).input_tensor_shapes == [[48, 64, 3], None]


def test_threads_are_bounded():
    for n in (0, 100000):
        with pytest.raises(ValueError, match="threads"):
            _native.set_threads(n)


def test_a_batch_in_process_and_a_photo_outside_relative_to(photos, tmp_path):
    root, paths, npz, bad = photos
    pred = MoGePredictor(**MODEL, output_dir=str(tmp_path / "out"), relative_to=str(root / "a"))
    inside = [p for p in paths if p.parent.name == "a"][:2]
    outside = [p for p in paths if p.parent.name == "b"][:1]
    batch = {"path": np.array([str(p) for p in inside + outside + [bad]], dtype=object)}
    out = pred(batch)
    assert list(out["path"]) == list(batch["path"])
    assert [e is None for e in out["error"]] == [True, True, False, False]
    assert "not below relative_to" in out["error"][2] and "damaged.jpg" in out["error"][3]
    for p, written in zip(inside, out["npz"][:2]):
        assert written == str(tmp_path / "out" / f"{p.stem}.npz")
        assert open(written, "rb").read() == npz[p.stem].read_bytes()
    assert out["npz"][2] is None and out["width"][3] == 0 and np.isnan(out["metric_scale"][3])


def test_rows_that_cannot_be_named_or_read_fail_alone(photos, tmp_path):
    import shutil

    root, paths, npz, bad = photos
    first = paths[0]
    twin = tmp_path / "elsewhere" / first.name  # the same file name in another folder
    twin.parent.mkdir()
    shutil.copy(first, twin)
    pred = MoGePredictor(**MODEL, output_dir=str(tmp_path / "out"))
    out = pred({"path": np.array([str(first), None, str(twin), str(paths[2])], dtype=object)})
    assert out["error"][0] is None and out["error"][3] is None
    assert "not a string" in out["error"][1]
    assert "give relative_to" in out["error"][2] and str(twin) in out["error"][2]
    assert open(out["npz"][0], "rb").read() == npz[first.stem].read_bytes()
    assert sorted(f.name for f in (tmp_path / "out").iterdir()) == sorted([f"{first.stem}.npz", f"{paths[2].stem}.npz"])


def test_an_unreachable_server_fails_the_actor_not_its_rows():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionError):
        MoGePredictor(server=f"http://127.0.0.1:{port}", timeout=5)
