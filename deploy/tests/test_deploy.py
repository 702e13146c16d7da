"""deploy/ checked as far as a machine without Kubernetes, Slurm or Docker allows.

The manifests against a JSON Schema of the Kubernetes fields they use; the Deployment's
container arguments run as `moge serve` and its probes asked; the indexed Job's arguments run
once per completion index, as Kubernetes would, against a real `moge serve`; the Slurm script
run once per array task with the variables Slurm sets; the Dockerfile read for its stages.
Servers listen on 127.0.0.1 only, are started here, and are stopped at the end of each test.

MOGE_BIN names the moge binary (default: target/ci/moge).
"""

import json
import os
import pathlib
import queue
import re
import signal
import subprocess
import threading
import tomllib
import urllib.error
import urllib.request

import jsonschema
import pytest
import yaml
from PIL import Image

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MOGE = os.environ.get("MOGE_BIN") or str(ROOT / "target" / "ci" / "moge")
WEIGHTS = str(ROOT / "tests" / "fixtures" / "tiny_normal.pt")
# What a test's model flags become: the fixture checkpoint instead of a download.
LOCAL_MODEL = ["--weights", WEIGHTS, "--precision", "f32"]


def manifests(name):
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))


def validator():
    schema = json.loads((DEPLOY / "tests" / "kubernetes.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def container(obj):
    (c,) = obj["spec"]["template"]["spec"]["containers"]
    return c


def flag(args, name):
    return args[args.index(name) + 1]


def replace_flag(args, name, value):
    args = list(args)
    args[args.index(name) + 1] = value
    return args


def with_local_model(args):
    """`args` with `--model NAME` (a download) replaced by the fixture checkpoint."""
    args = list(args)
    if "--model" in args:
        i = args.index("--model")
        del args[i : i + 2]
    return args + LOCAL_MODEL


def photos(root, n):
    """`n` small PNGs in two folders under `root`."""
    paths = []
    for i in range(n):
        p = root / f"set{i % 2}" / f"p{i:02}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40 + 4 * (i % 3), 30), (i * 20 % 256, 90, 160)).save(p)
        paths.append(str(p))
    return sorted(paths)


class Serve:
    """`moge serve ARGS` until its ready line (at most 60 s); killed on exit."""

    def __init__(self, args):
        self.proc = subprocess.Popen([MOGE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(l) for l in self.proc.stdout], daemon=True).start()
        try:
            line = lines.get(timeout=60)
        except queue.Empty:
            self.proc.kill()
            raise AssertionError(f"no ready line from moge serve: {self.proc.stderr.read()}")
        assert line.startswith("moge: listening on "), line
        self.url = line.split("listening on ", 1)[1].strip()

    def get(self, path):
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        return self.proc.returncode, err

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=30)


def test_every_manifest_matches_the_schema_of_the_fields_it_uses():
    v = validator()
    kinds = []
    for f in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(doc)]
            assert not errors, f"{f.name}: {errors}"
            kinds.append(doc["kind"])
    assert sorted(kinds) == ["Deployment", "Job", "Service"]


def test_the_schema_refuses_a_misspelt_field_and_a_wrong_type():
    v = validator()
    deployment = manifests("moge-serve.yaml")[0]
    assert v.is_valid(deployment)
    c = container(deployment)
    c["readinesProbe"] = c.pop("readinessProbe")
    assert not v.is_valid(deployment)
    deployment = manifests("moge-serve.yaml")[0]
    deployment["spec"]["replicas"] = "2"
    assert not v.is_valid(deployment)
    job = manifests("moge-batch-job.yaml")[0]
    job["spec"]["completionMode"] = "indexed"
    assert not v.is_valid(job)


