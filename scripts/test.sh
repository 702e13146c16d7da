#!/usr/bin/env bash
# Every test of the project, as README.md gives it: cargo's (the library, the `moge` binary and
# its command line), the C++ library's (built with CMake and g++), then the Python bindings' (the
# manylinux wheel, installed into a fresh virtual environment and imported by a real interpreter;
# Ray and Spark on local clusters) and deploy/'s, then the web page's in headless Chromium.
# Needs cmake, ffmpeg (the video tests), libheif-dev (the HEIC/AVIF tests), python3 with venv and
# pip, PyPI and java 17 (Spark); node, npm and chromium (the web page's tests), and the npm registry.
# Each step's wall time goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
step() {
    local start=$SECONDS
    "$@"
    echo "test.sh: '$*' took $((SECONDS - start)) s" >&2
}
# The library, binary and integration tests, then the doc examples. `cargo test` alone would also
# build every example program (about 40 s of compiling on 2 cores); clippy (.ci/run) checks those.
# --workspace: the dependencies then get the features the Python binding adds too (pyo3 asks for a
# few more of syn, once_cell, num-integer), so that the wheel below reuses this build's `moge`
# and its dependencies instead of compiling them again (~150 s on 2 cores).
step cargo test --profile ci --locked --workspace --tests
step cargo test --profile ci --locked --workspace --doc
# The C++ library (ffi/cxx) built by CMake and g++ on this build (same profile, target directory
# and package selection, so cargo only adds the static library), then its tests through CTest:
# the maps against the command line's npz, threads, every error; the example; an install found
# with find_package and with pkg-config. Needs cmake.
step cmake -S ffi/cxx -B target/cxx-build -DMOGE_CARGO_PROFILE=ci -DMOGE_BUILD_TESTS=ON "-DMOGE_CARGO_PACKAGES=--workspace;--lib;--bins"
step cmake --build target/cxx-build -j "$(nproc)"
step ctest --test-dir target/cxx-build --output-on-failure
# The Python package as users without Rust get it: the sdist, and from it the manylinux2014
# wheel (zig links it against glibc 2.17), checked by auditwheel; then that wheel installed into
# a fresh virtual environment with the test requirements (Ray, Spark among them; Spark's JVM is
# the machine's java), and the binding's tests run against it with no cargo or rustc on PATH.
MOGE_WHEEL_PROFILE=ci step scripts/build-wheels.sh
venv=target/pytest-venv
python3 -m venv --clear "$venv"
pip=("$venv/bin/pip" --disable-pip-version-check --quiet)
step "${pip[@]}" install -r ffi/python/tests/requirements.txt
step "${pip[@]}" install target/wheels/dist/moge_rs-*.whl
# The bindings (the wheel, Ray's local cluster and Spark's local[2] included), then deploy/ (the
# Kubernetes manifests against their schema, the Slurm script run as array tasks, the Dockerfile
# read), both with the binary built above.
PATH="$PWD/$venv/bin:/usr/local/bin:/usr/bin:/bin" MOGE_WHEEL_TEST=1 MOGE_REQUIRE_ENGINES=1 MOGE_BIN="$PWD/target/ci/moge" \
    step "$venv/bin/python" -m pytest ffi/python/tests deploy/tests -q -p no:cacheprovider
# The page of `moge serve` in headless Chromium, with the binary built above (needs node, npm
# and chromium; screenshots in target/web-test/).
step scripts/test-web.sh target/ci/moge
# HEIC and AVIF photos, decoded by the system's libheif in a build with the `heif` feature (off by
# default, so that a fresh machine builds without libheif-dev): that feature's tests, and the
# damaged-input ones that a HEIF header meets, on a second build of the crate (features change the
# build of `moge` itself, so this comes last: the steps above use the default build's binary).
if ! pkg-config --exists libheif; then
    echo "test.sh: the HEIC/AVIF tests need libheif (Debian and Ubuntu: apt install libheif-dev)" >&2
    exit 1
fi
step cargo test --profile ci --locked --features heif --test it -- heif:: damaged_inputs::
