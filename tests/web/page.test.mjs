// The page of `moge serve` (GET /) in a real browser: Debian's Chromium, headless, driven by
// playwright-core, against a `moge serve` on loopback with the tiny fixture. What the page shows
// and writes is checked against what the server and `moge predict` give for the same photo.
//
// MOGE_BIN: the moge binary (default target/debug/moge); CHROMIUM: the browser (default
// /usr/bin/chromium); MOGE_WEB_SHOTS: where the screenshots go (default target/web-test).
// Run by scripts/test-web.sh.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { decodePng } from "./png.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const bin = path.resolve(root, process.env.MOGE_BIN ?? "target/debug/moge");
const weights = path.join(root, "tests/fixtures/tiny_normal.pt");
const photo = path.join(root, "tests/fixtures/images/rgb_64x48.png");
const shots = path.resolve(root, process.env.MOGE_WEB_SHOTS ?? "target/web-test");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "moge-web-"));
// The page's request, for the answers the test asks for itself.
const pageQuery = "npz_normal_dtype=float32&fit=exact&apply_mask=true";

let server;
let url;
let browser;
let page;
const pageErrors = [];

function startServer() {
  // f32, as `moge predict --precision f32` below: the same numbers bit for bit.
  const child = spawn(bin, ["serve", "--weights", weights, "--precision", "f32", "--host", "127.0.0.1", "--port", "0", "--max-body-mb", "1", "--queue", "4"], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`moge serve printed no address in 60 s: ${stderr}`)), 60_000);
    child.stdout.on("data", (d) => {
      const m = /listening on (http:\/\/\S+)/.exec(String(d));
      if (m) {
        clearTimeout(timer);
        resolve([child, m[1]]);
      }
    });
    child.on("exit", (code) => reject(new Error(`moge serve exited with ${code}: ${stderr}`)));
  });
}

async function post(query, body) {
  const r = await fetch(`${url}/predict?${query}`, { method: "POST", body, headers: { "content-type": "image/png" }, signal: AbortSignal.timeout(60_000) });
  assert.equal(r.status, 200, `POST /predict?${query}: ${r.status}`);
  return r;
}

async function frames() {
  await page.evaluate(() => new Promise((ok) => requestAnimationFrame(() => requestAnimationFrame(ok))));
}

// How many pixels of the 3D canvas differ from its clear colour, and a digest of them all.
async function canvas3d() {
  return page.evaluate(() => {
    const c = document.getElementById("view3d");
    const t = document.createElement("canvas");
    [t.width, t.height] = [c.width, c.height];
    const x = t.getContext("2d");
    x.drawImage(c, 0, 0);
    const d = x.getImageData(0, 0, t.width, t.height).data;
    let drawn = 0;
    let digest = 0;
    for (let i = 0; i < d.length; i += 4) {
      if (Math.abs(d[i] - 28) + Math.abs(d[i + 1] - 31) + Math.abs(d[i + 2] - 36) > 24) drawn++;
      digest = (digest * 31 + d[i] + 7 * d[i + 1] + 13 * d[i + 2]) >>> 0;
    }
    return { drawn, total: d.length / 4, digest };
  });
}

// A left-button drag across the 3D view from its centre, by (dx, dy) pixels.
async function drag(dx, dy, steps) {
  const box = await page.locator("#view3d").boundingBox();
  const [x, y] = [box.x + box.width / 2, box.y + box.height / 2];
  await page.mouse.move(x, y);
  await page.mouse.down();
  await page.mouse.move(x + dx, y + dy, { steps });
  await page.mouse.up();
  await frames();
}

async function waitDone() {
  await page.waitForFunction(() => /^Done/.test(document.getElementById("status").textContent) || !document.getElementById("error").hidden, null, { timeout: 60_000 });
  const error = await page.locator("#error").textContent();
  assert.ok(await page.locator("#error").isHidden(), `the page shows an error: ${error}`);
  await frames();
}

async function download(kind) {
  const [d] = await Promise.all([page.waitForEvent("download", { timeout: 30_000 }), page.click(`[data-download=${kind}]`)]);
  const file = path.join(tmp, `page-${d.suggestedFilename()}`);
  await d.saveAs(file);
  return { name: d.suggestedFilename(), bytes: fs.readFileSync(file) };
}

function glbParts(buf) {
  assert.equal(buf.readUInt32LE(0), 0x46546c67, "glb magic");
  assert.equal(buf.readUInt32LE(8), buf.length, "glb length");
  const jsonLen = buf.readUInt32LE(12);
  const doc = JSON.parse(buf.toString("utf8", 20, 20 + jsonLen));
  const bin = buf.subarray(28 + jsonLen);
  const view = (i) => {
    const v = doc.bufferViews[i];
    return bin.subarray(v.byteOffset, v.byteOffset + v.byteLength);
  };
  return { doc, view };
}

