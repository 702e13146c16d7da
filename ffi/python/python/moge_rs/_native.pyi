"""The native half of moge_rs (Rust, over the moge library). Use ``moge_rs.MoGeModel``."""

from os import PathLike
from typing import Any, Dict, Iterator, List, Literal, Optional, Tuple, Union

import numpy as np

__version__: str

class MoGeError(RuntimeError):
    """A photo, checkpoint or server that moge could not use; the message says which and why."""

class Options:
    def __init__(
        self,
        *,
        fit: str = "exact",
        fov_x: Optional[Union[float, Literal["exif"]]] = None,
        apply_mask: bool = True,
        force_projection: bool = True,
        num_tokens: Optional[int] = None,
        resolution_level: Optional[int] = None,
        canvas: Optional[Tuple[int, int]] = None,
        refine_steps: Optional[int] = None,
        return_per_step: bool = False,
    ) -> None: ...

class Predictions(Iterator[Dict[str, Any]]):
    def __iter__(self) -> "Predictions": ...
    def __next__(self) -> Dict[str, Any]: ...
    def __len__(self) -> int: ...
    def close(self) -> None: ...

class Model:
    @staticmethod
    def load(model: str, *, revision: Optional[str] = None, precision: str = "auto", device: str = "auto") -> "Model": ...
    @staticmethod
    def connect(url: str, *, timeout: float = 60.0, retries: int = 3) -> "Model": ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def has_normal(self) -> bool: ...
    @property
    def device(self) -> str: ...
    @property
    def server(self) -> Optional[str]: ...
    def predict_file(self, path: Union[str, PathLike[str]], opts: Options) -> Dict[str, Any]: ...
    def predict_rgb(self, image: np.ndarray, opts: Options) -> Dict[str, Any]: ...
    def predict_float(self, image: np.ndarray, opts: Options) -> Dict[str, Any]: ...
    def predict_many(self, paths: List[str], opts: Options) -> Predictions: ...
    def predict_panorama(self, image: np.ndarray, opts: Options, view_size: int) -> Dict[str, Any]: ...

def save_npz(
    path: str,
    points: np.ndarray,
    depth: np.ndarray,
    normal: Optional[np.ndarray],
    mask: np.ndarray,
    intrinsics: np.ndarray,
    metric_scale: float,
) -> None: ...
