// The page: a photo in, `POST /predict` (npz_binary), then the maps drawn, the 3D view, the
// measuring and the downloads, all from the one answer.

import { readNpz } from "./npz.js";
import { colorizeDepth, colorizeNormal } from "./maps.js";
import { buildSurface } from "./surface.js";
import { depthPng, glb, ply } from "./export.js";
import { Viewer } from "./viewer.js";

const $ = (id) => document.getElementById(id);
// Pixels the 3D view draws at most: a larger map is drawn from every k-th pixel each way (the
// downloads keep every pixel).
const VIEW_PIXELS = 1_000_000;
const state = { info: null, file: null, result: null, marks: [], viewer: null, request: null };

function showError(message) {
  const e = $("error");
  e.textContent = message;
  e.hidden = !message;
}

function setStatus(text, busy = false) {
  $("status").textContent = text;
  $("status").classList.toggle("busy", busy);
}

function megabytes(n) {
  return `${(n / 1e6).toFixed(n < 1e7 ? 1 : 0)} MB`;
}

// The server's model and limits; while it loads (503), asked again each second.
async function loadInfo() {
  try {
    const r = await fetch("/info");
    if (r.status === 503) {
      $("model").textContent = "the server is loading its model…";
      setTimeout(loadInfo, 1000);
      return;
    }
    if (!r.ok) throw new Error(`GET /info: HTTP ${r.status}`);
    const info = await r.json();
    state.info = info;
    $("model").textContent = `${info.model} · ${info.variant} · ${info.precision} on ${info.device} · moge ${info.version}`;
    $("precision").textContent = `Precision ${info.precision}, chosen when the server started (moge serve --precision).`;
    const [lo, hi] = info.num_tokens_range;
    const tokens = $("num-tokens");
    tokens.min = lo;
    tokens.max = Math.min(hi, info.max_tokens ?? hi);
    tokens.title = `${lo} to ${tokens.max}; empty: the server's default`;
    if (!info.has_normal) $("normal-figure").hidden = true;
    $("run").disabled = !state.file;
  } catch (e) {
    $("model").textContent = "";
    showError(`Cannot reach the server: ${e.message}`);
  }
}

function choose(file) {
  if (!file) return;
  state.file = file;
  showError("");
  // The last photo's result goes: what is shown is always the chosen photo's.
  state.result = null;
  state.marks = [];
  $("result").hidden = true;
  const preview = $("preview");
  if (preview.src) URL.revokeObjectURL(preview.src);
  preview.src = URL.createObjectURL(file);
  preview.hidden = false;
  $("drop-text").textContent = file.name || "pasted photo";
  $("run").disabled = !state.info;
  if (state.info) run();
}

function query() {
  const q = new URLSearchParams({ output_format: "npz_binary", npz_normal_dtype: "float32", fit: $("fit").value, apply_mask: $("apply-mask").checked });
  const tokens = $("num-tokens").value.trim();
  if (tokens) q.set("num_tokens", tokens);
  const fov = $("fov-x").value.trim();
  if (fov) q.set("fov_x", fov);
  return q;
}

// The server's own words for a refusal, else the status.
function refusal(xhr) {
  let message = "";
  try {
    message = JSON.parse(new TextDecoder().decode(xhr.response)).error ?? "";
  } catch {
    // Not the server's JSON (a proxy's page, say).
  }
  if (xhr.status === 503) return `The server is busy: ${message || "try again in a moment"}.`;
  if (xhr.status === 413) return message || "The photo is over the server's size limit.";
  return message || `HTTP ${xhr.status}`;
}

