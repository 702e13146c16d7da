"""Fixtures the engine tests (test_ray.py, test_spark.py) share, made once per session."""

import pytest

import engines


@pytest.fixture(scope="session")
def photos(tmp_path_factory):
    """40 photos under two folders and one damaged: (root, paths, each photo's `moge predict`
    npz by stem, the damaged file)."""
    root = tmp_path_factory.mktemp("photos")
    paths = engines.make_photos(root)
    npz = engines.predict_npz(paths, tmp_path_factory.mktemp("cli"))
    bad = engines.damage(paths[1])
    return root, paths, npz, bad
