// The files the page offers beside the npz, written in the browser from the surface and maps it
// already has, in the layouts of `moge predict --format ply,glb,png` (src/outputs/ply.rs,
// glb.rs, png.rs): nothing goes back to the server.

// x.ply: binary little-endian vertices (x y z, nx ny nz, red green blue alpha), no faces, with
// the header moge writes.
export function ply(s, version) {
  let header = `ply\nformat binary_little_endian 1.0\ncomment written by moge ${version}\nelement vertex ${s.count}\n`;
  header += "property float x\nproperty float y\nproperty float z\n";
  if (s.normals) header += "property float nx\nproperty float ny\nproperty float nz\n";
  header += "property uchar red\nproperty uchar green\nproperty uchar blue\nproperty uchar alpha\n";
  header += "element face 0\nproperty list uchar int vertex_indices\nend_header\n";
  const head = new TextEncoder().encode(header);
  const rec = 12 + (s.normals ? 12 : 0) + 4;
  const out = new Uint8Array(head.length + rec * s.count);
  out.set(head);
  const view = new DataView(out.buffer);
  let at = head.length;
  for (let i = 0; i < s.count; i++) {
    for (let k = 0; k < 3; k++, at += 4) view.setFloat32(at, s.positions[3 * i + k], true);
    if (s.normals) for (let k = 0; k < 3; k++, at += 4) view.setFloat32(at, s.normals[3 * i + k], true);
    out.set(s.colors.subarray(3 * i, 3 * i + 3), at);
    out[at + 3] = 255;
    at += 4;
  }
  return out;
}

function bytesOf(typed) {
  return new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength);
}

// x.glb: binary glTF 2.0, u32 indices, POSITION / NORMAL / TEXCOORD_0, the photo as the base
// colour texture (png: its PNG bytes), metallic 0.5, roughness 1.
export function glb(s, png, version) {
  const asset = { version: "2.0", generator: `moge ${version}` };
  let doc;
  const chunks = [];
  let length = 0;
  const views = [];
  const push = (bytes, target) => {
    length = (length + 3) & ~3;
    const v = { buffer: 0, byteOffset: length, byteLength: bytes.length };
    if (target) v.target = target;
    chunks.push([length, bytes]);
    length += bytes.length;
    views.push(v);
    return views.length - 1;
  };
  if (s.triangles.length === 0) {
    // glTF forbids empty accessors.
    doc = { asset, scene: 0, scenes: [{ nodes: [] }] };
  } else {
    const vIdx = push(bytesOf(s.triangles), 34963);
    const vPos = push(bytesOf(s.positions), 34962);
    const vNrm = s.normals ? push(bytesOf(s.normals), 34962) : null;
    const vUv = push(bytesOf(s.uvs), 34962);
    const vImg = push(png);
    const lo = [Infinity, Infinity, Infinity];
    const hi = [-Infinity, -Infinity, -Infinity];
    for (let i = 0; i < s.positions.length; i++) {
      lo[i % 3] = Math.min(lo[i % 3], s.positions[i]);
      hi[i % 3] = Math.max(hi[i % 3], s.positions[i]);
    }
    const accessors = [
      { bufferView: vIdx, componentType: 5125, count: s.triangles.length, type: "SCALAR" },
      { bufferView: vPos, componentType: 5126, count: s.count, type: "VEC3", min: lo, max: hi },
      { bufferView: vUv, componentType: 5126, count: s.count, type: "VEC2" },
    ];
    const attributes = { POSITION: 1, TEXCOORD_0: 2 };
    if (vNrm !== null) {
      accessors.push({ bufferView: vNrm, componentType: 5126, count: s.count, type: "VEC3" });
      attributes.NORMAL = 3;
    }
    doc = {
      asset, scene: 0, scenes: [{ nodes: [0] }], nodes: [{ mesh: 0 }],
      meshes: [{ primitives: [{ attributes, indices: 0, material: 0, mode: 4 }] }],
      materials: [{ pbrMetallicRoughness: { baseColorTexture: { index: 0 }, metallicFactor: 0.5, roughnessFactor: 1.0 } }],
      textures: [{ source: 0 }],
      images: [{ bufferView: vImg, mimeType: "image/png" }],
      accessors, bufferViews: views, buffers: [{ byteLength: length }],
    };
  }
  let json = new TextEncoder().encode(JSON.stringify(doc));
  const jsonLen = (json.length + 3) & ~3;
  const binLen = (length + 3) & ~3;
  const total = 12 + 8 + jsonLen + (binLen ? 8 + binLen : 0);
  if (total > 0xffffffff) throw new Error("the mesh is over the 4 GB limit of a GLB file");
  const out = new Uint8Array(total);
  const view = new DataView(out.buffer);
  [0x46546c67, 2, total, jsonLen, 0x4e4f534a].forEach((v, i) => view.setUint32(4 * i, v, true));
  out.fill(0x20, 20, 20 + jsonLen);
  out.set(json, 20);
  if (binLen) {
    const b = 20 + jsonLen;
    view.setUint32(b, binLen, true);
    view.setUint32(b + 4, 0x004e4942, true);
    for (const [at, bytes] of chunks) out.set(bytes, b + 8 + at);
  }
  return out;
}

let crcTable = null;
function crc32(bytes) {
  if (!crcTable) {
    crcTable = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      crcTable[n] = c >>> 0;
    }
  }
  let c = 0xffffffff;
  for (const b of bytes) c = crcTable[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

async function zlib(bytes) {
  const stream = new Blob([bytes]).stream().pipeThrough(new CompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

function chunk(type, data) {
  const out = new Uint8Array(12 + data.length);
  const view = new DataView(out.buffer);
  view.setUint32(0, data.length);
  out.set(new TextEncoder().encode(type), 4);
  out.set(data, 8);
  view.setUint32(8 + data.length, crc32(out.subarray(4, 8 + data.length)));
  return out;
}

// The depth code of png.rs: round(d / scale) half up, clamped to 1..=65535; 0 = invalid.
export function depthCodes(depth, mask, scale) {
  const s = Math.fround(scale);
  const codes = new Uint16Array(depth.length);
  for (let i = 0; i < depth.length; i++) {
    const d = depth[i];
    if (!(mask[i] && Number.isFinite(d) && d > 0)) continue;
    codes[i] = Math.trunc(Math.min(Math.max(d / s + 0.5, 1), 65535));
  }
  return codes;
}

// x.depth.png: 16-bit gray, metres = value x scale.
export async function depthPng(maps, scale) {
  const { width: w, height: h } = maps;
  const codes = depthCodes(maps.depth, maps.mask, scale);
  const raw = new Uint8Array(h * (1 + 2 * w));
  for (let y = 0; y < h; y++) {
    const row = y * (1 + 2 * w);
    for (let x = 0; x < w; x++) {
      const c = codes[y * w + x];
      raw[row + 1 + 2 * x] = c >> 8;
      raw[row + 2 + 2 * x] = c & 0xff;
    }
  }
  const ihdr = new Uint8Array(13);
  const v = new DataView(ihdr.buffer);
  v.setUint32(0, w);
  v.setUint32(4, h);
  ihdr.set([16, 0, 0, 0, 0], 8);
  const parts = [new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), chunk("IHDR", ihdr), chunk("IDAT", await zlib(raw)), chunk("IEND", new Uint8Array(0))];
  return new Blob(parts, { type: "image/png" });
}