before(async () => {
  fs.mkdirSync(shots, { recursive: true });
  execFileSync(bin, ["predict", photo, "--weights", weights, "--precision", "f32", "-o", path.join(tmp, "cli"), "--format", "npz,ply,glb,png,vis"], { stdio: "pipe", timeout: 120_000 });
  [server, url] = await startServer();
  // A fresh profile of the test's own: nothing from another run or from a user's browser.
  browser = await chromium.launchPersistentContext(path.join(tmp, "profile"), {
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"],
    timeout: 60_000,
    viewport: { width: 1280, height: 900 },
    acceptDownloads: true,
  });
  page = browser.pages()[0] ?? (await browser.newPage());
  page.setDefaultTimeout(30_000);
  page.on("pageerror", (e) => pageErrors.push(e.message));
  await page.goto(`${url}/`);
  await page.waitForFunction(() => document.getElementById("model").textContent.includes("·"));
}, { timeout: 240_000 });

after(async () => {
  await browser?.close();
  assert.deepEqual(pageErrors, [], "the page threw");
  if (server && server.exitCode === null) {
    server.kill("SIGTERM");
    await new Promise((ok) => {
      const t = setTimeout(() => {
        server.kill("SIGKILL");
        ok();
      }, 10_000);
      server.on("exit", () => {
        clearTimeout(t);
        ok();
      });
    });
  }
  fs.rmSync(tmp, { recursive: true, force: true });
});

test("a photo picked in the page is run, and its maps drawn as `moge predict --format vis` draws them", { timeout: 120_000 }, async () => {
  await page.setInputFiles("#file", photo);
  await waitDone();
  assert.match(await page.locator("#facts").textContent(), /64 × 48 pixels/);
  // The depth and normal pictures, pixel for pixel the command's.
  for (const [id, file] of [["depth-map", "rgb_64x48.depth_vis.png"], ["normal-map", "rgb_64x48.normal_vis.png"]]) {
    const want = decodePng(fs.readFileSync(path.join(tmp, "cli", file)));
    const got = await page.evaluate((id) => {
      const c = document.getElementById(id);
      return Array.from(c.getContext("2d").getImageData(0, 0, c.width, c.height).data);
    }, id);
    assert.equal(got.length, want.width * want.height * 4, id);
    let differ = 0;
    const colours = new Set();
    for (let i = 0; i < want.width * want.height; i++) {
      for (let k = 0; k < 3; k++) differ += got[4 * i + k] !== want.samples[3 * i + k];
      colours.add(got.slice(4 * i, 4 * i + 3).join());
    }
    assert.equal(differ, 0, `${id}: ${differ} samples differ from ${file}`);
    assert.ok(colours.size > 20, `${id} is nearly blank (${colours.size} colours)`);
  }
});

test("the 3D view draws the surface, and turns with the mouse", { timeout: 120_000 }, async () => {
  const vertices = Number(await page.locator("#view3d").getAttribute("data-vertices"));
  assert.ok(vertices > 100, `${vertices} vertices`);
  const first = await canvas3d();
  assert.ok(first.drawn > first.total * 0.05, `only ${first.drawn} of ${first.total} pixels drawn`);
  await drag(160, 60, 8);
  const turned = await canvas3d();
  assert.notEqual(turned.digest, first.digest, "dragging did not change the view");
  assert.ok(turned.drawn > turned.total * 0.02, `after turning, only ${turned.drawn} pixels drawn`);
  await page.screenshot({ path: path.join(shots, "page-turned.png"), fullPage: true });
  await page.check("input[name=mode][value=points]");
  await frames();
  const points = await canvas3d();
  assert.ok(points.drawn > 0 && points.digest !== turned.digest, "the points mode draws something else");
  await page.check("input[name=mode][value=mesh]");
  await page.dblclick("#view3d");
  await frames();
  assert.equal((await canvas3d()).digest, first.digest, "double-click returns to the photo's view");
});

