#!/usr/bin/env bash
# Every test of the project, as README.md gives it: cargo's (the library, the `moge` binary and
# its command line), then the Python bindings', built with maturin into a fresh virtual
# environment and imported by a real interpreter. Needs python3 with venv and pip, and PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --profile ci --locked
venv=target/pytest-venv
python3 -m venv --clear "$venv"
pip=("$venv/bin/pip" --disable-pip-version-check --quiet)
"${pip[@]}" install "maturin>=1.9,<2" numpy pillow pytest
# The wheel from the same profile and target directory as the tests above: only the binding
# crate and what it adds are compiled again.
PATH="$PWD/$venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile ci --locked" "${pip[@]}" install --no-build-isolation ./ffi/python
MOGE_BIN="$PWD/target/ci/moge" "$venv/bin/python" -m pytest ffi/python/tests -q -p no:cacheprovider
