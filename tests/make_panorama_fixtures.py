"""Build the panorama fixtures (tests/fixtures/panorama/) with upstream's own panorama functions.

Upstream's `moge infer_panorama` (dlr-moge 2.0.0, `moge/scripts/infer_panorama.py`) loads MoGe-1's class; this
script drives the same functions of `moge.utils.panorama` (`get_panorama_cameras`, `split_panorama_image`,
`merge_panorama_depth`) with the MoGe-2 model `tests/fixtures/tiny_normal.pt`, loaded by upstream's
`MoGeModel.from_pretrained`, exactly as the script calls them (`fov_x` 90, `apply_mask=False`, the norm of the
points as the distance). Run from the repository root in the reference venv (see tests/make_fixtures.py):

    OMP_NUM_THREADS=2 python tests/make_panorama_fixtures.py
    OMP_NUM_THREADS=2 python tests/make_panorama_fixtures.py --fullsize vits-normal SCRATCH/vits-normal.pt

(the second with a synthetic full-size checkpoint of tests/make_fullsize_reference.py --save-checkpoint SCRATCH).

One solver is made to converge, as in moge: upstream's `recover_focal_shift` finds each view's z-shift with
scipy's Levenberg-Marquardt at `ftol=1e-3`, which stops short of the minimum; moge solves it to full convergence
(`src/geometry/focal_shift.rs`), which moves each view's depth by ~1e-3. The reference runs scipy's solve with its
tolerances at 1e-14, so that the views and the panorama compare like with like.

What moge adds, computed here the same way: the metric scale. Upstream's solve fixes only differences of log
distance, so its merged map has the scale of the solver's start (mean log distance 0 at the coarsest level). moge
multiplies the merged distance by exp(median over views of each view's median of log(view distance) - log(merged
distance)) over the pixels where the view projects and its mask is set, at the merge's resolution.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")

import cv2
import numpy as np
import torch

import scipy.optimize
import utils3d
import moge.utils.panorama as pano

_least_squares = scipy.optimize.least_squares


def converged_least_squares(*args, **kwargs):
    kwargs.update(ftol=1e-14, xtol=1e-14, gtol=1e-14)
    return _least_squares(*args, **kwargs)


sys.path.insert(0, str(Path(__file__).parent))
from make_fixtures import CHECKPOINTS, register_tiny_backbone  # noqa: E402

ROOT = Path(__file__).parent
FIX = ROOT / "fixtures"
VIEW = 96           # the views' size here (upstream's script: 512); small keeps the test fast
TOKENS = 300        # the views' tokens here (upstream's script: resolution level 9)


def make_panorama(h: int, w: int) -> np.ndarray:
    """A seamless equirectangular picture: colours as functions of the direction (so u = 0 and u = 1 meet), a
    floor and a ceiling band, and a few dark vertical posts."""
    rng = np.random.default_rng(20261206)
    d = pano.spherical_uv_to_directions(utils3d.np.uv_map(h, w)).astype(np.float64)
    x, y, z = d[..., 0], d[..., 1], d[..., 2]
    r = 0.45 + 0.3 * x + 0.15 * np.sin(5 * z)
    g = 0.40 + 0.3 * y * z + 0.2 * (z < -0.4)
    b = 0.50 + 0.3 * z - 0.1 * np.cos(3 * x + 2 * y)
    img = np.stack([r, g, b], -1)
    theta = np.arctan2(y, x)
    for c in (-2.5, -0.7, 1.1, 2.4):
        img[np.abs(np.angle(np.exp(1j * (theta - c)))) < 0.05] *= 0.3
    img = img * 255 + rng.normal(0, 6, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def remapped_views(width, height, distance_maps, pred_masks, extrinsics, intrinsics):
    """Each view's log distance and mask on the panorama, as `merge_panorama_depth`'s loop makes them."""
    directions = pano.spherical_uv_to_directions(utils3d.np.uv_map(height, width))
    out = []
    for i in range(len(distance_maps)):
        uv, depth = utils3d.np.project_cv(directions, extrinsics=extrinsics[i], intrinsics=intrinsics[i])
        valid = (depth > 0) & (uv > 0).all(axis=-1) & (uv < 1).all(axis=-1)
        px = utils3d.np.uv_to_pixel(np.clip(uv, 0, 1), distance_maps[i].shape).astype(np.float32)
        logd = np.where(valid, cv2.remap(np.log(distance_maps[i]), px[..., 0], px[..., 1], cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE), 0)
        m = valid & (cv2.remap(pred_masks[i].astype(np.uint8), px[..., 0], px[..., 1], cv2.INTER_NEAREST, borderMode=cv2.BORDER_REPLICATE) > 0)
        out.append((logd, m))
    return out


def remap_checks(rng) -> dict:
    """cv2.remap as the split and the merge call it, on random maps reaching past the borders."""
    src_u8 = rng.integers(0, 256, (23, 31, 3), dtype=np.uint8)
    src_f = rng.normal(0, 1, (23, 31)).astype(np.float32)
    src_m = (rng.random((23, 31)) < 0.5).astype(np.uint8)
    mx = rng.uniform(-3, 34, (17, 19)).astype(np.float32)
    my = rng.uniform(-3, 26, (17, 19)).astype(np.float32)
    mx[0, :5] = [0.5, 1.0 / 64, 30.999, -0.5, 15.5]        # halves, a 64th, edges
    my[0, :5] = [0.5, 2.0 / 64, 21.999, -0.5, 11.25]
    small = (rng.random((20, 40)) < 0.6).astype(np.uint8)
    smallf = rng.uniform(0.5, 4.0, (20, 40)).astype(np.float32)
    return {
        "remap_src_u8": src_u8, "remap_src_f32": src_f, "remap_src_mask": src_m, "remap_x": mx, "remap_y": my,
        "remap_u8_linear_constant": cv2.remap(src_u8, mx, my, interpolation=cv2.INTER_LINEAR),
        "remap_f32_linear_replicate": cv2.remap(src_f, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE),
        "remap_mask_nearest_replicate": cv2.remap(src_m, mx, my, cv2.INTER_NEAREST, borderMode=cv2.BORDER_REPLICATE),
        # the merge's last resizes, as infer_panorama.py calls them (its third argument is `dst`, so both are bilinear)
        "resize_mask_src": small, "resize_mask_97x50": (cv2.resize(small, (97, 50), cv2.INTER_NEAREST) > 0).astype(np.uint8),
        "resize_f32_src": smallf, "resize_f32_97x50": cv2.resize(smallf, (97, 50), cv2.INTER_LINEAR),
    }


def reference(model, image, view, tokens, coarse=False):
    """Upstream's steps on `image` with `model`: the views, their distances and masks, the merge (and at half
    the size with `coarse`), each view's offset to the merged map and the metric factor."""
    h, w = image.shape[:2]
    extrinsics, intrinsics = pano.get_panorama_cameras()
    views = pano.split_panorama_image(image, extrinsics, intrinsics, view)

    distances, masks = [], []
    with torch.no_grad():
        for i in range(0, len(views), 4):   # upstream's batch size
            t = torch.tensor(np.stack(views[i:i + 4]) / 255, dtype=torch.float32).permute(0, 3, 1, 2)
            fov_x, _ = np.rad2deg(utils3d.np.intrinsics_to_fov(np.array(intrinsics[i:i + 4])))
            o = model.infer(t, fov_x=torch.tensor(fov_x, dtype=torch.float32), apply_mask=False, num_tokens=tokens)
            distances.extend(list(o["points"].norm(dim=-1).numpy()))
            masks.extend(list(o["mask"].numpy()))

    mw, mh = min(1920, w), min(960, h)
    merged, merged_mask = pano.merge_panorama_depth(mw, mh, distances, masks, extrinsics, intrinsics)
    coarse_maps = pano.merge_panorama_depth(mw // 2, mh // 2, distances, masks, extrinsics, intrinsics) if coarse else None

    offsets = []
    for logd, m in remapped_views(mw, mh, distances, masks, extrinsics, intrinsics):
        offsets.append(np.median((logd - np.log(merged))[m]) if m.any() else np.nan)
    offsets = np.array(offsets)
    factor = np.exp(np.median(offsets[np.isfinite(offsets)]))

    distance = cv2.resize((merged * factor).astype(np.float32), (w, h), cv2.INTER_LINEAR)
    mask = cv2.resize(merged_mask.astype(np.uint8), (w, h), cv2.INTER_NEAREST) > 0
    return dict(extrinsics=extrinsics, intrinsics=intrinsics, views=views, distances=distances, masks=masks,
                merged=merged, merged_mask=merged_mask, coarse=coarse_maps, offsets=offsets, factor=factor,
                distance=distance, mask=mask)


def fullsize(variant: str, checkpoint: str):
    """The same panorama through a full-size architecture (a synthetic checkpoint of
    tests/make_fullsize_reference.py --save-checkpoint): its merged map at metric scale and mask."""
    from moge.model.v2 import MoGeModel
    model = MoGeModel.from_pretrained(checkpoint).eval()
    image = cv2.cvtColor(cv2.imread(str(FIX / "images" / "pano_384x192.png")), cv2.COLOR_BGR2RGB)
    r = reference(model, image, VIEW, TOKENS)
    np.savez_compressed(
        FIX / "panorama" / f"{variant}_384x192.npz",
        distance=r["distance"], mask=r["mask"].astype(np.uint8), metric_factor=np.float64(r["factor"]),
        view_size=np.int64(VIEW), num_tokens=np.int64(TOKENS),
    )
    print(variant, "mask share", float(r["mask"].mean()), "factor", r["factor"])


def main():
    torch.set_num_threads(2)
    scipy.optimize.least_squares = converged_least_squares   # imported inside solve_optimal_shift at each call
    out = FIX / "panorama"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)

    h, w = 192, 384
    image = make_panorama(h, w)
    image_path = FIX / "images" / "pano_384x192.png"
    cv2.imwrite(str(image_path), image[..., ::-1])
    image = cv2.cvtColor(cv2.imread(str(image_path)), cv2.COLOR_BGR2RGB)

    ck = CHECKPOINTS["tiny_normal"]
    register_tiny_backbone(ck["embed_dim"], ck["depth"])
    from moge.model.v2 import MoGeModel
    model = MoGeModel.from_pretrained(str(FIX / "tiny_normal.pt")).eval()

    r = reference(model, image, VIEW, TOKENS, coarse=True)
    extrinsics, intrinsics, views = r["extrinsics"], r["intrinsics"], r["views"]
    distances, masks, merged, merged_mask = r["distances"], r["masks"], r["merged"], r["merged_mask"]
    coarse, coarse_mask = r["coarse"]
    offsets, factor = r["offsets"], r["factor"]

    distance, mask = r["distance"], r["mask"]
    points = distance[:, :, None] * pano.spherical_uv_to_directions(utils3d.np.uv_map(h, w))
    # The mesh's pixels, as infer_panorama.py chooses them (its --threshold default 0.03).
    normals, normals_mask = utils3d.np.point_map_to_normal_map(points, mask)
    mesh_mask = mask & ~(utils3d.np.depth_map_edge(distance, rtol=0.03) & utils3d.np.normal_map_edge(normals, tol=5, mask=normals_mask))
    # The same on a crop, taken as a picture of its own, with the points kept: the edges from
    # given points, free of numpy's float32 sines (moge's are rounded from float64).
    crop = np.s_[64:112, 0:160]
    c_points, c_distance, c_mask = points[crop], distance[crop], mask[crop]
    c_normals, c_normals_mask = utils3d.np.point_map_to_normal_map(c_points, c_mask)
    c_keep = c_mask & ~(utils3d.np.depth_map_edge(c_distance, rtol=0.03) & utils3d.np.normal_map_edge(c_normals, tol=5, mask=c_normals_mask))

    np.savez_compressed(
        out / "tiny_384x192.npz",
        extrinsics=np.asarray(extrinsics, np.float32), intrinsics=np.asarray(intrinsics[0], np.float32),
        views=np.stack(views), view_distance=np.stack(distances).astype(np.float32),
        view_mask=np.stack(masks).astype(np.uint8),
        merged=merged.astype(np.float32), merged_mask=merged_mask.astype(np.uint8),
        coarse=coarse.astype(np.float32), coarse_mask=coarse_mask.astype(np.uint8),
        view_log_offsets=offsets.astype(np.float64), metric_factor=np.float64(factor),
        # the merge's size is the panorama's here, so the last resize keeps the map: distance = merged x factor
        mask=mask.astype(np.uint8), distance=distance, mesh_mask=mesh_mask.astype(np.uint8),
        crop_points=c_points.astype(np.float32), crop_distance=c_distance, crop_mask=c_mask.astype(np.uint8), crop_mesh_mask=c_keep.astype(np.uint8),
        points_upstream_axes_every_7th=points[::7, ::7].astype(np.float32),
        view_size=np.int64(VIEW), num_tokens=np.int64(TOKENS),
        **remap_checks(rng),
    )
    print("views", len(views), "mask share", float(mask.mean()), "mesh share", float(mesh_mask.mean()),
          "depth-edge-only share", float((mask & ~utils3d.np.depth_map_edge(distance, rtol=0.03)).mean()), "factor", factor,
          "merged range", float(merged.min()), float(merged.max()))


if __name__ == "__main__":
    torch.set_num_threads(2)
    scipy.optimize.least_squares = converged_least_squares
    if sys.argv[1:2] == ["--fullsize"]:
        fullsize(sys.argv[2], sys.argv[3])
    else:
        main()
