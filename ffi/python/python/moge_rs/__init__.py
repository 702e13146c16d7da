"""Metric 3D geometry from photos with Microsoft's MoGe-2, on the moge engine (no PyTorch needed).

    from moge_rs import MoGeModel

    with MoGeModel.from_pretrained("vitl-normal") as model:
        out = model("photo.jpg")          # a path, PIL image, numpy array or torch tensor
    print(out)                            # MoGeOutput(1920x1080, valid 90.5%, median depth ...)
    out.depth, out.points, out.normal, out.mask, out.intrinsics_pixels

The API is that of the Tenstorrent MoGe-2 server's Python package (tt-MoGe's ``tt_moge.MoGeModel``);
``model.infer`` is upstream ``MoGeModel.infer``. The arrays are those of ``moge predict`` for the
same photo and options, bit for bit.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Union

import numpy as np

from . import _native
from ._native import MoGeError

__all__ = ["MoGeModel", "MoGeOutput", "MoGeError", "__version__"]
__version__: str = _native.__version__

#: The fields of an output, in the order of the npz that ``save_npz`` writes.
FIELDS = ("points", "depth", "normal", "mask", "intrinsics", "intrinsics_pixels", "metric_scale", "fov_x", "fov_y")


class MoGeOutput:
    """The geometry of one image, every map at the image's size.

    ``points`` (H, W, 3) float32 metres in camera space (x right, y down, z forward), ``depth``
    (H, W) float32 metres, both +inf where ``mask`` is False; ``normal`` (H, W, 3) float32 unit
    normals (zero where masked; None for a model without the normal head); ``mask`` (H, W) bool,
    True = valid; ``intrinsics`` (3, 3) normalised (the image is the unit square);
    ``intrinsics_pixels`` (3, 3); ``metric_scale``; ``fov_x`` and ``fov_y`` in degrees.
    ``per_step``: with ``return_per_step`` on a MoGe-3 model, each refine step's ``points``,
    ``depth``, ``mask`` and ``intrinsics`` (step 0 unrefined, the last the final maps), else None.
    """

    __slots__ = FIELDS + ("per_step", "_summary")

    points: np.ndarray
    depth: np.ndarray
    normal: Optional[np.ndarray]
    mask: np.ndarray
    intrinsics: np.ndarray
    intrinsics_pixels: np.ndarray
    metric_scale: float
    fov_x: float
    fov_y: float
    per_step: Optional[List[Dict[str, np.ndarray]]]

    def __init__(self, fields: Dict[str, Any]):
        for k in FIELDS:
            setattr(self, k, fields[k])
        self.per_step = fields.get("per_step")
        self._summary: str = fields["summary"]

    @property
    def width(self) -> int:
        return int(self.depth.shape[1])

    @property
    def height(self) -> int:
        return int(self.depth.shape[0])

    def __repr__(self) -> str:
        return self._summary

    def __getitem__(self, key: str) -> Any:
        if key not in FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def keys(self) -> List[str]:
        return list(FIELDS)

    def to_dict(self) -> Dict[str, np.ndarray]:
        """Upstream ``MoGeModel.infer``'s keys: points, intrinsics, depth, mask and normal (if any);
        with ``per_step``, MoGe-3's ``points_per_step``, ``depth_per_step`` and ``intrinsics_per_step``."""
        d = {"points": self.points, "intrinsics": self.intrinsics, "depth": self.depth, "mask": self.mask}
        if self.normal is not None:
            d["normal"] = self.normal
        if self.per_step is not None:
            for k in ("points", "depth", "intrinsics"):
                d[f"{k}_per_step"] = [s[k] for s in self.per_step]
        return d

    def to_torch(self) -> Dict[str, Any]:
        """``to_dict()`` as torch tensors sharing the arrays' memory (torch is imported only here)."""
        import torch

        return {k: [torch.from_numpy(x) for x in v] if isinstance(v, list) else torch.from_numpy(v) for k, v in self.to_dict().items()}

    def save_npz(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes the npz of ``moge predict`` (the same bytes for the same photo and options):
        points, depth, normal, mask, intrinsics, intrinsics_pixels, metric_scale, fov_x, fov_y."""
        _native.save_npz(os.fspath(path), self.points, self.depth, self.normal, self.mask, self.intrinsics, float(self.metric_scale))


ImageLike = Any  # str | os.PathLike | bytes (a photo file's contents) | PIL.Image.Image | numpy.ndarray | torch.Tensor


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _is_path(x: Any) -> bool:
    return isinstance(x, (str, os.PathLike))


def _to_numpy(image: ImageLike) -> np.ndarray:
    if _is_torch(image):
        return image.detach().cpu().numpy()
    if hasattr(image, "convert") and hasattr(image, "mode") and hasattr(image, "size"):  # a PIL image
        return np.asarray(image.convert("RGB"))
    if isinstance(image, np.ndarray):
        return image
    raise TypeError(f"an image is a path, a PIL image, a numpy array or a torch tensor, not {type(image).__name__}")


def _canonical(arr: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8, or (3, H, W) float32 in [0, 1]; raises what is wrong otherwise."""
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.dtype == np.uint8:
        if arr.ndim == 2:
            arr = np.repeat(arr[:, :, None], 3, axis=2)
        elif arr.ndim == 3 and arr.shape[-1] in (3, 4):
            arr = arr[:, :, :3]
        elif arr.ndim == 3 and arr.shape[0] in (1, 3, 4):
            arr = np.moveaxis(arr, 0, -1)
            arr = np.repeat(arr, 3, axis=2) if arr.shape[2] == 1 else arr[:, :, :3]
        else:
            raise ValueError(f"an 8-bit image is H x W, H x W x 3 or 3 x H x W; this one is {' x '.join(map(str, arr.shape))}")
        return np.ascontiguousarray(arr)
    if arr.dtype.kind == "f":
        if arr.ndim == 2:
            arr = arr[None]
        elif arr.ndim == 3 and arr.shape[0] not in (1, 3, 4) and arr.shape[-1] in (1, 3, 4):
            arr = np.moveaxis(arr, -1, 0)
        if arr.ndim != 3 or arr.shape[0] not in (1, 3, 4):
            raise ValueError(f"a float image is 3 x H x W, H x W x 3 or H x W; this one is {' x '.join(map(str, arr.shape))}")
        arr = np.repeat(arr, 3, axis=0) if arr.shape[0] == 1 else arr[:3]
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        lo, hi = (float(arr.min()), float(arr.max())) if arr.size else (0.0, 0.0)
        if not (lo >= 0.0 and hi <= 1.0):
            raise ValueError(f"a float image is in [0, 1]; this one spans [{lo}, {hi}] (8-bit values? divide by 255)")
        return arr
    raise TypeError(f"an image array is uint8 or float; this one is {arr.dtype}")


class _Outputs(Iterator[MoGeOutput]):
    """The outputs of the pipeline, in order. Unlike a generator it goes on after a photo that
    failed: the error is raised at that photo's turn, and the next call gives the next photo."""

    def __init__(self, native: "_native.Predictions"):
        self._native = native

    def __iter__(self) -> "_Outputs":
        return self

    def __next__(self) -> MoGeOutput:
        return MoGeOutput(next(self._native))

    def __len__(self) -> int:
        return len(self._native)

    def close(self) -> None:
        """Stops the pipeline: the photo on the device finishes, nothing new starts."""
        self._native.close()

    def __del__(self) -> None:
        self._native.close()


class _Each(Iterator[MoGeOutput]):
    """Images that are not all paths, one call each, in order; like ``_Outputs`` it goes on after
    an image that failed."""

    def __init__(self, model: "MoGeModel", items: Sequence[ImageLike], opts: "_native.Options"):
        self._model, self._items, self._opts, self._next = model, items, opts, 0

    def __iter__(self) -> "_Each":
        return self

    def __next__(self) -> MoGeOutput:
        if self._next >= len(self._items):
            raise StopIteration
        self._next += 1
        return self._model._one(self._items[self._next - 1], self._opts)

    def __len__(self) -> int:
        return len(self._items) - self._next

    def close(self) -> None:
        self._next = len(self._items)


class MoGeModel:
    """A MoGe-2 model on this machine's CPU or GPU, or on a server. Threads may share one model."""

    def __init__(self, native: "_native.Model"):
        self._native = native

    @classmethod
    def from_pretrained(
        cls,
        model: Union[str, "os.PathLike[str]"] = "vitl-normal",
        revision: Optional[str] = None,
        precision: str = "auto",
        device: str = "auto",
        server: Optional[str] = None,
        timeout: float = 60.0,
        jobs: Optional[int] = None,
    ) -> "MoGeModel":
        """A published model (``vits-normal``, ``vitb-normal``, ``vitl-normal``, ``vitl``: the
        Hugging Face cache, downloaded when missing), a checkpoint path (upstream's ``model.pt``,
        or ``.safetensors``), or with ``server="http://host:port"`` a running ``moge serve`` or
        Tenstorrent MoGe-2 server (tt-MoGe) as the device. ``precision`` is ``auto``, ``f32``,
        ``bf16`` or ``int8`` (the ViT's linears and most convolutions in int8, on the CPU); ``device`` is ``auto``, ``cpu``, ``cuda`` or ``cuda:N``, as the command line's.
        ``jobs``: ``predict_many``'s host threads per stage (decode, post-process); default: one
        per CPU, at most 8, as ``moge batch --jobs``."""
        if server is not None:
            return cls(_native.Model.connect(server, timeout=timeout, jobs=jobs))
        return cls(_native.Model.load(os.fspath(model), revision=revision, precision=precision, device=device, jobs=jobs))

    # -- the model itself

    @property
    def device(self) -> str:
        """Where the network runs: ``cpu``, ``cuda:0``, or the server's address."""
        return self._native.device

    @property
    def has_normal(self) -> bool:
        return self._native.has_normal

    def close(self) -> None:
        """Frees the model (a call still running finishes first)."""
        self._native.close()

    def __enter__(self) -> "MoGeModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._native.closed else self.device
        return f"MoGeModel({state})"

    # -- predictions

    def __call__(
        self,
        image: Union[ImageLike, Sequence[ImageLike]],
        fit: str = "exact",
        fov_x: Optional[Union[float, str]] = None,
        apply_mask: bool = True,
        force_projection: bool = True,
        num_tokens: Optional[int] = None,
        resolution_level: Optional[int] = None,
        canvas: Optional[Sequence[int]] = None,
        refine_steps: Optional[int] = None,
        return_per_step: bool = False,
    ) -> Union[MoGeOutput, List[MoGeOutput]]:
        """The geometry of ``image``: a path, a photo file's bytes (decoded as the file would be),
        a PIL image, a numpy array (H x W x 3 uint8, or float in [0, 1]; also 3 x H x W and
        grayscale) or a torch tensor. A list gives a list.

        ``fit``: ``exact`` runs each image at its own aspect (upstream); ``pad`` and ``stretch``
        put it on the ``canvas`` (width, height; 1920 x 1080) and bring the maps back.
        ``fov_x``: a known horizontal field of view in degrees, or ``"exif"``: each photo file's
        own, from its EXIF focal length (the model's estimate where it has none; an image in memory
        has no EXIF and is refused). ``num_tokens`` (1800 unless
        ``resolution_level`` 0-9 is given instead) sets the network's resolution, as the
        command line's. ``refine_steps``: MoGe-3's refinement passes (None: 3 for MoGe-3, none for
        MoGe-2; 0 gives the MoGe-2 output of the same network); ``return_per_step`` keeps every
        step's maps in ``output.per_step``."""
        opts = self._options(fit, fov_x, apply_mask, force_projection, num_tokens, resolution_level, canvas, refine_steps, return_per_step)
        if isinstance(image, (list, tuple)):
            return [self._one(x, opts) for x in image]
        return self._one(image, opts)

    def predict_many(self, images: Iterable[ImageLike], **options: Any) -> List[MoGeOutput]:
        """``model(image)`` for each image, in order. Paths go through the pipeline: decode threads
        read the next photos and post-processing threads finish the last ones while the device runs
        the current one. The options are ``__call__``'s."""
        return list(self.imap(images, **options))

    def imap(self, images: Iterable[ImageLike], **options: Any) -> Iterator[MoGeOutput]:
        """``predict_many`` as an iterator: outputs come as they are ready, in order, and only a
        few photos are ahead of the reader, so a million paths keep memory flat. A photo that
        fails raises its error (``MoGeError``, ``FileNotFoundError``) when its turn comes."""
        opts = self._options(**options)
        items = images if isinstance(images, (list, tuple)) else list(images)
        if all(_is_path(x) for x in items):
            return _Outputs(self._native.predict_many([os.fspath(x) for x in items], opts))
        return _Each(self, items, opts)

    def infer(
        self,
        image: Any,
        num_tokens: Optional[int] = None,
        resolution_level: int = 9,
        force_projection: bool = True,
        apply_mask: bool = True,
        fov_x: Optional[Union[float, Sequence[float], Any]] = None,
        refine_steps: Optional[int] = None,
        return_per_step: bool = False,
        use_fp16: bool = True,
    ) -> Dict[str, Any]:
        """Upstream ``MoGeModel.infer``: ``image`` (3, H, W) or (B, 3, H, W) float in [0, 1] (a torch
        tensor or a numpy array). Returns points, intrinsics, depth, mask and normal (if the model has
        the head), batched as the input; torch tensors on the input's device for a tensor, numpy
        arrays otherwise. MoGe-3 (upstream's ``moge/model/v3.py``): ``refine_steps`` (None: 3; 0:
        unrefined) and ``return_per_step``, which adds ``points_per_step``, ``depth_per_step`` and
        ``intrinsics_per_step``, lists of refine_steps + 1 entries. ``use_fp16`` is accepted and
        ignored: the precision is the model's."""
        del use_fp16
        torch_in = _is_torch(image)
        arr = image.detach().cpu().float().numpy() if torch_in else np.asarray(image, dtype=np.float32)
        batched = arr.ndim == 4
        if not batched:
            arr = arr[None]
        if arr.ndim != 4 or arr.shape[1] != 3:
            raise ValueError(f"infer() takes 3 x H x W or B x 3 x H x W; this is {' x '.join(map(str, np.shape(image)))}")
        fovs = self._per_image(fov_x, arr.shape[0])
        outs = []
        for img, fov in zip(arr, fovs):
            # upstream: an explicit num_tokens decides over resolution_level
            level = None if num_tokens is not None else resolution_level
            opts = self._options("exact", fov, apply_mask, force_projection, num_tokens, level, None, refine_steps, return_per_step)
            outs.append(MoGeOutput(self._native.predict_float(_canonical(img), opts)).to_dict())

        def stack(k: str) -> Any:
            if isinstance(outs[0][k], list):
                # per step: a list of batched arrays, as upstream
                return [np.stack([o[k][s] for o in outs]) for s in range(len(outs[0][k]))]
            return np.stack([o[k] for o in outs])

        result = {k: stack(k) for k in outs[0]}
        if not batched:
            result = {k: [x[0] for x in v] if isinstance(v, list) else v[0] for k, v in result.items()}
        if torch_in:
            import torch

            def tensor(v: np.ndarray) -> Any:
                return torch.from_numpy(np.ascontiguousarray(v)).to(image.device)

            result = {k: [tensor(x) for x in v] if isinstance(v, list) else tensor(v) for k, v in result.items()}
        return result

    def infer_panorama(
        self,
        image: ImageLike,
        *,
        view_size: int = 512,
        num_tokens: Optional[int] = None,
        resolution_level: Optional[int] = None,
        apply_mask: bool = True,
        refine_steps: Optional[int] = None,
    ) -> Dict[str, Any]:
        """A 360° equirectangular panorama (W = 2H; a path, an (H, W, 3) uint8 array, or a PIL
        image), as upstream's ``moge infer_panorama`` makes it: twelve 90° views of ``view_size``
        pixels through the model, merged into one distance map that keeps the views' metric
        scale. Returns ``points`` (H, W, 3) in moge's axes (x right, y down, z forward = the
        picture's centre column), ``depth`` (H, W) the distance from the centre (inf where masked
        with ``apply_mask``), ``mask``, ``metric_scale`` and ``view_metric_scale`` (12,)."""
        opts = self._options("exact", None, apply_mask, True, num_tokens, resolution_level, None, refine_steps, False)
        if _is_path(image):
            return self._native.predict_panorama_file(os.fspath(image), opts, int(view_size))
        arr = np.ascontiguousarray(_to_numpy(image))
        if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
            raise ValueError(f"infer_panorama() takes an H x W x 3 uint8 RGB image; this is {arr.dtype} {' x '.join(map(str, arr.shape))}")
        return self._native.predict_panorama(arr, opts, int(view_size))

    # -- helpers

    @staticmethod
    def _per_image(fov_x: Any, n: int) -> List[Optional[float]]:
        if fov_x is None:
            return [None] * n
        vals = np.asarray(fov_x.detach().cpu() if _is_torch(fov_x) else fov_x, dtype=np.float64).reshape(-1)
        if vals.size == 1:
            return [float(vals[0])] * n
        if vals.size != n:
            raise ValueError(f"fov_x has {vals.size} values for {n} images")
        return [float(v) for v in vals]

    @staticmethod
    def _options(
        fit: str = "exact",
        fov_x: Optional[Union[float, str]] = None,
        apply_mask: bool = True,
        force_projection: bool = True,
        num_tokens: Optional[int] = None,
        resolution_level: Optional[int] = None,
        canvas: Optional[Sequence[int]] = None,
        refine_steps: Optional[int] = None,
        return_per_step: bool = False,
    ) -> "_native.Options":
        return _native.Options(
            fit=fit,
            fov_x=None if fov_x is None else fov_x if fov_x == "exif" else float(fov_x),
            apply_mask=bool(apply_mask),
            force_projection=bool(force_projection),
            num_tokens=num_tokens,
            resolution_level=resolution_level,
            canvas=None if canvas is None else (int(canvas[0]), int(canvas[1])),
            refine_steps=None if refine_steps is None else int(refine_steps),
            return_per_step=bool(return_per_step),
        )

    def _one(self, image: ImageLike, opts: "_native.Options") -> MoGeOutput:
        if _is_path(image):
            return MoGeOutput(self._native.predict_file(os.fspath(image), opts))
        if isinstance(image, (bytes, bytearray, memoryview)):
            return MoGeOutput(self._native.predict_bytes(bytes(image), "the image's bytes", opts))
        arr = _canonical(_to_numpy(image))
        if arr.dtype == np.uint8:
            return MoGeOutput(self._native.predict_rgb(arr, opts))
        return MoGeOutput(self._native.predict_float(arr, opts))