function run() {
  const file = state.file;
  const info = state.info;
  if (!file || !info) return;
  showError("");
  const name = file.name || "pasted photo";
  if (info.max_body_bytes && file.size > info.max_body_bytes) {
    showError(`${name}: ${megabytes(file.size)}, over this server's limit of ${megabytes(info.max_body_bytes)} (moge serve --max-body-mb)`);
    return;
  }
  state.request?.abort();
  const xhr = new XMLHttpRequest();
  state.request = xhr;
  const started = performance.now();
  let timer = 0;
  const elapsed = () => ((performance.now() - started) / 1000).toFixed(1);
  xhr.open("POST", `/predict?${query()}`);
  xhr.responseType = "arraybuffer";
  xhr.setRequestHeader("Content-Type", file.type || "application/octet-stream");
  xhr.upload.onprogress = (e) => {
    if (e.lengthComputable) setStatus(`Sending ${name}: ${Math.round((100 * e.loaded) / e.total)} %`, true);
  };
  xhr.upload.onload = () => {
    timer = setInterval(() => setStatus(`Running the model… ${elapsed()} s`, true), 100);
  };
  const done = () => {
    clearInterval(timer);
    if (state.request === xhr) state.request = null;
    $("run").disabled = false;
  };
  // A new photo or Run replaces a request in flight: its timer stops with it.
  xhr.onabort = done;
  xhr.onerror = () => {
    done();
    setStatus("");
    showError(`${name}: the server did not answer (stopped, or the connection broke)`);
  };
  xhr.onload = async () => {
    done();
    if (xhr.status !== 200) {
      setStatus("");
      showError(`${name}: ${refusal(xhr)}`);
      return;
    }
    try {
      const meta = JSON.parse(xhr.getResponseHeader("x-moge-meta") || "{}");
      await show(file, xhr.response, meta);
      setStatus(`Done in ${elapsed()} s (the model: ${(meta.timing_ms?.device / 1000).toFixed(2)} s).`);
    } catch (e) {
      setStatus("");
      showError(`${name}: ${e.message}`);
    }
  };
  $("run").disabled = true;
  setStatus(`Sending ${name}…`, true);
  xhr.send(file);
}

// The photo's pixels at the maps' size (the browser's decoder; grey where it cannot decode
// the file, as Chromium a HEIC).
async function photoPixels(file, width, height) {
  const canvas = document.createElement("canvas");
  [canvas.width, canvas.height] = [width, height];
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  try {
    const bitmap = await createImageBitmap(file, { imageOrientation: "from-image" });
    ctx.drawImage(bitmap, 0, 0, width, height);
  } catch {
    ctx.fillStyle = "#999";
    ctx.fillRect(0, 0, width, height);
  }
  return { canvas, rgba: ctx.getImageData(0, 0, width, height).data };
}

function paint(canvas, width, height, rgba) {
  [canvas.width, canvas.height] = [width, height];
  canvas.getContext("2d").putImageData(new ImageData(rgba, width, height), 0, 0);
}

async function show(file, buffer, meta) {
  const arrays = await readNpz(buffer);
  for (const key of ["points", "depth", "mask"]) if (!arrays.has(key)) throw new Error(`the answer has no ${key}`);
  const [height, width] = arrays.get("depth").shape;
  const maps = {
    width, height,
    points: arrays.get("points").data,
    depth: arrays.get("depth").data,
    mask: arrays.get("mask").data,
    normal: arrays.get("normal")?.data ?? null,
  };
  const photo = await photoPixels(file, width, height);
  state.result = { file, buffer, meta, maps, photo, surface: null };
  state.marks = [];
  $("result").hidden = false;
  paint($("photo-map"), width, height, photo.rgba);
  paint($("depth-map"), width, height, colorizeDepth(maps.depth));
  if (maps.normal) paint($("normal-map"), width, height, colorizeNormal(maps.normal));
  facts(meta, maps);
  if (!state.viewer) {
    try {
      state.viewer = new Viewer($("view3d"));
    } catch (e) {
      showError(e.message);
    }
  }
  rebuild();
  measure();
}

// Every k-th pixel each way of the maps and the photo's pixels.
function decimate(maps, rgba, k) {
  const [w, h] = [Math.ceil(maps.width / k), Math.ceil(maps.height / k)];
  const pick = (src, c) => {
    const out = new src.constructor(w * h * c);
    for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) {
      const [i, j] = [y * w + x, y * k * maps.width + x * k];
      for (let q = 0; q < c; q++) out[i * c + q] = src[j * c + q];
    }
    return out;
  };
  const small = { width: w, height: h, points: pick(maps.points, 3), depth: pick(maps.depth, 1), mask: pick(maps.mask, 1), normal: maps.normal ? pick(maps.normal, 3) : null };
  return [small, pick(rgba, 4)];
}

