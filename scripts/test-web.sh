#!/usr/bin/env bash
# The page of `moge serve` in a real browser (tests/web/page.test.mjs): Debian's Chromium,
# headless, driven by playwright-core from the npm registry (the version package-lock.json
# pins; no browser is downloaded), against a `moge serve` on loopback with the tiny fixture.
# Screenshots go to target/web-test/ (CI keeps them).
# Usage: scripts/test-web.sh [MOGE_BIN]   (default target/debug/moge, built if missing)
# Needs node and npm, and chromium (Debian and Ubuntu: apt install chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/debug/moge}
chromium=${CHROMIUM:-/usr/bin/chromium}
for tool in node npm; do
    command -v "$tool" >/dev/null || { echo "test-web.sh: the page's tests need $tool (Node.js 18 or later)" >&2; exit 1; }
done
if [ ! -x "$chromium" ]; then
    echo "test-web.sh: the page's tests need Chromium at $chromium (Debian and Ubuntu: apt install chromium; or set CHROMIUM)" >&2
    exit 1
fi
[ -x "$bin" ] || cargo build --locked
npm ci --prefix tests/web --no-audit --no-fund --loglevel=error
MOGE_BIN="$PWD/$bin" CHROMIUM="$chromium" MOGE_WEB_SHOTS="$PWD/target/web-test" \
    node --test --test-reporter=spec tests/web/
