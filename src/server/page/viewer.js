// The 3D view: the surface as a coloured mesh or as points, in WebGL 2, orbited with the mouse
// (drag: turn, right-drag or shift-drag: move, wheel: nearer / farther, double-click: the photo's
// own view again) or one finger and two. It starts where the photo was taken, with its field of
// view, so that the first picture is the photo itself.

const VERTEX = `#version 300 es
in vec3 position;
in vec3 color;
uniform mat4 mvp;
uniform float pointSize;
out vec3 vColor;
void main() {
  gl_Position = mvp * vec4(position, 1.0);
  gl_PointSize = pointSize;
  vColor = color;
}`;

const FRAGMENT = `#version 300 es
precision mediump float;
in vec3 vColor;
uniform vec4 tint;
out vec4 outColor;
void main() {
  outColor = tint.a > 0.0 ? tint : vec4(vColor, 1.0);
}`;

function perspective(fovY, aspect, near, far) {
  const t = 1 / Math.tan(fovY / 2);
  const m = new Float32Array(16);
  m[0] = t / aspect;
  m[5] = t;
  m[10] = (far + near) / (near - far);
  m[11] = -1;
  m[14] = (2 * far * near) / (near - far);
  return m;
}

function sub(a, b) { return [a[0] - b[0], a[1] - b[1], a[2] - b[2]]; }
function cross(a, b) { return [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]; }
function normalize(a) { const n = Math.hypot(...a) || 1; return a.map((v) => v / n); }
function dot(a, b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }

function lookAt(eye, target, up) {
  const z = normalize(sub(eye, target));
  const x = normalize(cross(up, z));
  const y = cross(z, x);
  return new Float32Array([x[0], y[0], z[0], 0, x[1], y[1], z[1], 0, x[2], y[2], z[2], 0, -dot(x, eye), -dot(y, eye), -dot(z, eye), 1]);
}

function multiply(a, b) {
  const m = new Float32Array(16);
  for (let c = 0; c < 4; c++) for (let r = 0; r < 4; r++) {
    let s = 0;
    for (let k = 0; k < 4; k++) s += a[k * 4 + r] * b[c * 4 + k];
    m[c * 4 + r] = s;
  }
  return m;
}

export class Viewer {
  constructor(canvas) {
    this.canvas = canvas;
    const gl = canvas.getContext("webgl2", { antialias: true, preserveDrawingBuffer: true });
    if (!gl) throw new Error("this browser has no WebGL 2: the 3D view cannot be drawn (the maps and downloads still work)");
    this.gl = gl;
    const shader = (type, src) => {
      const s = gl.createShader(type);
      gl.shaderSource(s, src);
      gl.compileShader(s);
      if (!gl.getShaderParameter(s, gl.COMPILE_STATUS)) throw new Error(`WebGL: ${gl.getShaderInfoLog(s)}`);
      return s;
    };
    const p = gl.createProgram();
    gl.attachShader(p, shader(gl.VERTEX_SHADER, VERTEX));
    gl.attachShader(p, shader(gl.FRAGMENT_SHADER, FRAGMENT));
    gl.linkProgram(p);
    if (!gl.getProgramParameter(p, gl.LINK_STATUS)) throw new Error(`WebGL: ${gl.getProgramInfoLog(p)}`);
    this.program = p;
    this.loc = {
      position: gl.getAttribLocation(p, "position"),
      color: gl.getAttribLocation(p, "color"),
      mvp: gl.getUniformLocation(p, "mvp"),
      pointSize: gl.getUniformLocation(p, "pointSize"),
      tint: gl.getUniformLocation(p, "tint"),
    };
    this.mode = "mesh";
    this.count = 0;
    this.marks = [];
    this.frame = 0;
    this.controls();
    new ResizeObserver(() => this.draw()).observe(canvas);
  }

  // The surface (surface.js) seen from the photo's camera, fovY in radians.
  setSurface(s, fovY) {
    const gl = this.gl;
    if (!this.vao) {
      this.vao = gl.createVertexArray();
      this.buffers = { position: gl.createBuffer(), color: gl.createBuffer(), index: gl.createBuffer() };
    }
    gl.bindVertexArray(this.vao);
    gl.bindBuffer(gl.ARRAY_BUFFER, this.buffers.position);
    gl.bufferData(gl.ARRAY_BUFFER, s.positions, gl.STATIC_DRAW);
    gl.enableVertexAttribArray(this.loc.position);
    gl.vertexAttribPointer(this.loc.position, 3, gl.FLOAT, false, 0, 0);
    gl.bindBuffer(gl.ARRAY_BUFFER, this.buffers.color);
    gl.bufferData(gl.ARRAY_BUFFER, s.colors, gl.STATIC_DRAW);
    gl.enableVertexAttribArray(this.loc.color);
    gl.vertexAttribPointer(this.loc.color, 3, gl.UNSIGNED_BYTE, true, 0, 0);
    gl.bindBuffer(gl.ELEMENT_ARRAY_BUFFER, this.buffers.index);
    gl.bufferData(gl.ELEMENT_ARRAY_BUFFER, s.triangles, gl.STATIC_DRAW);
    gl.bindVertexArray(null);
    this.count = s.count;
    this.indices = s.triangles.length;
    // Orbit about the median depth straight ahead: the photo's centre of interest.
    const z = Float32Array.from({ length: s.count }, (_, i) => -s.positions[3 * i + 2]).sort();
    const depth = s.count ? z[z.length >> 1] : 1;
    this.home = { target: [0, 0, -depth], distance: depth, yaw: 0, pitch: 0, fovY };
    this.reset();
  }