function rtol() {
  return $("remove-edges").checked ? Number($("edge-rtol").value) || 0.04 : Infinity;
}

// The full surface, for the downloads (made when first asked for, for the current edge options).
function fullSurface(r) {
  if (!r.surface || r.surface.rtol !== rtol()) {
    r.surface = buildSurface(r.maps, r.photo.rgba, rtol());
    r.surface.rtol = rtol();
  }
  return r.surface;
}

// The 3D view again (a new answer, or new edge options).
function rebuild() {
  const r = state.result;
  if (!r) return;
  const k = Math.ceil(Math.sqrt((r.maps.width * r.maps.height) / VIEW_PIXELS));
  const shown = k > 1 ? buildSurface(...decimate(r.maps, r.photo.rgba, k), rtol()) : fullSurface(r);
  if (state.viewer) {
    const fovY = ((r.meta.fov_y_deg ?? 60) * Math.PI) / 180;
    state.viewer.setSurface(shown, fovY);
    state.viewer.setMarks(markPoints());
  }
  $("view3d").dataset.vertices = shown.count;
  $("view3d").dataset.stride = k;
}

function facts(meta, maps) {
  const valid = maps.mask.reduce((a, b) => a + (b ? 1 : 0), 0);
  const rows = [
    ["size", `${maps.width} × ${maps.height} pixels`],
    ["field of view", `${meta.fov_x_deg?.toFixed(1)}° × ${meta.fov_y_deg?.toFixed(1)}°`],
    ["metric scale", meta.metric_scale?.toFixed(4)],
    ["depth", meta.depth_m?.median != null ? `${meta.depth_m.min.toFixed(2)} … ${meta.depth_m.max.toFixed(2)} m, median ${meta.depth_m.median.toFixed(2)} m` : "no valid pixel"],
    ["valid pixels", `${((100 * valid) / (maps.width * maps.height)).toFixed(1)} %`],
    ["tokens", `${meta.num_tokens} (grid ${meta.grid?.join(" × ")})`],
    ["time", `model ${meta.timing_ms?.device?.toFixed(0)} ms, request ${meta.timing_ms?.total?.toFixed(0)} ms`],
  ];
  if (meta.warning) rows.push(["warning", meta.warning]);
  $("facts").replaceChildren(...rows.flatMap(([k, v]) => {
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = k;
    dd.textContent = v;
    return [dt, dd];
  }));
}

// The marked pixels' points in OpenGL axes, for the 3D view.
function markPoints() {
  const m = state.result?.maps;
  if (!m) return [];
  return state.marks.map(({ x, y }) => {
    const p = 3 * (y * m.width + x);
    return [m.points[p], -m.points[p + 1], -m.points[p + 2]];
  });
}

function pick(event, element) {
  const r = state.result;
  if (!r) return;
  const box = element.getBoundingClientRect();
  const x = Math.min(r.maps.width - 1, Math.max(0, Math.floor(((event.clientX - box.left) / box.width) * r.maps.width)));
  const y = Math.min(r.maps.height - 1, Math.max(0, Math.floor(((event.clientY - box.top) / box.height) * r.maps.height)));
  if (!r.maps.mask[y * r.maps.width + x]) {
    $("measure").textContent = `No surface at pixel (${x}, ${y}) (masked): pick another.`;
    return;
  }
  state.marks = state.marks.length >= 2 ? [{ x, y }] : [...state.marks, { x, y }];
  state.viewer?.setMarks(markPoints());
  measure();
}

// The distance between the two marked pixels' points, in metres.
function measure() {
  const out = $("measure");
  const r = state.result;
  for (const overlay of document.querySelectorAll(".map canvas.marks")) drawMarks(overlay);
  delete out.dataset.distance;
  if (!r || state.marks.length === 0) {
    out.textContent = "Measure: click a first pixel.";
    return;
  }
  const [a, b] = state.marks;
  const at = ({ x, y }) => Array.from(r.maps.points.subarray(3 * (y * r.maps.width + x), 3 * (y * r.maps.width + x) + 3));
  if (!b) {
    const p = at(a);
    out.textContent = `A (${a.x}, ${a.y}) is ${Math.hypot(...p).toFixed(3)} m from the camera; click a second pixel.`;
    return;
  }
  const [p, q] = [at(a), at(b)];
  const d = Math.hypot(p[0] - q[0], p[1] - q[1], p[2] - q[2]);
  out.dataset.distance = String(d);
  out.dataset.a = `${a.x},${a.y}`;
  out.dataset.b = `${b.x},${b.y}`;
  out.textContent = `A (${a.x}, ${a.y}) to B (${b.x}, ${b.y}): ${d.toFixed(3)} m`;
}

