"""moge_rs.ray on a real Ray cluster of local processes: `ray.init(num_cpus=2)` on this machine,
no dashboard, no address of another machine; shut down at the end."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if os.environ.get("MOGE_REQUIRE_ENGINES") != "1":
    pytest.importorskip("ray")
import ray  # noqa: E402

import engines  # noqa: E402
from engines import MODEL, assert_row_is_npz  # noqa: E402
from moge_rs.ray import MoGePredictor  # noqa: E402

HERE = str(Path(__file__).resolve().parent)
# Every wait on the engine is bounded (pytest-timeout): a stalled cluster fails the test.
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster():
    # The workers import engines.py (CountingPredictor) from here, and moge_rs from this
    # interpreter's environment.
    os.environ["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def test_photo_files_bytes_through_two_actors_give_moge_predicts_arrays(cluster, photos, tmp_path):
    root, paths, npz, bad = photos
    loads = tmp_path / "loads"
    loads.mkdir()
    # The reads take no CPU of the two, which the two actors hold.
    ds = ray.data.read_binary_files(str(root), include_paths=True, num_cpus=0)
    out = ds.map_batches(
        engines.CountingPredictor,
        fn_constructor_kwargs={**MODEL, "loads_dir": str(loads)},
        compute=ray.data.ActorPoolStrategy(size=2),
        num_cpus=1,
        batch_size=4,
    )
    rows = out.take_all()
    assert len(rows) == len(paths) + 1
    by_name = {Path(r["path"]).stem: r for r in rows}
    for p in paths:
        r = by_name[p.stem]
        assert r["error"] is None, r["error"]
        assert (r["width"], r["height"]) == r["depth"].shape[::-1]
        assert_row_is_npz(r, npz[p.stem])
        assert "bytes" not in r  # the input's bytes stay behind
    failed = by_name["damaged"]
    assert failed["error"] is not None and "damaged.jpg" in failed["error"], failed["error"]
    assert failed["depth"].size == 0 and np.isnan(failed["fov_x"])
    # Each actor loaded the model once, with the one thread Ray gave it.
    made = sorted(loads.iterdir())
    assert len(made) == 2, [m.name for m in made]
    assert len({m.name.split("-")[0] for m in made}) == 2
    assert all(m.read_text() == "1" for m in made)


def test_decoded_images_write_moge_predicts_npz_bit_for_bit(cluster, photos, tmp_path):
    root, paths, npz, _ = photos
    pngs = [p for p in paths if p.suffix == ".png"]
    assert len(pngs) == 10
    out_dir = tmp_path / "out"
    ds = ray.data.read_images([str(p) for p in pngs], include_paths=True, mode="RGB", num_cpus=0)
    rows = ds.map_batches(
        MoGePredictor,
        fn_constructor_kwargs={**MODEL, "output_dir": str(out_dir), "relative_to": str(root)},
        compute=ray.data.ActorPoolStrategy(size=2),
        num_cpus=1,
        batch_size=3,
    ).take_all()
    assert len(rows) == len(pngs)
    for r in rows:
        assert r["error"] is None, r["error"]
        assert "depth" not in r and "image" not in r  # summary columns only
        p = Path(r["path"])
        written = Path(r["npz"])
        # The tree mirrored under output_dir, as `moge batch` mirrors it.
        assert written == out_dir / p.parent.name / f"{p.stem}.npz"
        assert written.read_bytes() == npz[p.stem].read_bytes(), f"{p.name}: the npz differs from moge predict's"
    assert sorted(f.name for f in out_dir.rglob("*") if f.is_file()) == sorted(f"{p.stem}.npz" for p in pngs)


def test_a_path_column_runs_the_pipeline_and_raises_when_asked(cluster, photos, tmp_path):
    root, paths, npz, bad = photos
    items = [{"path": str(p), "id": i} for i, p in enumerate(paths[:6] + [bad])]
    ds = ray.data.from_items(items)
    rows = ds.map_batches(MoGePredictor, fn_constructor_kwargs={**MODEL, "outputs": ["depth", "mask"]}, compute=ray.data.ActorPoolStrategy(size=1), num_cpus=2, batch_size=7).take_all()
    rows.sort(key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(7))  # the rows' own columns come along
    for r, p in zip(rows[:6], paths[:6]):
        assert "points" not in r
        assert_row_is_npz(r, npz[p.stem], keys=("depth", "mask", "intrinsics"))
    assert "damaged.jpg" in rows[6]["error"]
    # Nothing is half-written, and with on_error="raise" the task fails with the photo's error.
    out_dir = tmp_path / "raise"
    with pytest.raises(Exception, match="damaged.jpg"):
        ds.map_batches(MoGePredictor, fn_constructor_kwargs={**MODEL, "output_dir": str(out_dir), "on_error": "raise"}, compute=ray.data.ActorPoolStrategy(size=1), num_cpus=1, batch_size=7).take_all()
    assert not [f for f in out_dir.rglob("*") if f.is_file() and f.suffix != ".npz"], "a temporary file was left behind"


def test_the_example_runs_on_the_cluster(cluster, photos, tmp_path):
    root, paths, npz, bad = photos
    out = tmp_path / "out"
    example = engines.ROOT / "examples" / "python" / "ray_batch.py"
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    r = subprocess.run([sys.executable, str(example), str(root), str(out), "--model", MODEL["model"], "--precision", "f32", "--actors", "2"], env=env, capture_output=True, text=True, timeout=240)
    # The damaged photo fails alone: listed, exit status 1, every other npz written.
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"{len(paths) + 1} photos, 1 failed" in r.stdout and "damaged.jpg" in r.stdout
    for p in paths:
        written = out / p.parent.name / f"{p.stem}.npz"
        assert written.read_bytes() == npz[p.stem].read_bytes()


def test_a_moge_server_as_every_actors_device(cluster, photos):
    root, paths, npz, bad = photos
    subset = paths[:8] + [bad]
    with engines.serve() as url:
        ds = ray.data.from_items([{"bytes": p.read_bytes(), "path": str(p)} for p in subset])
        rows = ds.map_batches(
            MoGePredictor, fn_constructor_kwargs={"server": url, "timeout": 30}, compute=ray.data.ActorPoolStrategy(size=2), num_cpus=1, batch_size=3
        ).take_all()
    by_name = {Path(r["path"]).stem: r for r in rows}
    assert len(rows) == len(subset)
    for p in paths[:8]:
        assert by_name[p.stem]["error"] is None, by_name[p.stem]["error"]
        assert_row_is_npz(by_name[p.stem], npz[p.stem])
    assert "damaged.jpg" in by_name["damaged"]["error"]