test("two clicked pixels give the distance between their points in the server's answer", { timeout: 120_000 }, async () => {
  // The same photo as JSON lists, read without the page's npz reader.
  const json = await (await post(`output_format=json&${pageQuery}`, fs.readFileSync(photo))).json();
  const { points, mask } = json.outputs;
  const valid = [];
  mask.forEach((row, y) => row.forEach((m, x) => m && valid.push([x, y])));
  assert.ok(valid.length > 10);
  const [a, b] = [valid[0], valid[valid.length - 1]];
  const box = await page.locator("#photo-map").boundingBox();
  const at = ([x, y]) => [box.x + ((x + 0.5) / 64) * box.width, box.y + ((y + 0.5) / 48) * box.height];
  await page.mouse.click(...at(a));
  await page.mouse.click(...at(b));
  const m = page.locator("#measure");
  assert.equal(await m.getAttribute("data-a"), a.join());
  assert.equal(await m.getAttribute("data-b"), b.join());
  const [p, q] = [points[a[1]][a[0]], points[b[1]][b[0]]];
  const want = Math.hypot(p[0] - q[0], p[1] - q[1], p[2] - q[2]);
  const got = Number(await m.getAttribute("data-distance"));
  assert.ok(Math.abs(got - want) <= 1e-6 * want, `measured ${got}, the points give ${want}`);
  assert.match(await m.textContent(), new RegExp(`${want.toFixed(3)} m`));
  // Turned a little, for the picture of the page (README.md shows it).
  await drag(70, 25, 5);
  await page.screenshot({ path: path.join(shots, "page.png"), fullPage: true });
});

test("the npz download is /predict's npz; ply, glb and depth png are `moge predict`'s", { timeout: 120_000 }, async () => {
  const npz = await download("npz");
  assert.equal(npz.name, "rgb_64x48.npz");
  const served = Buffer.from(await (await post(`output_format=npz_binary&${pageQuery}`, fs.readFileSync(photo))).arrayBuffer());
  assert.ok(npz.bytes.equals(served), "the npz differs from POST /predict's");

  const ply = await download("ply");
  const cliPly = fs.readFileSync(path.join(tmp, "cli", "rgb_64x48.ply"));
  assert.ok(ply.bytes.length > 1000 && ply.bytes.equals(cliPly), `the ply differs from moge predict's (${ply.bytes.length} vs ${cliPly.length} bytes)`);

  const glb = glbParts((await download("glb")).bytes);
  const cli = glbParts(fs.readFileSync(path.join(tmp, "cli", "rgb_64x48.glb")));
  const prim = (g) => g.doc.meshes[0].primitives[0];
  assert.deepEqual(glb.doc.accessors, cli.doc.accessors);
  assert.deepEqual(glb.doc.materials, cli.doc.materials);
  for (const key of ["POSITION", "NORMAL", "TEXCOORD_0"]) {
    const i = prim(glb).attributes[key];
    assert.equal(i, prim(cli).attributes[key], key);
    assert.ok(glb.view(glb.doc.accessors[i].bufferView).equals(cli.view(cli.doc.accessors[i].bufferView)), `glb ${key} differs`);
  }
  const idx = prim(glb).indices;
  assert.ok(glb.view(glb.doc.accessors[idx].bufferView).equals(cli.view(cli.doc.accessors[idx].bufferView)), "glb indices differ");
  // The texture: the photo's pixels in both (the browser's PNG is RGBA).
  const tex = (g) => decodePng(Buffer.from(g.view(g.doc.images[0].bufferView)));
  const [t1, t2] = [tex(glb), tex(cli)];
  assert.deepEqual([t1.width, t1.height], [64, 48]);
  for (let i = 0; i < 64 * 48; i++) for (let k = 0; k < 3; k++) assert.equal(t1.samples[t1.channels * i + k], t2.samples[t2.channels * i + k], `texel ${i}`);

  const depth = decodePng((await download("depth")).bytes);
  const cliDepth = decodePng(fs.readFileSync(path.join(tmp, "cli", "rgb_64x48.depth.png")));
  assert.deepEqual([depth.width, depth.height, depth.channels, depth.depth], [64, 48, 1, 16]);
  assert.deepEqual(Array.from(depth.samples), Array.from(cliDepth.samples));
  assert.ok(depth.samples.some((v) => v > 0) && depth.samples.some((v) => v === 0), "the depth png is all valid or all invalid");
});

test("a photo dropped or pasted is run too", { timeout: 120_000 }, async () => {
  for (const how of ["drop", "paste"]) {
    await page.evaluate(() => (document.getElementById("status").textContent = ""));
    const b64 = fs.readFileSync(photo).toString("base64");
    await page.evaluate(({ how, b64 }) => {
      const file = new File([Uint8Array.from(atob(b64), (c) => c.charCodeAt(0))], `${how}.png`, { type: "image/png" });
      const dt = new DataTransfer();
      dt.items.add(file);
      if (how === "drop") document.getElementById("drop").dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
      else document.dispatchEvent(new ClipboardEvent("paste", { clipboardData: dt, bubbles: true }));
    }, { how, b64 });
    await waitDone();
    assert.equal(await page.locator("#drop-text").textContent(), `${how}.png`);
  }
});

