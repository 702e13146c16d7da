"""What the distributed engines' adapters (``moge_rs.ray``, ``moge_rs.spark``) share: one model
per worker, a batch of rows (paths, photo files' bytes, or decoded images) through it, each row
its outputs or its error, npz files written per row where asked. Imports no engine."""

from __future__ import annotations

import os
import urllib.parse
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from . import MoGeModel, MoGeOutput, _native

#: Errors that are not the row's: they fail the task, so that the engine retries it (a server
#: that cannot be reached fails every row alike).
FATAL = (MemoryError, KeyboardInterrupt, ConnectionError)

#: The kinds of input a row may hold.
KINDS = ("path", "bytes", "image")

#: The per-image maps an adapter can return as arrays, with their dtypes and dimensions.
MAPS = {"points": (np.float32, 3), "depth": (np.float32, 2), "normal": (np.float32, 3), "mask": (np.bool_, 2)}


def local_path(name: str) -> str:
    """A local file's path from what engines name it by: a path, or a ``file:`` URI (Spark's
    ``binaryFile`` source says ``file:/data/a.jpg``)."""
    if name.startswith("file:"):
        return urllib.parse.unquote(urllib.parse.urlparse(name).path)
    return name


#: The summary of every row (``Row.summary``), with its column dtypes (None: strings, or None).
SUMMARY = {"width": np.int32, "height": np.int32, "fov_x": np.float64, "fov_y": np.float64, "metric_scale": np.float64, "valid": np.float64, "npz": None, "error": None}


@dataclass
class Row:
    """One row's result: its output, or the error that stopped it, and the npz written."""

    output: Optional[MoGeOutput] = None
    error: Optional[str] = None
    npz: Optional[str] = None

    def summary(self) -> Dict[str, Any]:
        """``SUMMARY``'s fields: width, height (0 for a failed row), fov_x, fov_y, metric_scale
        (NaN for a failed row), valid (the share of pixels the mask keeps), npz and error (None
        where there is none)."""
        o = self.output
        d: Dict[str, Any] = {"width": 0, "height": 0, "fov_x": np.nan, "fov_y": np.nan, "metric_scale": np.nan, "valid": np.nan}
        if o is not None:
            d.update(width=o.width, height=o.height, fov_x=float(o.fov_x), fov_y=float(o.fov_y), metric_scale=float(o.metric_scale))
            d["valid"] = float(o.mask.mean()) if o.mask.size else 0.0
        d.update(npz=self.npz, error=self.error)
        return d


