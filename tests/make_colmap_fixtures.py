"""A synthetic room and its COLMAP reconstruction, for tests/it/colmap.rs:

    python tests/make_colmap_fixtures.py    # needs numpy, Pillow and pycolmap (PyPI)
    python tests/make_colmap_fixtures.py --size 1280x960 --points 60000 --out DIR   # for scripts/bench-colmap.sh

writes tests/fixtures/colmap/:
- images/: 64x48 photos of a room (a box of textured walls, floor and ceiling) from known cameras;
- sparse_txt/ and sparse_bin/: the same model written by COLMAP itself (pycolmap's
  Reconstruction.write_text / write_binary): the known cameras and poses, and points on the walls
  observed where they project, in units of SCALE times metres;
- truth/NAME.npy: each photo's true depth in metres (float32, H x W);
- scene.json: SCALE, and what each image is for.

The images: a.png (PINHOLE, off the centre, fx != fy), sub/b.png (SIMPLE_PINHOLE), c.png (a.png's
camera from elsewhere), d.png (OPENCV with distortion: refused), e.png (registered, missing from
images/), f.png (registered, observing no point).
"""

import json
import os

import numpy as np
import pycolmap
from PIL import Image

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "colmap")
W, H = 64, 48
N_POINTS = 600
SCALE = 0.37  # model units per metre
BOX = np.array([[-2.0, -1.5, -2.0], [2.0, 1.5, 4.0]])  # the room, metres (y down, z forward)


def rot_y(deg):
    a = np.radians(deg)
    return np.array([[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]])


def rot_x(deg):
    a = np.radians(deg)
    return np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])


def hit(origin, dirs):
    """Distance along each ray (dirs: N x 3, world) to the room's walls, from inside, and the
    hit point."""
    t = np.full(len(dirs), np.inf)
    for axis in range(3):
        d = dirs[:, axis]
        with np.errstate(divide="ignore"):
            for bound in BOX[:, axis]:
                ti = (bound - origin[axis]) / d
                t = np.where((ti > 1e-9) & (ti < t), ti, t)
    return t, origin + dirs * t[:, None]


def texture(p):
    # A checker of 0.5 m with a gradient, different per wall.
    c = (np.floor(p[:, 0] * 2) + np.floor(p[:, 1] * 2) + np.floor(p[:, 2] * 2)) % 2
    r = 80 + 120 * c + 20 * np.sin(p[:, 0])
    g = 60 + 100 * (1 - c) + 30 * np.cos(p[:, 2])
    b = 90 + 60 * c + 25 * p[:, 1]
    return np.clip(np.stack([r, g, b], 1), 0, 255).astype(np.uint8)


def render(k, r_cw, center):
    """The photo and true depth (z in the camera, metres) of a pinhole camera k = (fx, fy, cx, cy)
    with world-from-camera rotation r_cw at center; pixel centres at +0.5."""
    fx, fy, cx, cy = k
    u, v = np.meshgrid(np.arange(W) + 0.5, np.arange(H) + 0.5)
    rays_cam = np.stack([(u - cx) / fx, (v - cy) / fy, np.ones_like(u)], -1).reshape(-1, 3)
    dirs = rays_cam @ r_cw.T
    t, p = hit(center, dirs)
    depth = t  # rays_cam has z = 1, so the distance along it is the depth
    return texture(p).reshape(H, W, 3), depth.reshape(H, W).astype(np.float32)


