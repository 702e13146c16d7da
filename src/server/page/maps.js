// The pictures of the maps, as `moge predict --format vis` draws them (src/outputs/vis.rs, after
// upstream's `moge/utils/vis.py`), pixel for pixel: f32 steps are rounded with Math.fround
// where the Rust code computes in f32.

const f = Math.fround;

// ColorBrewer's Spectral, matplotlib's control colours.
const SPECTRAL = [
  [0x9e, 0x01, 0x42], [0xd5, 0x3e, 0x4f], [0xf4, 0x6d, 0x43], [0xfd, 0xae, 0x61],
  [0xfe, 0xe0, 0x8b], [0xff, 0xff, 0xbf], [0xe6, 0xf5, 0x98], [0xab, 0xdd, 0xa4],
  [0x66, 0xc2, 0xa5], [0x32, 0x88, 0xbd], [0x5e, 0x4f, 0xa2],
];

function spectralLut() {
  const last = SPECTRAL.length - 1;
  const lut = [];
  for (let i = 0; i < 256; i++) {
    const t = (i / 255) * last;
    const k = Math.min(Math.floor(t), last - 1);
    const d = t - k;
    lut.push([0, 1, 2].map((c) => {
      const a = SPECTRAL[k][c] / 255;
      const b = SPECTRAL[k + 1][c] / 255;
      return Math.trunc(Math.min(Math.max(a + d * (b - a), 0), 1) * 255);
    }));
  }
  return lut;
}

function quantile(sorted, q) {
  if (sorted.length === 0) return NaN;
  const pos = q * (sorted.length - 1);
  const lo = Math.floor(pos);
  const hi = Math.min(lo + 1, sorted.length - 1);
  const t = pos - lo;
  return f(sorted[lo] + (sorted[hi] - sorted[lo]) * t);
}

// RGBA pixels of the depth: disparity through Spectral between its 0.1 % and 99 % quantiles
// (masked pixels, at +inf, are far; depth <= 0 or NaN is black).
export function colorizeDepth(depth) {
  const disp = new Float32Array(depth.length);
  for (let i = 0; i < depth.length; i++) disp[i] = depth[i] > 0 ? f(1 / depth[i]) : NaN;
  const sorted = disp.filter((v) => !Number.isNaN(v)).sort();
  const lo = quantile(sorted, 0.001);
  const hi = quantile(sorted, 0.99);
  const lut = spectralLut();
  const out = new Uint8ClampedArray(depth.length * 4);
  for (let i = 0; i < depth.length; i++) {
    const x = f(1 - f(f(disp[i] - lo) / f(hi - lo)));
    out[4 * i + 3] = 255;
    if (Number.isNaN(x)) continue;
    const xa = f(x * 256);
    const c = lut[xa < 0 ? 0 : xa >= 256 ? 255 : Math.trunc(xa)];
    out.set(c, 4 * i);
  }
  return out;
}

// RGBA pixels of the normals: (n · [0.5, -0.5, -0.5] + 0.5) clipped, x 255, truncated.
export function colorizeNormal(normal) {
  const n = normal.length / 3;
  const out = new Uint8ClampedArray(n * 4);
  const c = (v, s) => Math.trunc(Math.min(Math.max(v * s + 0.5, 0), 1) * 255);
  for (let i = 0; i < n; i++) {
    out[4 * i] = c(normal[3 * i], 0.5);
    out[4 * i + 1] = c(normal[3 * i + 1], -0.5);
    out[4 * i + 2] = c(normal[3 * i + 2], -0.5);
    out[4 * i + 3] = 255;
  }
  return out;
}
