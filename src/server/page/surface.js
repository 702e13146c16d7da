// The surface that `moge predict --format ply,glb` writes (src/outputs/edges.rs, after upstream
// `moge infer`): pixels on depth edges dropped, each 2x2 block with four valid corners split into
// two triangles, the pixels those use as vertices (row-major), in OpenGL axes (y, z negated).
// The page draws it and writes its ply and glb from it.

const f = Math.fround;

// mask & !depth_edge(depth, rtol): the depth range over the 3x3 neighbourhood, over the depth,
// above rtol is an edge; a masked (+inf) neighbour makes the range infinite. In f32, as Rust.
export function cleanMask(depth, mask, width, height, rtol) {
  const out = new Uint8Array(width * height);
  const r = f(rtol);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const i = y * width + x;
      if (!mask[i]) continue;
      let lo = Infinity;
      let hi = -Infinity;
      for (let yy = Math.max(y - 1, 0); yy < Math.min(y + 2, height); yy++) {
        for (let xx = Math.max(x - 1, 0); xx < Math.min(x + 2, width); xx++) {
          const d = depth[yy * width + xx];
          if (!Number.isNaN(d)) {
            lo = Math.min(lo, d);
            hi = Math.max(hi, d);
          }
        }
      }
      out[i] = f(f(hi - lo) / depth[i]) > r ? 0 : 1;
    }
  }
  return out;
}

// geometry/uv.rs's linspace, in f32.
function linspace(start, end, steps) {
  const out = new Float32Array(steps);
  const [a, b] = [f(start), f(end)];
  if (steps === 1) out[0] = a;
  if (steps < 2) return out;
  const step = f(f(b - a) / (steps - 1));
  const half = Math.floor(steps / 2);
  for (let i = 0; i < steps; i++) out[i] = i < half ? f(a + f(step * i)) : f(b - f(step * (steps - 1 - i)));
  return out;
}

// maps: { points, depth, mask, normal?, width, height }; rgba: the photo's pixels at that size.
export function buildSurface(maps, rgba, rtol) {
  const { width: w, height: h, points, depth, normal } = maps;
  const mask = cleanMask(depth, maps.mask, w, h, rtol);
  const used = new Uint8Array(w * h);
  let quads = 0;
  const corner = (tl) => mask[tl] && mask[tl + w] && mask[tl + w + 1] && mask[tl + 1];
  for (let y = 0; y + 1 < h; y++) {
    for (let x = 0; x + 1 < w; x++) {
      const tl = y * w + x;
      if (corner(tl)) {
        used[tl] = used[tl + w] = used[tl + w + 1] = used[tl + 1] = 1;
        quads++;
      }
    }
  }
  let n = 0;
  for (let p = 0; p < w * h; p++) n += used[p];
  const index = new Uint32Array(w * h);
  const s = {
    count: n,
    positions: new Float32Array(3 * n),
    normals: normal ? new Float32Array(3 * n) : null,
    uvs: new Float32Array(2 * n),
    colors: new Uint8Array(3 * n),
    pixels: new Uint32Array(n),
    triangles: new Uint32Array(6 * quads),
  };
  const us = linspace(0.5 / w, 1 - 0.5 / w, w);
  const vs = linspace(0.5 / h, 1 - 0.5 / h, h);
  let v = 0;
  for (let p = 0; p < w * h; p++) {
    if (!used[p]) continue;
    index[p] = v;
    s.pixels[v] = p;
    s.positions.set([points[3 * p], -points[3 * p + 1], -points[3 * p + 2]], 3 * v);
    if (normal) s.normals.set([normal[3 * p], -normal[3 * p + 1], -normal[3 * p + 2]], 3 * v);
    s.uvs.set([us[p % w], f(1 - vs[Math.floor(p / w)])], 2 * v);
    s.colors.set([rgba[4 * p], rgba[4 * p + 1], rgba[4 * p + 2]], 3 * v);
    v++;
  }
  let t = 0;
  for (let y = 0; y + 1 < h; y++) {
    for (let x = 0; x + 1 < w; x++) {
      const tl = y * w + x;
      if (!corner(tl)) continue;
      const [a, b, c, d] = [index[tl], index[tl + w], index[tl + w + 1], index[tl + 1]];
      s.triangles.set([a, b, c, a, c, d], t);
      t += 6;
    }
  }
  return s;
}
