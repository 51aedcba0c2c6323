#!/usr/bin/env bash
# CPU profiles of the worker's end-to-end path, before and after a change,
# rendered in docs/img as SVG call graphs (go tool pprof -svg) and top
# functions (go tool pprof -top):
# BenchmarkWorkerThroughput/slots8 (one worker process, 8 slots, no-op
# handlers, 20k tasks from a full ready list, enqueueing not profiled apart
# from the benchmark's own setup). Not run by CI. Needs graphviz (`dot`:
# apt-get install -y graphviz) and redis-server. For a flame graph of a
# profile: go tool pprof -http=: PROFILE (View, Flame graph).
#
#   scripts/profiles.sh [BEFORE-REV] [AFTER-REV]   # defaults: 65c984e (before batch claim) and HEAD
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:-65c984e}
after=${2:-HEAD}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for side in before after; do
  rev=${!side}
  mkdir -p "$tmp/$side"
  git archive "$rev" | tar -x -C "$tmp/$side"
  (cd "$tmp/$side" && go test -c -o "$tmp/$side.test" ./engine)
  (cd "$tmp/$side/engine" && "$tmp/$side.test" -test.run XXX -test.bench 'WorkerThroughput/slots8' \
    -test.benchtime 3x -test.cpuprofile "$tmp/$side.prof" | grep -E 'Benchmark|tasks/s' || true)
  go tool pprof -svg -nodefraction 0.02 -output "docs/img/e2e-cpu-$side.svg" "$tmp/$side.test" "$tmp/$side.prof"
  go tool pprof -top -nodecount 25 "$tmp/$side.test" "$tmp/$side.prof" > "docs/img/e2e-cpu-$side.txt"
done
(cd "$tmp/after/bench" && go build -o "$tmp/bench" . && "$tmp/bench" -scenarios e2e -impls engine -handlers 8 -runs 3 \
  -out "" -cpuprofile "$tmp/scenario.prof" | grep -E 'rate|cpu' || true)
go tool pprof -svg -nodefraction 0.02 -output docs/img/e2e-scenario-cpu.svg "$tmp/bench" "$tmp/scenario.prof"
go tool pprof -top -nodecount 25 "$tmp/bench" "$tmp/scenario.prof" > docs/img/e2e-scenario-cpu.txt
echo "wrote docs/img/e2e-cpu-{before,after}.{svg,txt} and e2e-scenario-cpu.{svg,txt}"