function drawMarks(overlay) {
  const r = state.result;
  const box = overlay.getBoundingClientRect();
  const dpr = window.devicePixelRatio || 1;
  [overlay.width, overlay.height] = [Math.max(1, Math.round(box.width * dpr)), Math.max(1, Math.round(box.height * dpr))];
  const ctx = overlay.getContext("2d");
  ctx.clearRect(0, 0, overlay.width, overlay.height);
  if (!r) return;
  const sx = overlay.width / r.maps.width;
  const sy = overlay.height / r.maps.height;
  const centre = ({ x, y }) => [(x + 0.5) * sx, (y + 0.5) * sy];
  ctx.lineWidth = 2 * dpr;
  ctx.strokeStyle = "#ffd91a";
  if (state.marks.length === 2) {
    ctx.beginPath();
    ctx.moveTo(...centre(state.marks[0]));
    ctx.lineTo(...centre(state.marks[1]));
    ctx.stroke();
  }
  for (const m of state.marks) {
    ctx.beginPath();
    ctx.arc(...centre(m), 5 * dpr, 0, 2 * Math.PI);
    ctx.stroke();
  }
}

function stem() {
  const name = state.result?.file.name || "photo";
  return name.replace(/\.[^.]*$/, "") || "photo";
}

async function download(kind) {
  const r = state.result;
  if (!r) return;
  let blob;
  let suffix;
  const version = state.info?.version ?? "";
  try {
    if (kind === "npz") [blob, suffix] = [new Blob([r.buffer], { type: "application/x-npz" }), "npz"];
    else if (kind === "ply") [blob, suffix] = [new Blob([ply(fullSurface(r), version)], { type: "application/octet-stream" }), "ply"];
    else if (kind === "glb") {
      const png = new Uint8Array(await (await new Promise((ok) => r.photo.canvas.toBlob(ok, "image/png"))).arrayBuffer());
      [blob, suffix] = [new Blob([glb(fullSurface(r), png, version)], { type: "model/gltf-binary" }), "glb"];
    } else [blob, suffix] = [await depthPng(r.maps, state.info?.depth_png_scale ?? 0.001), "depth.png"];
  } catch (e) {
    showError(`${kind}: ${e.message}`);
    return;
  }
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `${stem()}.${suffix}`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 60_000);
}

function wire() {
  const drop = $("drop");
  $("file").addEventListener("change", (e) => {
    choose(e.target.files[0]);
    // So that picking the same file again runs it again.
    e.target.value = "";
  });
  drop.addEventListener("keydown", (e) => {
    if (e.key === "Enter" || e.key === " ") $("file").click();
  });
  drop.addEventListener("dragover", (e) => {
    e.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    choose(e.dataTransfer.files[0]);
  });
  document.addEventListener("paste", (e) => {
    const file = [...(e.clipboardData?.files ?? [])].find((f) => f.type.startsWith("image/"));
    if (file) choose(file);
  });
  $("run").addEventListener("click", run);
  for (const id of ["remove-edges", "edge-rtol"]) $(id).addEventListener("change", rebuild);
  for (const radio of document.querySelectorAll("input[name=mode]")) radio.addEventListener("change", (e) => state.viewer?.setMode(e.target.value));
  $("reset-view").addEventListener("click", () => state.viewer?.reset());
  for (const map of document.querySelectorAll(".map")) map.addEventListener("click", (e) => pick(e, map));
  for (const b of document.querySelectorAll("[data-download]")) b.addEventListener("click", () => download(b.dataset.download));
  window.addEventListener("resize", () => measure());
}

wire();
loadInfo();