def test_the_deployment_probes_what_moge_serve_answers():
    deployment, service = manifests("moge-serve.yaml")
    c = container(deployment)
    args = c["args"]
    assert args[0] == "serve"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert flag(args, "--port") == str(ports["http"])
    assert flag(args, "--host") == "0.0.0.0", "a pod must listen beyond its loopback"
    # The Service reaches the pods the Deployment makes, on the port they listen on.
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert all(p["targetPort"] in ("http", ports["http"]) for p in service["spec"]["ports"])
    probes = {k: c[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert all(p["port"] in ("http", ports["http"]) for p in probes.values())
    assert probes["readinessProbe"]["path"] == "/health"

    # The container's own arguments, on this machine: loopback, a free port, the fixture model.
    run = with_local_model(replace_flag(replace_flag(args, "--host", "127.0.0.1"), "--port", "0"))
    with Serve(run) as s:
        for kind, probe in probes.items():
            status, body = s.get(probe["path"])
            assert status == 200, f"{kind} {probe['path']}: {status} {body!r}"
        status, metrics = s.get("/metrics")
        assert status == 200 and b"moge_ready 1" in metrics
        code, err = s.stop()
    assert code == 0, err
    assert "warmed up" in err, err


def test_the_indexed_job_puts_every_photo_in_exactly_one_completion(tmp_path):
    (job,) = manifests("moge-batch-job.yaml")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    n = spec["completions"]
    c = container(job)
    (mount,) = c["volumeMounts"]
    args = c["args"]
    assert args[0] == "batch" and flag(args, "--shard") in ("auto", f"auto/{n}")
    assert "--skip-existing" in args, "a restarted pod must not redo its shard"
    data = tmp_path / "data"
    all_photos = photos(data / "photos", 14)
    # The volume's path is this test's folder.
    local = [a.replace(mount["mountPath"], str(data), 1) if a.startswith(mount["mountPath"]) else a for a in args]
    with Serve(["serve", "--port", "0", *LOCAL_MODEL]) as s:
        local = replace_flag(local, "--server", s.url)
        done = []
        for index in range(n):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JOB_COMPLETION"))}
            env["JOB_COMPLETION_INDEX"] = str(index)
            r = subprocess.run([MOGE, *local], env=env, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            lines = [json.loads(l) for l in r.stdout.splitlines()]
            assert all(l["status"] == "ok" for l in lines), lines
            done += [l["input"] for l in lines]
        # A pod started again finds its shard done.
        env["JOB_COMPLETION_INDEX"] = "0"
        again = subprocess.run([MOGE, *local], env=env, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        assert {json.loads(l)["status"] for l in again.stdout.splitlines()} == {"skipped"}
        s.stop()
    assert sorted(done) == all_photos
    assert len(list((data / "out").rglob("*.npz"))) == len(all_photos)


def test_the_slurm_script_puts_every_photo_in_exactly_one_array_task(tmp_path):
    script = DEPLOY / "slurm" / "moge-array.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    first, last = map(int, re.search(r"^#SBATCH --array=(\d+)-(\d+)$", text, re.M).groups())
    all_photos = photos(tmp_path / "photos", 20)
    out = tmp_path / "out"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JOB_COMPLETION"))}
    base.update(PHOTOS=str(tmp_path / "photos"), OUT=str(out), MOGE=MOGE, MOGE_ARGS=" ".join([*LOCAL_MODEL, "--format", "npz"]))
    for task in range(first, last + 1):
        # What Slurm sets in the environment of an array task.
        env = dict(
            base,
            SLURM_JOB_ID=str(1000 + task),
            SLURM_ARRAY_JOB_ID="1000",
            SLURM_ARRAY_TASK_ID=str(task),
            SLURM_ARRAY_TASK_MIN=str(first),
            SLURM_ARRAY_TASK_MAX=str(last),
            SLURM_ARRAY_TASK_COUNT=str(last - first + 1),
        )
        r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    done = []
    for log in sorted((out / "logs").glob("shard-*.jsonl")):
        done += [json.loads(l)["input"] for l in log.read_text().splitlines()]
    assert len(list((out / "logs").glob("shard-*.jsonl"))) == last - first + 1
    assert sorted(done) == all_photos
    # Outside an array task it says what is missing.
    r = subprocess.run(["bash", str(script)], env=base, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "SLURM_ARRAY_TASK_ID" in r.stderr, r.stderr


def dockerfile_instructions():
    """(instruction, arguments) of deploy/Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_dockerfile_builds_the_release_binary_and_ships_only_it():
    ins = dockerfile_instructions()
    stages = [i for i, (w, _) in enumerate(ins) if w == "FROM"]
    assert len(stages) == 2, ins
    build, runtime = ins[stages[0] : stages[1]], ins[stages[1] :]
    name = build[0][1].split()[-1]
    assert re.fullmatch(r"\S+ AS \S+", build[0][1], re.I), build[0]
    assert any(w == "RUN" and "cargo build --release --locked" in a for w, a in build)
    # Everything cargo needs to read the workspace is copied into the build stage.
    copied = [a.split()[:-1] for w, a in build if w == "COPY"]
    copied = {p for srcs in copied for p in srcs}
    for p in copied:
        assert (ROOT / p).exists(), f"COPY {p}: not in the repository"
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())
    needed = [m for m in cargo["workspace"]["members"] if m != "."] + [t["path"] for t in cargo.get("test", [])] + ["src"]
    for path in needed:
        assert any(path == c or path.startswith(c.rstrip("/") + "/") for c in copied), f"{path} is not copied"
    assert ("COPY", f"--from={name} /src/target/release/moge /usr/local/bin/moge") in runtime
    assert not any(w == "RUN" and "cargo" in a for w, a in runtime)
    user = [a for w, a in runtime if w == "USER"]
    assert user and user[-1] not in ("root", "0")
    assert ("ENTRYPOINT", '["moge"]') in runtime
    # The default command is one moge takes, on the port the image exposes.
    (cmd,) = [json.loads(a) for w, a in runtime if w == "CMD"]
    (port,) = [a for w, a in runtime if w == "EXPOSE"]
    assert flag(cmd, "--port") == port
    r = subprocess.run([MOGE, *cmd, "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
