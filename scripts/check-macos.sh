#!/usr/bin/env bash
# macOS (Apple Silicon and Intel) compiles: clippy, every warning an error, over the workspace
# (the crate, the command line, the C++ and Python bindings, the tests) for aarch64-apple-darwin
# and x86_64-apple-darwin. macOS has no /proc, no arch_prctl and other process-group and signal
# calls: this is what holds every such place behind a cfg. Nothing is linked or run (no macOS
# here); the C of dependencies (ring) compiles to empty objects through scripts/check-cc, which
# needs clang (Debian's package).
set -euo pipefail
cd "$(dirname "$0")/.."
step() {
    local start=$SECONDS
    "$@"
    echo "check-macos.sh: '$*' took $((SECONDS - start)) s" >&2
}
if ! command -v clang >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    step sh -c "apt-get install -y --no-install-recommends clang >/dev/null || { apt-get update >/dev/null && apt-get install -y --no-install-recommends clang >/dev/null; }"
fi
for target in aarch64-apple-darwin x86_64-apple-darwin; do
    rustup target list --installed | grep -qx "$target" || step rustup target add "$target"
    var=$(echo "$target" | tr - _)
    step env "CC_$var=$PWD/scripts/check-cc" "CXX_$var=$PWD/scripts/check-cc" \
        cargo clippy --profile ci --locked --target "$target" --workspace --all-targets -- -D warnings
done
