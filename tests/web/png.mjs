// A PNG reader for the tests (non-interlaced gray, RGB, RGBA; 8 or 16 bits), independent of the
// page's writer and of the browser's decoder, which turns 16-bit samples into 8.
import { inflateSync } from "node:zlib";

export function decodePng(buf) {
  const sig = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];
  if (sig.some((b, i) => buf[i] !== b)) throw new Error("not a PNG");
  let at = 8;
  const idat = [];
  let width = 0;
  let height = 0;
  let depth = 0;
  let type = 0;
  while (at < buf.length) {
    const len = buf.readUInt32BE(at);
    const kind = buf.toString("latin1", at + 4, at + 8);
    const data = buf.subarray(at + 8, at + 8 + len);
    if (kind === "IHDR") {
      [width, height, depth, type] = [data.readUInt32BE(0), data.readUInt32BE(4), data[8], data[9]];
      if (data[12] !== 0) throw new Error("interlaced PNGs are not read");
    } else if (kind === "IDAT") idat.push(data);
    else if (kind === "IEND") break;
    at += 12 + len;
  }
  const channels = { 0: 1, 2: 3, 4: 2, 6: 4 }[type];
  if (!channels || (depth !== 8 && depth !== 16)) throw new Error(`PNG colour type ${type}, depth ${depth} not read`);
  const bpp = (channels * depth) / 8;
  const stride = width * bpp;
  const raw = inflateSync(Buffer.concat(idat));
  const out = Buffer.alloc(height * stride);
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)];
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    const row = out.subarray(y * stride, (y + 1) * stride);
    const prev = y > 0 ? out.subarray((y - 1) * stride, y * stride) : Buffer.alloc(stride);
    for (let i = 0; i < stride; i++) {
      const a = i >= bpp ? row[i - bpp] : 0;
      const b = prev[i];
      const c = i >= bpp ? prev[i - bpp] : 0;
      let p;
      if (filter === 0) p = 0;
      else if (filter === 1) p = a;
      else if (filter === 2) p = b;
      else if (filter === 3) p = (a + b) >> 1;
      else if (filter === 4) {
        const [pa, pb, pc] = [Math.abs(b - c), Math.abs(a - c), Math.abs(a + b - 2 * c)];
        p = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      } else throw new Error(`PNG filter ${filter}`);
      row[i] = (line[i] + p) & 0xff;
    }
  }
  const samples = depth === 16 ? Uint16Array.from({ length: out.length / 2 }, (_, i) => out.readUInt16BE(2 * i)) : new Uint8Array(out);
  return { width, height, channels, depth, samples };
}
