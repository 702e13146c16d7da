"""MoGe on Ray Data: ``MoGePredictor`` is the callable class of ``Dataset.map_batches``.

    import ray
    from moge_rs.ray import MoGePredictor

    ds = ray.data.read_binary_files("s3://bucket/photos/", include_paths=True)
    out = ds.map_batches(
        MoGePredictor,
        fn_constructor_kwargs={"model": "vitl-normal", "output_dir": "/data/geometry"},
        concurrency=4,      # actors, each with its own model, loaded once
        num_cpus=8,         # each actor's forwards use this many threads
        batch_size=8,
    )
    out.write_parquet("/data/geometry/summary")   # path, npz, fov_x, metric_scale, error, ...

A batch's rows hold one of: an ``image`` column (``ray.data.read_images``: H x W x 3 uint8), a
``bytes`` column (``read_binary_files``: the photo files' contents, decoded by moge as
``moge predict`` decodes the file) or a ``path`` column alone (files every actor can read,
decoded by moge's pipeline). ``ray`` itself is imported only to read an actor's CPUs.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np

from ._batch import MAPS, Runner, empty_map, scalars

__all__ = ["MoGePredictor"]


class MoGePredictor:
    """The callable class for ``map_batches``: ``__init__`` loads the model once per actor,
    ``__call__`` runs a batch (``dict[str, np.ndarray]``, Ray's ``numpy`` batch format).

    Constructor arguments (``fn_constructor_kwargs``):

    - ``model``: a published name (``vitl-normal``, ...) or a checkpoint path every actor can
      read; or ``server="http://host:port"``: a ``moge serve`` (or a pool behind one address)
      or the Tenstorrent MoGe-2 server (tt-MoGe) as the device.
    - ``precision``, ``device``, ``revision``, ``timeout``: as ``MoGeModel.from_pretrained``.
    - ``threads``: the forwards' threads in this actor; default: the CPUs Ray gave the actor
      (``num_cpus``), so that actors side by side do not oversubscribe the cores.
    - ``column``: the input column (``image``, ``bytes`` or ``path``); default: the first of
      those the batch has.
    - ``output_dir``: write each row's npz there (``moge predict``'s bytes), named after the
      row's ``path`` (``relative_to``: a folder whose tree is mirrored), and return the summary
      columns only. Without it the maps come back as columns.
    - ``outputs``: the maps returned as columns without ``output_dir`` (default: ``points``,
      ``depth``, ``normal``, ``mask``; ``normal`` only from a model with the normal head), each one
      array per row (H x W, or H x W x 3).
    - ``on_error``: ``"row"`` (default) gives a photo that fails its message in the ``error``
      column and empty maps, the rest of the batch done; ``"raise"`` fails the task.
    - the options of ``model(image, ...)``: ``fit``, ``fov_x``, ``num_tokens``,
      ``resolution_level``, ``canvas``, ``apply_mask``, ``force_projection``.

    Returned columns: the batch's own columns but the input image or bytes; ``width``,
    ``height``, ``fov_x``, ``fov_y`` (degrees), ``metric_scale``, ``valid`` (the share of pixels
    kept), ``intrinsics`` (3 x 3, normalised), ``npz`` and ``error`` (None when there is none),
    and the maps without ``output_dir``.
    """

    def __init__(
        self,
        model: str = "vitl-normal",
        *,
        column: Optional[str] = None,
        threads: Optional[int] = None,
        output_dir: Optional[str] = None,
        outputs: Sequence[str] = ("points", "depth", "normal", "mask"),
        **options: Any,
    ):
        unknown = [k for k in outputs if k not in MAPS]
        if unknown:
            raise ValueError(f"outputs are among {', '.join(MAPS)}; not {', '.join(unknown)}")
        if column is not None and column not in ("image", "bytes", "path"):
            raise ValueError(f"column is image, bytes or path, not {column!r}")
        if threads is None:
            threads = _actor_cpus()
        self.column = column
        self.runner = Runner(model, threads=threads, output_dir=output_dir, **options)
        # Decided once, so that every batch has the same columns (Ray unifies the blocks' schemas).
        self.outputs = () if output_dir is not None else tuple(k for k in outputs if k != "normal" or self.runner.model.has_normal)

    def __call__(self, batch: Dict[str, np.ndarray]) -> Dict[str, Any]:
        column = self.column or next((c for c in ("image", "bytes", "path") if c in batch), None)
        if column is None or column not in batch:
            raise ValueError(f"a batch of photos has an image, bytes or path column; this one has {', '.join(batch) or 'none'}")
        paths = batch.get("path")
        names = None if paths is None else [None if p is None else str(p) for p in paths]
        items = batch[column]
        rows = self.runner.run(column, list(items), names)
        # The input's pixels or bytes stay behind; the rest of the row (its path, ids) comes along.
        out: Dict[str, Any] = {k: v for k, v in batch.items() if k != column or column == "path"}
        out.update(scalars(rows))
        out["intrinsics"] = np.stack([np.full((3, 3), np.nan, np.float32) if r.output is None else r.output.intrinsics for r in rows]) if rows else np.zeros((0, 3, 3), np.float32)
        for key in self.outputs:
            maps = [None if r.output is None else getattr(r.output, key) for r in rows]
            out[key] = _column([empty_map(key) if m is None else m for m in maps])
        return out


def _column(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """One array per row: stacked where every row has the same shape, else an object array
    (Ray stores it as a variable-shaped tensor column)."""
    if arrays and all(a.shape == arrays[0].shape for a in arrays):
        return np.stack(arrays)
    col = np.empty(len(arrays), dtype=object)
    for i, a in enumerate(arrays):
        col[i] = a
    return col


def _actor_cpus() -> Optional[int]:
    """The CPUs Ray gave this actor (its ``num_cpus``), or None outside a Ray worker."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized():
        return None
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    return max(1, int(round(cpus))) if cpus else None