def main():
    rng = np.random.default_rng(3)
    os.makedirs(os.path.join(OUT, "images", "sub"), exist_ok=True)
    os.makedirs(os.path.join(OUT, "truth", "sub"), exist_ok=True)
    rec = pycolmap.Reconstruction()
    # The cameras of a 64x48 photo, scaled to the photos' size.
    sx, sy = W / 64, H / 48
    pinhole = {1: (50.0 * sx, 53.0 * sy, 29.5 * sx, 25.25 * sy), 2: (45.0 * sx, 45.0 * sy, 32.0 * sx, 24.0 * sy), 3: (50.0 * sx, 50.0 * sy, 32.0 * sx, 24.0 * sy)}
    cams = {
        1: ("PINHOLE", list(pinhole[1])),
        2: ("SIMPLE_PINHOLE", [pinhole[2][0], pinhole[2][2], pinhole[2][3]]),
        3: ("OPENCV", list(pinhole[3]) + [-0.05, 0.01, 0.0, 0.0]),
    }
    for cid, (model, params) in cams.items():
        rec.add_camera_with_trivial_rig(pycolmap.Camera(model=model, width=W, height=H, params=params, camera_id=cid))
    # name, camera, yaw, pitch, centre (metres), written to images/, observes points
    shots = [
        ("a.png", 1, 0.0, 0.0, [0.0, 0.0, 0.0], True, True),
        ("sub/b.png", 2, 20.0, 5.0, [0.5, 0.2, 0.5], True, True),
        ("c.png", 1, -25.0, -5.0, [-0.4, -0.1, 1.0], True, True),
        ("d.png", 3, 10.0, 0.0, [0.2, 0.0, -0.5], True, True),
        ("e.png", 2, 0.0, 10.0, [0.0, 0.3, 0.2], False, True),
        ("f.png", 2, 180.0, 0.0, [0.0, 0.0, 0.0], True, False),
    ]
    # Points on the walls, metres.
    n = N_POINTS
    pts = rng.uniform(BOX[0], BOX[1], size=(n, 3))
    face = rng.integers(0, 6, n)
    for i in range(n):
        pts[i, face[i] // 2] = BOX[face[i] % 2, face[i] // 2]
    point_ids = [rec.add_point3D(p * SCALE, pycolmap.Track(), texture(p[None])[0]) for p in pts]
    scene = {"scale": SCALE, "images": {}}
    for image_id, (name, cid, yaw, pitch, centre, written, observes) in enumerate(shots, start=1):
        centre = np.array(centre)
        r_cw = rot_y(yaw) @ rot_x(pitch)  # world from camera
        photo, depth = render(pinhole[cid], r_cw, centre)
        stem = os.path.splitext(name)[0]
        if written:
            Image.fromarray(photo).save(os.path.join(OUT, "images", name))
        np.save(os.path.join(OUT, "truth", stem + ".npy"), depth)
        # Observations: every point in front and inside the photo (the room is convex).
        fx, fy, cx, cy = pinhole[cid]
        pc = (pts - centre) @ r_cw  # camera coordinates, metres
        obs = []
        if observes:
            for pid, p in zip(point_ids, pc):
                if p[2] > 0.1:
                    x, y = fx * p[0] / p[2] + cx, fy * p[1] / p[2] + cy
                    if 1 <= x < W - 1 and 1 <= y < H - 1:
                        obs.append((pid, x, y))
        r_wc = r_cw.T
        t = -r_wc @ (centre * SCALE)
        q = pycolmap.Rotation3d(r_wc)
        img = pycolmap.Image(name=name, camera_id=cid, image_id=image_id, points2D=[pycolmap.Point2D(np.array([x, y])) for _, x, y in obs])
        rec.add_image_with_trivial_frame(img, pycolmap.Rigid3d(q, t))
        for idx, (pid, _, _) in enumerate(obs):
            rec.add_observation(pid, pycolmap.TrackElement(image_id, idx))
        scene["images"][name] = {"observations": len(obs), "written": written}
    # Points no image observes are dropped, as COLMAP would not have them.
    for pid in point_ids:
        if rec.points3D[pid].track.length() == 0:
            rec.delete_point3D(pid)
    for kind in ("txt", "bin"):
        d = os.path.join(OUT, "sparse_" + kind)
        os.makedirs(d, exist_ok=True)
        (rec.write_text if kind == "txt" else rec.write_binary)(d)
    with open(os.path.join(OUT, "scene.json"), "w") as f:
        json.dump(scene, f, indent=1)
    print(rec.summary())


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default=f"{W}x{H}")
    ap.add_argument("--points", type=int, default=N_POINTS)
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args()
    W, H = map(int, a.size.split("x"))
    N_POINTS, OUT = a.points, a.out
    main()
