"""MoGe on Spark: ``make_predict_fn`` for ``pyspark.ml.functions.predict_batch_udf`` (Spark 3.4+),
and ``predict_udf``, which builds that UDF with its return type.

    from pyspark.sql import functions as F
    from moge_rs.spark import predict_udf

    photos = spark.read.format("binaryFile").load("/data/photos/*.jpg")     # path, content, ...
    moge = predict_udf("vitl-normal", input="bytes", output_dir="/data/geometry", batch_size=8)
    out = photos.withColumn("moge", moge("content", "path")).select("path", "moge.*")

The UDF's columns are the input: ``path`` (a string column of files every executor can read;
``file:`` URIs too), ``bytes`` (a binary column of the photo files' contents, decoded by moge as
``moge predict`` decodes the file) or ``image`` (a flattened H x W x 3 uint8 array column, with
``image_shape=(H, W)``); then, optionally, a string column naming each row (its path), which
names the npz files. The model is loaded once per Python worker (predict_batch_udf's cache).
``pyspark`` is imported only by ``return_type`` and ``predict_udf``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._batch import KINDS, SUMMARY, Runner, local_path

__all__ = ["make_predict_fn", "predict_udf", "return_type", "SCALARS"]

#: The scalar fields of every result (``Row.summary``), with their Spark SQL types.
SCALARS = tuple((name, {np.int32: "int", np.float64: "double", None: "string"}[dtype]) for name, dtype in SUMMARY.items())

#: The maps a result can carry, flattened in row-major order (H x W, or H x W x 3), and
#: ``intrinsics`` (3 x 3, normalised) as 9 values.
ARRAYS = {"points": "float", "depth": "float", "normal": "float", "mask": "boolean", "intrinsics": "float"}


def make_predict_fn(
    model: str = "vitl-normal",
    *,
    input: str = "path",
    image_shape: Optional[Tuple[int, int]] = None,
    outputs: Optional[Sequence[str]] = None,
    threads: Optional[int] = None,
    output_dir: Optional[str] = None,
    named: Optional[bool] = None,
    **options: Any,
) -> Callable[[], Callable[..., List[Dict[str, Any]]]]:
    """The ``make_predict_fn`` of ``predict_batch_udf``: called once per Python worker, it loads
    the model and returns the function that runs a batch.

    ``input``: ``path``, ``bytes`` or ``image`` (a flat uint8 array column, with
    ``image_shape=(H, W)``). ``named``: the UDF takes a second column, a string naming each row
    (its path: npz files and error messages are named after it); default: for ``bytes`` yes
    (``binaryFile``'s ``path``), for ``image`` no; a ``path`` names itself. For ``image``, give
    ``predict_batch_udf`` the returned function's ``input_tensor_shapes``. ``outputs``: the arrays
    each row carries (``points``, ``depth``, ``normal``, ``mask``, ``intrinsics``), flattened;
    default ``depth``, ``mask``, ``intrinsics``, or none with ``output_dir`` (the npz files hold
    the maps). ``threads``: the
    forwards' threads per worker; default: the task's CPUs (``spark.task.cpus``, 1 unless set),
    so that tasks side by side do not oversubscribe the cores. The rest are ``Runner``'s and
    ``model(image, ...)``'s options (``server``, ``precision``, ``relative_to``, ``on_error``,
    ``num_tokens``, ``fov_x``, ...). Each row's result holds ``return_type(outputs)``'s fields."""
    if input not in KINDS:
        raise ValueError(f"input is {', '.join(KINDS)}, not {input!r}")
    if input == "image" and image_shape is None:
        raise ValueError("input='image' takes image_shape=(height, width): Spark holds the pixels as a flat array")
    outputs = default_outputs(outputs, output_dir)
    # Resolved here, on the driver: an executor's working directory is not the caller's.
    if output_dir is not None:
        output_dir = os.path.abspath(local_path(os.fspath(output_dir)))
    if options.get("relative_to") is not None:
        options["relative_to"] = os.path.abspath(local_path(os.fspath(options["relative_to"])))

    if named is None:
        named = input == "bytes"
    if input == "path" and named:
        raise ValueError("a path names its row itself: named=True is for bytes and image inputs")

    def make() -> Callable[..., List[Dict[str, Any]]]:
        runner = Runner(model, threads=threads if threads is not None else _task_cpus(), output_dir=output_dir, **options)

        def run(inputs: np.ndarray, names: Optional[np.ndarray]) -> List[Dict[str, Any]]:
            items: Any = list(inputs)
            if input == "image":
                h, w = image_shape  # type: ignore[misc]
                items = [np.asarray(x).reshape(h, w, 3).astype(np.uint8) for x in items]
            labels = None if names is None else [None if n is None else str(n) for n in names]
            return [_result(r, outputs) for r in runner.run(input, items, labels)]

        # predict_batch_udf counts the function's parameters to know how many columns it takes.
        if named:
            return lambda inputs, names: run(inputs, names)
        return lambda inputs: run(inputs, None)

    # Spark hands a flat array column over as a tensor only with its shape (and None for the
    # name column beside it).
    make.input_tensor_shapes = None  # type: ignore[attr-defined]
    if input == "image":
        h, w = image_shape  # type: ignore[misc]
        make.input_tensor_shapes = [[int(h), int(w), 3]] + ([None] if named else [])  # type: ignore[attr-defined]
    return make


def _result(row: Any, outputs: Sequence[str]) -> Dict[str, Any]:
    o = row.output
    d = row.summary()
    # Empty, not null, where there is none: predict_batch_udf refuses a first row whose entry is
    # None (np.isscalar), and a column of NaN alone does not convert to strings.
    d["npz"], d["error"] = d["npz"] or "", d["error"] or ""
    for key in outputs:
        v = None if o is None else getattr(o, key)
        dtype = np.bool_ if key == "mask" else np.float32
        d[key] = np.zeros(0, dtype) if v is None else np.ascontiguousarray(v, dtype).reshape(-1)
    return d


def default_outputs(outputs: Optional[Sequence[str]], output_dir: Optional[str]) -> Tuple[str, ...]:
    """The arrays each row carries: those given, else ``depth``, ``mask`` and ``intrinsics``, or
    none when the npz files hold the maps (``output_dir``)."""
    if outputs is None:
        return () if output_dir is not None else ("depth", "mask", "intrinsics")
    unknown = [k for k in outputs if k not in ARRAYS]
    if unknown:
        raise ValueError(f"outputs are among {', '.join(ARRAYS)}; not {', '.join(unknown)}")
    return tuple(outputs)


def return_type(outputs: Sequence[str] = ("depth", "mask", "intrinsics")) -> Any:
    """The Spark struct that ``make_predict_fn(outputs=...)``'s results fill."""
    from pyspark.sql.types import _parse_datatype_string

    fields = [f"{name}: {t}" for name, t in SCALARS] + [f"{k}: array<{ARRAYS[k]}>" for k in outputs]
    return _parse_datatype_string(f"struct<{', '.join(fields)}>")


def predict_udf(model: str = "vitl-normal", *, batch_size: int = 8, outputs: Optional[Sequence[str]] = None, **kwargs: Any) -> Any:
    """``predict_batch_udf(make_predict_fn(model, ...), return_type=return_type(outputs), ...)``:
    the UDF to call on the input column (and the name column)."""
    from pyspark.ml.functions import predict_batch_udf

    outputs = default_outputs(outputs, kwargs.get("output_dir"))
    make = make_predict_fn(model, outputs=outputs, **kwargs)
    return predict_batch_udf(make, return_type=return_type(outputs), batch_size=batch_size, input_tensor_shapes=make.input_tensor_shapes)


def _task_cpus() -> Optional[int]:
    """The CPUs of the task this worker runs (``spark.task.cpus``), or None outside Spark."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return None
    ctx = TaskContext.get()
    return max(1, int(ctx.cpus())) if ctx is not None else None