class Runner:
    """A model and the options of every row: what one Ray actor or Spark Python worker holds.

    ``output_dir``: each row's npz (``moge predict``'s, bit for bit) is written there, named
    after the row's path: its file name with ``.npz``, or with ``relative_to`` (a folder) its
    path below that folder, mirrored as ``moge batch`` mirrors a tree. ``on_error``: ``"row"``
    gives a failed row its error message, ``"raise"`` raises it. ``keep_freed_memory``: the
    process keeps the memory a forward frees, as the ``moge`` binary does (a forward ~15 %
    faster; the footprint stays at its peak): right for a worker process that only predicts."""

    def __init__(
        self,
        model: str = "vitl-normal",
        *,
        server: Optional[str] = None,
        revision: Optional[str] = None,
        precision: str = "auto",
        device: str = "auto",
        timeout: float = 60.0,
        threads: Optional[int] = None,
        jobs: Optional[int] = None,
        output_dir: Optional[str] = None,
        relative_to: Optional[str] = None,
        on_error: str = "row",
        keep_freed_memory: bool = True,
        **options: Any,
    ):
        if on_error not in ("row", "raise"):
            raise ValueError(f'on_error is "row" or "raise", not {on_error!r}')
        if relative_to is not None and output_dir is None:
            raise ValueError("relative_to names the folder whose tree output_dir mirrors; give output_dir too")
        # Before the model's first forward: the kernels' pool starts once per process.
        if threads is not None and not _native.set_threads(max(1, int(threads))) and _native.threads() != int(threads):
            warnings.warn(f"this process's forwards already run on {_native.threads()} threads; threads={threads} cannot change that", stacklevel=2)
        # An actor or worker process that only predicts: freed memory is kept, as the binary
        # keeps it, rather than re-faulted page by page at every forward.
        if keep_freed_memory:
            _native.keep_freed_memory()
        self.opts = MoGeModel._options(**options)
        self.model = MoGeModel.from_pretrained(model, revision=revision, precision=precision, device=device, server=server, timeout=timeout, jobs=jobs)
        self.output_dir = None if output_dir is None else os.path.abspath(local_path(os.fspath(output_dir)))
        self.relative_to = None if relative_to is None else os.path.abspath(local_path(os.fspath(relative_to)))
        self.on_error = on_error

    def npz_path(self, name: Optional[str]) -> str:
        """Where the row named ``name`` writes its npz."""
        assert self.output_dir is not None
        if not name:
            raise ValueError("writing npz files names each after its photo: the rows need a path (Ray: include_paths=True; Spark: the path column)")
        path = os.path.abspath(local_path(name))
        if self.relative_to is not None:
            rel = os.path.relpath(path, self.relative_to)
            if rel == os.pardir or rel.startswith(os.pardir + os.sep):
                raise ValueError(f"{name}: not below relative_to ({self.relative_to}), so it has no place under output_dir")
        else:
            rel = os.path.basename(path)
        return os.path.join(self.output_dir, os.path.splitext(rel)[0] + ".npz")

    def run(self, kind: str, items: Sequence[Any], names: Optional[Sequence[Optional[str]]] = None) -> List[Row]:
        """Every row of a batch, in order; a row that fails is a row with its error (or raises,
        with ``on_error="raise"``)."""
        if kind not in KINDS:
            raise ValueError(f"rows hold one of {', '.join(KINDS)}, not {kind!r}")
        n = len(items)
        if names is not None and len(names) != n:
            raise ValueError(f"{len(names)} names for {n} rows")
        outputs: List[Any] = [None] * n
        labels: List[Optional[str]] = [None if names is None else names[i] for i in range(n)]
        if kind == "path":
            for i, x in enumerate(items):
                if isinstance(x, (str, os.PathLike)):
                    labels[i] = labels[i] or os.fspath(x)
                else:
                    e = TypeError(f"row {i}: its path is {type(x).__name__}, not a string")
                    outputs[i] = (e, str(e))
        # Each row's npz named first: a row that cannot be named, or whose name an earlier row of
        # the batch took, fails before the model runs it.
        targets: List[Optional[str]] = [None] * n
        if self.output_dir is not None:
            taken: Dict[str, str] = {}
            for i, name in enumerate(labels):
                if outputs[i] is not None:
                    continue
                try:
                    target = self.npz_path(name)
                    if target in taken:
                        raise ValueError(f"{name}: its npz, {target}, is {taken[target]}'s too; give relative_to to mirror the tree")
                    taken[target] = str(name)
                    targets[i] = target
                except ValueError as e:
                    outputs[i] = (e, str(e))
        todo = [i for i in range(n) if outputs[i] is None]
        if kind == "path":
            # Through the pipeline: the next photos decode while the current one runs.
            it = self.model._native.predict_many([local_path(os.fspath(items[i])) for i in todo], self.opts)
            try:
                for i in todo:
                    try:
                        outputs[i] = MoGeOutput(next(it))
                    except StopIteration:
                        raise RuntimeError(f"the pipeline ended before {len(todo)} photos") from None
                    except FATAL:
                        raise
                    except Exception as e:  # noqa: BLE001 - the row's own error, given back as the row
                        outputs[i] = (e, str(e))
            finally:
                it.close()
        else:
            for i in todo:
                label = labels[i] or f"row {i}"
                try:
                    if kind == "bytes":
                        # The message names the row as the file would be named.
                        outputs[i] = MoGeOutput(self.model._native.predict_bytes(bytes(items[i]), label, self.opts))
                    else:
                        outputs[i] = self.model._one(np.asarray(items[i]), self.opts)
                except FATAL:
                    raise
                except Exception as e:  # noqa: BLE001
                    outputs[i] = (e, f"{label}: {e}" if kind == "image" else str(e))
        rows = []
        for out, target, name in zip(outputs, targets, labels):
            if isinstance(out, tuple):
                rows.append(self._failed(*out))
                continue
            row = Row(output=out)
            if target is not None:
                try:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    out.save_npz(target)
                    row.npz = target
                except FATAL:
                    raise
                except Exception as e:  # noqa: BLE001
                    row = self._failed(e, f"{name}: {e}" if name else str(e))
            rows.append(row)
        return rows

    def _failed(self, e: BaseException, message: str) -> Row:
        if self.on_error == "raise":
            raise e
        return Row(error=message or type(e).__name__)


def scalars(rows: Sequence[Row]) -> Dict[str, np.ndarray]:
    """``Row.summary()`` of every row as columns (Ray's batch format)."""
    table = [r.summary() for r in rows]
    cols: Dict[str, np.ndarray] = {}
    for key, dtype in SUMMARY.items():
        values = [t[key] for t in table]
        cols[key] = strings(values) if dtype is None else np.array(values, dtype=dtype)
    return cols


def strings(values: Sequence[Optional[str]]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def empty_map(key: str) -> np.ndarray:
    """A failed row's map: no pixels, the dtype and dimensions of the others."""
    dtype, ndim = MAPS[key]
    return np.zeros((0, 0, 3) if ndim == 3 else (0, 0), dtype=dtype)
