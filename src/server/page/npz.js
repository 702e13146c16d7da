// The npz that `POST /predict` answers (docs/server.md): a zip of .npy arrays, stored or
// deflated, read into typed arrays. Only what numpy and moge write is read: little-endian
// numbers, C order, zip64 sizes where a map passes 4 GB.

const EOCD = 0x06054b50;
const EOCD64_LOCATOR = 0x07064b50;
const CENTRAL = 0x02014b50;
const LOCAL = 0x04034b50;

function u64(view, at) {
  return view.getUint32(at, true) + view.getUint32(at + 4, true) * 2 ** 32;
}

// The central directory's entries: name, method, sizes and where the local header is.
function entries(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let end = -1;
  for (let i = bytes.length - 22; i >= Math.max(0, bytes.length - 22 - 65535); i--) {
    if (view.getUint32(i, true) === EOCD) {
      end = i;
      break;
    }
  }
  if (end < 0) throw new Error("not an npz file (no zip directory)");
  let count = view.getUint16(end + 10, true);
  let offset = view.getUint32(end + 16, true);
  if (offset === 0xffffffff && end >= 20 && view.getUint32(end - 20, true) === EOCD64_LOCATOR) {
    const e64 = u64(view, end - 12);
    count = u64(view, e64 + 32);
    offset = u64(view, e64 + 48);
  }
  const out = [];
  let at = offset;
  for (let k = 0; k < count; k++) {
    if (at + 46 > bytes.length || view.getUint32(at, true) !== CENTRAL) throw new Error("damaged npz directory");
    const method = view.getUint16(at + 10, true);
    let packed = view.getUint32(at + 20, true);
    let size = view.getUint32(at + 24, true);
    const nameLen = view.getUint16(at + 28, true);
    const extraLen = view.getUint16(at + 30, true);
    const commentLen = view.getUint16(at + 32, true);
    let local = view.getUint32(at + 42, true);
    const name = new TextDecoder().decode(bytes.subarray(at + 46, at + 46 + nameLen));
    // The zip64 field holds, in this order, the sizes and offset that did not fit.
    let x = at + 46 + nameLen;
    const xEnd = x + extraLen;
    while (x + 4 <= xEnd) {
      const id = view.getUint16(x, true);
      const len = view.getUint16(x + 2, true);
      if (id === 1) {
        let f = x + 4;
        if (size === 0xffffffff) { size = u64(view, f); f += 8; }
        if (packed === 0xffffffff) { packed = u64(view, f); f += 8; }
        if (local === 0xffffffff) { local = u64(view, f); }
      }
      x += 4 + len;
    }
    out.push({ name, method, packed, size, local });
    at = xEnd + commentLen;
  }
  return { view, list: out };
}

async function inflate(data) {
  const stream = new Blob([data]).stream().pipeThrough(new DecompressionStream("deflate-raw"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

function halfToFloat(h) {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

const DTYPES = {
  "<f4": [4, (b, n) => new Float32Array(b, 0, n)],
  "<f8": [8, (b, n) => new Float64Array(b, 0, n)],
  "<i4": [4, (b, n) => new Int32Array(b, 0, n)],
  "<u2": [2, (b, n) => new Uint16Array(b, 0, n)],
  "|u1": [1, (b, n) => new Uint8Array(b, 0, n)],
  "|b1": [1, (b, n) => new Uint8Array(b, 0, n)],
  "<f2": [2, (b, n) => Float32Array.from(new Uint16Array(b, 0, n), halfToFloat)],
};

// One .npy file: { dtype, shape, data }, float16 widened to Float32Array.
export function parseNpy(bytes, name = "array") {
  const magic = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59];
  if (bytes.length < 10 || magic.some((b, i) => bytes[i] !== b)) throw new Error(`${name}: not a .npy array`);
  const major = bytes[6];
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerLen = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
  const start = (major === 1 ? 10 : 12) + headerLen;
  const header = new TextDecoder("latin1").decode(bytes.subarray(major === 1 ? 10 : 12, start));
  const descr = /'descr':\s*'([^']+)'/.exec(header)?.[1];
  const fortran = /'fortran_order':\s*True/.test(header);
  const shapeText = /'shape':\s*\(([^)]*)\)/.exec(header)?.[1];
  if (!descr || shapeText === undefined) throw new Error(`${name}: unreadable .npy header`);
  if (fortran) throw new Error(`${name}: Fortran order is not read`);
  const dtype = DTYPES[descr];
  if (!dtype) throw new Error(`${name}: element type ${descr} is not read`);
  const shape = shapeText.split(",").map((s) => s.trim()).filter(Boolean).map(Number);
  const count = shape.reduce((a, b) => a * b, 1);
  const [width, make] = dtype;
  if (bytes.length - start < count * width) throw new Error(`${name}: the data is cut short`);
  // A copy: typed arrays need their element alignment, which a zip entry does not keep.
  const data = make(bytes.slice(start, start + count * width).buffer, count);
  return { dtype: descr, shape, data };
}

// name (without .npy) -> { dtype, shape, data }
export async function readNpz(buffer) {
  const bytes = new Uint8Array(buffer);
  const { view, list } = entries(bytes);
  const arrays = new Map();
  for (const e of list) {
    if (view.getUint32(e.local, true) !== LOCAL) throw new Error(`${e.name}: damaged npz entry`);
    const start = e.local + 30 + view.getUint16(e.local + 26, true) + view.getUint16(e.local + 28, true);
    const packed = bytes.subarray(start, start + e.packed);
    let data;
    if (e.method === 0) data = packed;
    else if (e.method === 8) data = await inflate(packed);
    else throw new Error(`${e.name}: zip method ${e.method} is not read`);
    arrays.set(e.name.replace(/\.npy$/, ""), parseNpy(data, e.name));
  }
  return arrays;
}
