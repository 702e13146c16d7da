"""moge_rs.spark through a real Spark session: `local[2]` on this machine (the JVM's driver on
loopback, no UI), Python workers from this interpreter; stopped at the end."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if os.environ.get("MOGE_REQUIRE_ENGINES") != "1":
    pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402

import engines  # noqa: E402
from engines import MODEL, assert_row_is_npz  # noqa: E402
from moge_rs.spark import make_predict_fn, predict_udf, return_type  # noqa: E402

# Every wait on the engine is bounded (pytest-timeout): a stalled session fails the test.
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    s = (
        SparkSession.builder.master("local[2]")
        .appName("moge-test")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


def test_photo_bytes_give_moge_predicts_depth_and_mask(spark, photos):
    root, paths, npz, bad = photos
    df = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(str(root)).repartition(2)
    udf = predict_udf(batch_size=4, input="bytes", **MODEL)
    rows = df.select("path", udf("content", "path").alias("m")).select("path", "m.*").collect()
    assert len(rows) == len(paths) + 1
    by_name = {Path(r["path"]).stem: r.asDict() for r in rows}
    for p in paths:
        r = by_name[p.stem]
        assert r["error"] == "", r["error"]
        assert len(r["depth"]) == r["width"] * r["height"]
        assert_row_is_npz(r, npz[p.stem], keys=("depth", "mask", "intrinsics"))
        assert r["npz"] == ""
    failed = by_name["damaged"]
    assert "damaged.jpg" in failed["error"] and failed["depth"] == [] and failed["width"] == 0


def test_paths_write_moge_predicts_npz_bit_for_bit(spark, photos, tmp_path):
    root, paths, npz, bad = photos
    out_dir = tmp_path / "out"
    df = spark.createDataFrame([(str(p),) for p in paths + [bad]], "path string").repartition(2)
    udf = predict_udf(batch_size=5, input="path", outputs=(), output_dir=str(out_dir), **MODEL)
    rows = [r.asDict() for r in df.select("path", udf("path").alias("m")).select("path", "m.*").collect()]
    assert len(rows) == len(paths) + 1
    for r in rows:
        p = Path(r["path"])
        if p.name == "damaged.jpg":
            assert "damaged.jpg" in r["error"] and r["npz"] == ""
            continue
        assert r["error"] == "", r["error"]
        assert Path(r["npz"]).read_bytes() == npz[p.stem].read_bytes(), f"{p.name}: the npz differs from moge predict's"
    assert sorted(f.name for f in out_dir.iterdir()) == sorted(f"{p.stem}.npz" for p in paths)


def test_flat_image_arrays_with_the_make_predict_fn_of_predict_batch_udf(spark, photos):
    from pyspark.ml.functions import predict_batch_udf
    from PIL import Image

    root, paths, npz, _ = photos
    pngs = [p for p in paths if p.suffix == ".png" and Image.open(p).size == (64, 48)]
    assert pngs
    data = [(p.stem, np.asarray(Image.open(p).convert("RGB")).reshape(-1).astype(int).tolist()) for p in pngs]
    df = spark.createDataFrame(data, "name string, pixels array<int>")
    outputs = ("points", "depth", "normal", "mask", "intrinsics")
    make = make_predict_fn(input="image", image_shape=(48, 64), named=True, outputs=outputs, **MODEL)
    udf = predict_batch_udf(make, return_type=return_type(outputs), batch_size=2, input_tensor_shapes=make.input_tensor_shapes)
    rows = df.select("name", udf("pixels", "name").alias("m")).select("name", "m.*").collect()
    assert len(rows) == len(pngs)
    for r in rows:
        assert r["error"] == "", r["error"]
        assert_row_is_npz(r.asDict(), npz[r["name"]])


def test_the_example_writes_the_npz_and_a_summary(spark, photos, tmp_path):
    root, paths, npz, bad = photos
    out = tmp_path / "out"
    example = engines.ROOT / "examples" / "python" / "spark_batch.py"
    r = subprocess.run([sys.executable, str(example), str(root), str(out), "--model", MODEL["model"], "--precision", "f32", "--master", "local[2]"], capture_output=True, text=True, timeout=240)
    # The damaged photo fails alone: listed, exit status 1, every other npz written.
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"{len(paths) + 1} photos, 1 failed" in r.stdout and "damaged.jpg" in r.stdout
    for p in paths:
        written = out / p.parent.name / f"{p.stem}.npz"
        assert written.read_bytes() == npz[p.stem].read_bytes()