test("a large photo is drawn from every other pixel, and downloaded whole", { timeout: 180_000 }, async () => {
  // 1600 x 1200, made by the browser as a JPEG (a phone photo's kind of file).
  await page.evaluate(async () => {
    document.getElementById("status").textContent = "";
    const c = new OffscreenCanvas(1600, 1200);
    const g = c.getContext("2d");
    const grad = g.createLinearGradient(0, 0, 1600, 1200);
    grad.addColorStop(0, "#3a6"); grad.addColorStop(0.5, "#ca4"); grad.addColorStop(1, "#46c");
    g.fillStyle = grad;
    g.fillRect(0, 0, 1600, 1200);
    g.fillStyle = "#222";
    g.fillRect(500, 300, 400, 600);
    const blob = await c.convertToBlob({ type: "image/jpeg", quality: 0.9 });
    const dt = new DataTransfer();
    dt.items.add(new File([blob], "large.jpg", { type: "image/jpeg" }));
    document.getElementById("drop").dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
  });
  await waitDone();
  assert.match(await page.locator("#facts").textContent(), /1600 × 1200 pixels/);
  const view = page.locator("#view3d");
  assert.equal(await view.getAttribute("data-stride"), "2");
  const shown = Number(await view.getAttribute("data-vertices"));
  assert.ok(shown > 1000 && shown <= 800 * 600, `${shown} vertices drawn`);
  const drawn = await canvas3d();
  assert.ok(drawn.drawn > drawn.total * 0.05, `only ${drawn.drawn} of ${drawn.total} pixels drawn`);
  const ply = await download("ply");
  assert.equal(ply.name, "large.ply");
  const header = ply.bytes.subarray(0, 400).toString("latin1");
  const vertices = Number(/element vertex (\d+)/.exec(header)[1]);
  assert.ok(vertices > 2 * shown, `the ply has ${vertices} vertices, the view ${shown}`);
});

test("a damaged photo, a non-photo, a too-large photo and a busy server are told in the page", { timeout: 120_000 }, async () => {
  const cut = path.join(tmp, "cut.jpg");
  const jpeg = fs.readFileSync(path.join(root, "tests/fixtures/images/exif_f35_26mm_80x60.jpg"));
  fs.writeFileSync(cut, jpeg.subarray(0, jpeg.length >> 1));
  const text = path.join(tmp, "notes.png");
  fs.writeFileSync(text, "these are notes, not a photo\n");
  const big = path.join(tmp, "big.png");
  fs.writeFileSync(big, Buffer.concat([fs.readFileSync(photo), Buffer.alloc(1_200_000)]));
  const shown = async (file) => {
    await page.setInputFiles("#file", file);
    await page.waitForFunction(() => !document.getElementById("error").hidden, null, { timeout: 60_000 });
    return page.locator("#error").textContent();
  };
  assert.match(await shown(cut), /^cut\.jpg: image: .*(cut short|truncat|end of|EOF|incomplete)/i);
  await page.screenshot({ path: path.join(shots, "page-error.png"), fullPage: true });
  assert.match(await shown(text), /^notes\.png: image: /);
  assert.match(await shown(big), /^big\.png: 1\.2 MB, over this server's limit of 1\.0 MB/);
  // A busy server: the server's four slots (--queue 4) held by requests whose bodies have not
  // arrived, so that the page's is the fifth; its 503 is shown in the page.
  const { port, hostname } = new URL(url);
  const held = await Promise.all([0, 1, 2, 3].map(() => new Promise((ok, fail) => {
    const socket = net.connect(Number(port), hostname, () => {
      socket.write("POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 100000\r\n\r\n\x89PNG");
      ok(socket);
    });
    socket.on("error", fail);
  })));
  // Each is admitted once the server has read its head: until then a fifth could get in.
  const t0 = Date.now();
  while (Date.now() - t0 < 10_000) {
    const metrics = await (await fetch(`${url}/metrics`)).text();
    if (/^moge_requests_in_progress 4$/m.test(metrics)) break;
    await new Promise((ok) => setTimeout(ok, 50));
  }
  assert.match(await shown(photo), /^rgb_64x48\.png: The server is busy: busy: 4 requests in progress/);
  for (const socket of held) socket.destroy();
  // Once the server takes it again, Run runs the same photo.
  await page.click("#run");
  await waitDone();
});
