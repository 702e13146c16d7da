#!/usr/bin/env bash
# The Python package for users without Rust: the sdist of ffi/python, and from that sdist the
# abi3 wheel (CPython >= 3.9) as a manylinux2014 wheel, linked against glibc 2.17 by zig (PyPI's
# `ziglang`, through maturin's --zig; no container image), then checked by `auditwheel show`:
# the platform tag it claims, and no shared library outside the manylinux set.
#
#   scripts/build-wheels.sh                 # target/wheels/dist/moge_rs-*.whl and .tar.gz
#   MOGE_WHEEL_PROFILE=ci scripts/build-wheels.sh   # the test suite's profile (no thin LTO)
#
# Building the wheel from the unpacked sdist (not from this tree) tests the sdist too: what a
# user with Rust gets from `pip install moge_rs-*.tar.gz`. Needs python3 with venv, PyPI, and
# the Rust toolchain; the tools go into target/wheels/tools, the build into target/wheels/target.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${MOGE_WHEEL_PROFILE:-release}
work=target/wheels
dist=$work/dist
tools=$work/tools
if [ ! -x "$tools/bin/maturin" ] || [ ! -x "$tools/bin/auditwheel" ] || ! "$tools/bin/python" -c 'import ziglang' 2>/dev/null; then
    python3 -m venv --clear "$tools"
    "$tools/bin/pip" install --disable-pip-version-check --quiet "maturin>=1.9,<2" "ziglang>=0.13,<0.18" "auditwheel>=6,<7"
fi
export PATH="$PWD/$tools/bin:$PATH"
rm -rf "$dist" "$work/src"
mkdir -p "$dist" "$work/src"

# (maturin's failure still fails the pipe; grep finding nothing to print does not.)
maturin sdist --manifest-path ffi/python/Cargo.toml --out "$dist" 2>&1 | { grep -v '^warning: manifest has no\|^  |\|^  = note\|^$' || true; } >&2
sdist=$(ls "$dist"/moge_rs-*.tar.gz)
# The sdist carries the library, the command line (compiled into the module too), the lock,
# and the binding; not the tests' fixtures.
# With the time of extraction (-m): the sdist stamps its files with one fixed time, under which
# cargo would take the previous build's artifacts in target/wheels/target as current.
tar -xzmf "$sdist" -C "$work/src"
src=$(ls -d "$work"/src/moge_rs-*)
for f in Cargo.lock Cargo.toml src/lib.rs src/cli/mod.rs ffi/python/src/lib.rs python/moge_rs/__init__.py python/moge_rs/_batch.py python/moge_rs/_cli.py python/moge_rs/ray.py python/moge_rs/spark.py; do
    [ -f "$src/$f" ] || { echo "build-wheels: the sdist lacks $f" >&2; exit 1; }
done
if [ -d "$src/tests/fixtures" ]; then
    echo "build-wheels: the sdist carries tests/fixtures" >&2
    exit 1
fi

# The wheel, from the sdist. One target directory across runs, so a second build is quick. Not
# --locked: the sdist's workspace lacks ffi/cxx, so cargo drops cxx's entries from the lock; the
# versions of everything else are the lock's.
CARGO_TARGET_DIR="$PWD/$work/target" maturin build --manifest-path "$src/ffi/python/Cargo.toml" \
    --profile "$profile" --strip --zig --compatibility manylinux2014 --interpreter python3 --out "$dist"
wheel=$(ls "$dist"/moge_rs-*.whl)
case "$wheel" in
*-cp39-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl | *-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl) ;;
*)
    echo "build-wheels: $wheel is not the abi3 manylinux2014 x86_64 wheel" >&2
    exit 1
    ;;
esac
report=$(auditwheel show "$wheel")
echo "$report"
# auditwheel calls a wheel consistent with a manylinux tag only when every library it links is
# in that policy's set (else it says linux_x86_64): the tag is the whole check.
if ! tr -d '\n' <<<"$report" | grep -q 'is consistent with the following platform tag: *"manylinux_2_17_x86_64"'; then
    echo "build-wheels: auditwheel does not confirm manylinux_2_17_x86_64" >&2
    exit 1
fi
ls -l "$dist"
echo "build-wheels: $(basename "$wheel"): $(($(stat -c %s "$wheel") / 1024)) KiB; $(basename "$sdist"): $(($(stat -c %s "$sdist") / 1024)) KiB" >&2