  reset() {
    if (!this.home) return;
    const h = this.home;
    Object.assign(this, { target: [...h.target], distance: h.distance, yaw: h.yaw, pitch: h.pitch, fovY: h.fovY });
    this.draw();
  }

  setMode(mode) {
    this.mode = mode;
    this.draw();
  }

  // Two marked points (OpenGL axes) joined by a line, drawn over the surface.
  setMarks(points) {
    const gl = this.gl;
    this.marks = points;
    if (!this.markVao) {
      this.markVao = gl.createVertexArray();
      this.markBuffer = gl.createBuffer();
    }
    gl.bindVertexArray(this.markVao);
    gl.bindBuffer(gl.ARRAY_BUFFER, this.markBuffer);
    gl.bufferData(gl.ARRAY_BUFFER, new Float32Array(points.flat()), gl.DYNAMIC_DRAW);
    gl.enableVertexAttribArray(this.loc.position);
    gl.vertexAttribPointer(this.loc.position, 3, gl.FLOAT, false, 0, 0);
    gl.disableVertexAttribArray(this.loc.color);
    gl.bindVertexArray(null);
    this.draw();
  }

  eye() {
    const { yaw, pitch, distance: r, target: t } = this;
    return [t[0] + r * Math.cos(pitch) * Math.sin(yaw), t[1] + r * Math.sin(pitch), t[2] + r * Math.cos(pitch) * Math.cos(yaw)];
  }

  draw() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.render();
    });
  }

  render() {
    const gl = this.gl;
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const [w, h] = [Math.max(1, Math.round(c.clientWidth * dpr)), Math.max(1, Math.round(c.clientHeight * dpr))];
    if (c.width !== w || c.height !== h) [c.width, c.height] = [w, h];
    gl.viewport(0, 0, w, h);
    gl.clearColor(0.11, 0.12, 0.14, 1);
    gl.clear(gl.COLOR_BUFFER_BIT | gl.DEPTH_BUFFER_BIT);
    if (!this.count || !this.home) return;
    const near = Math.max(this.distance * 1e-3, 1e-4);
    const mvp = multiply(perspective(this.fovY, w / h, near, this.distance * 1e3 + 10 * this.home.distance), lookAt(this.eye(), this.target, [0, 1, 0]));
    gl.useProgram(this.program);
    gl.uniformMatrix4fv(this.loc.mvp, false, mvp);
    gl.uniform1f(this.loc.pointSize, 2 * dpr);
    gl.uniform4f(this.loc.tint, 0, 0, 0, 0);
    gl.enable(gl.DEPTH_TEST);
    gl.bindVertexArray(this.vao);
    if (this.mode === "mesh" && this.indices) gl.drawElements(gl.TRIANGLES, this.indices, gl.UNSIGNED_INT, 0);
    else gl.drawArrays(gl.POINTS, 0, this.count);
    if (this.marks.length) {
      gl.disable(gl.DEPTH_TEST);
      gl.bindVertexArray(this.markVao);
      gl.vertexAttrib3f(this.loc.color, 1, 1, 1);
      gl.uniform4f(this.loc.tint, 1.0, 0.85, 0.1, 1);
      gl.uniform1f(this.loc.pointSize, 9 * dpr);
      gl.drawArrays(gl.POINTS, 0, this.marks.length);
      if (this.marks.length === 2) gl.drawArrays(gl.LINES, 0, 2);
    }
    gl.bindVertexArray(null);
  }

  controls() {
    const c = this.canvas;
    const pointers = new Map();
    let pinch = 0;
    c.addEventListener("contextmenu", (e) => e.preventDefault());
    c.addEventListener("pointerdown", (e) => {
      c.setPointerCapture(e.pointerId);
      pointers.set(e.pointerId, { x: e.clientX, y: e.clientY, pan: e.button === 2 || e.shiftKey });
      if (pointers.size === 2) {
        const [a, b] = [...pointers.values()];
        pinch = Math.hypot(a.x - b.x, a.y - b.y);
      }
    });
    const end = (e) => pointers.delete(e.pointerId);
    c.addEventListener("pointerup", end);
    c.addEventListener("pointercancel", end);
    c.addEventListener("pointermove", (e) => {
      const p = pointers.get(e.pointerId);
      if (!p || !this.home) return;
      const [dx, dy] = [e.clientX - p.x, e.clientY - p.y];
      [p.x, p.y] = [e.clientX, e.clientY];
      if (pointers.size === 2) {
        const [a, b] = [...pointers.values()];
        const d = Math.hypot(a.x - b.x, a.y - b.y);
        if (pinch > 0 && d > 0) this.distance *= pinch / d;
        pinch = d;
      } else if (p.pan) {
        // Move the target in the view plane, by as much as the surface under the cursor moves.
        const scale = (2 * this.distance * Math.tan(this.fovY / 2)) / c.clientHeight;
        const eye = this.eye();
        const fwd = normalize(sub(this.target, eye));
        const right = normalize(cross(fwd, [0, 1, 0]));
        const up = cross(right, fwd);
        for (let k = 0; k < 3; k++) this.target[k] += (-dx * right[k] + dy * up[k]) * scale;
      } else {
        this.yaw -= dx * 0.006;
        this.pitch = Math.max(-1.55, Math.min(1.55, this.pitch + dy * 0.006));
      }
      this.draw();
    });
    c.addEventListener("wheel", (e) => {
      e.preventDefault();
      this.distance *= Math.exp(Math.max(-100, Math.min(100, e.deltaY)) * 0.002);
      this.draw();
    }, { passive: false });
    c.addEventListener("dblclick", () => this.reset());
  }
}
