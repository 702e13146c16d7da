#!/usr/bin/env bash
# The same photos through `moge batch` with the model here, then through `moge serve` on this
# machine with `moge batch --server`, side by side in one run; prints images/s of each and how
# busy the server kept its device (the sum of its per-photo forward times over the wall time).
#
#   scripts/bench-serve.sh WEIGHTS PHOTO_DIR [FORMAT] [EXTRA BATCH OPTIONS...]
#   scripts/bench-serve.sh tests/fixtures/tiny_normal.pt photos/ png --num-tokens 1800
#
# Both sides run on this machine's cores, so the remote figure includes the client's decoding and
# writing competing with the server; on two machines the server has its cores to itself.
set -euo pipefail
cd "$(dirname "$0")/.."
moge=${MOGE:-target/release/moge}
[ -x "$moge" ] || cargo build --release --locked
weights=$1 photos=$2 format=${3:-npz}
shift $(( $# < 3 ? $# : 3 ))
work=$(mktemp -d)
trap 'kill "${server:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
echo "cpu: $(grep -m1 'cpu family' /proc/cpuinfo | tr -s ' \t' ' '), $(nproc) cores; $(ls "$photos" | wc -l) photos, --format $format $*"

echo "local:  $("$moge" batch "$photos" -o "$work/local" --weights "$weights" --format "$format" "$@" 2>&1 | grep -E '^moge: [0-9]+ done')"

"$moge" serve --weights "$weights" --port 0 >"$work/serve.out" 2>"$work/serve.err" &
server=$!
for _ in $(seq 300); do grep -q listening "$work/serve.out" 2>/dev/null && break; sleep 0.2; done
url=$(grep -o 'http://[^ ]*' "$work/serve.out") || { cat "$work/serve.err"; exit 2; }
t0=$(date +%s.%N)
line=$("$moge" batch "$photos" -o "$work/remote" --server "$url" --format "$format,json" "$@" 2>&1 | grep -E '^moge: [0-9]+ done')
wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
echo "server: $line"
# The server's own forward time of each photo, from the sidecars (`inference.server.timing_ms.device`).
find "$work/remote" -name '*.json' -exec grep -h '"device": [0-9]' {} + |
    awk -v wall="$wall" '{ gsub(/,/, "", $2); s += $2; n++ } END { printf "server device busy: %.1f s of %.1f s wall (%.1f %%), %.1f ms per forward\n", s / 1e3, wall, 100 * s / 1e3 / wall, s / n }'
kill -TERM "$server"; wait "$server" || true
