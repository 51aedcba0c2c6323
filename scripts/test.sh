#!/usr/bin/env bash
# The project's test command: installs redis-server when it is missing (the
# real-server tests need it and fail, not skip, without it), then vets and
# runs every test (with the race detector, but for the chaos harness),
# then a short fuzz of each decoder.
set -euo pipefail
cd "$(dirname "$0")/.."

# staticcheck, pinned; installed from the Go module proxy when missing.
STATICCHECK_VERSION=v0.8.2 # staticcheck 2026.2.2
STATICCHECK="$(go env GOPATH)/bin/staticcheck"
if ! "$STATICCHECK" -version 2>/dev/null | grep -q "(${STATICCHECK_VERSION#v})"; then
  echo "installing staticcheck ${STATICCHECK_VERSION}" >&2
  go install "honnef.co/go/tools/cmd/staticcheck@${STATICCHECK_VERSION}"
fi

# Debian packages the tests need: redis-server (every real-server test),
# redis-cli (creating the Redis Cluster), redis-sentinel (the Sentinel
# tests). Installed when missing (needs root and the Debian archive).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}" >&2
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# Debian's package starts a server on 6379; the tests start their own on free
# ports and never use it.
redis-server --version

# The dashboard's browser tests drive a headless Chromium; they fail, not
# skip, without it.
if ! command -v chromium >/dev/null 2>&1; then
  echo "chromium not found; installing it (needs root and the Debian archive)" >&2
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

# Builds leave the clone's path out (-trimpath), so a clean clone at a new
# path reuses what earlier runs compiled from the same sources instead of
# compiling every package again for vet, the tests, the fuzzers and the
# chaos processes (about two CPU-minutes on two cores).
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath"
# Each phase says when it ends, in seconds since the start.
phase() { echo "== ${1}: done at ${SECONDS}s" >&2; }
go vet ./...
"$STATICCHECK" ./...
phase "vet and staticcheck"
# The jobs below run beside the package tests, each into a log that is
# printed once the tests are done: on two cores the suite is CPU-bound,
# and a job that waits (chaos) or runs alone (fuzz) would leave a core idle.
# Each job has a process group of its own (set -m), so that a stop of the
# script stops the whole job, go test's test binaries with it.
set -m
tmp="$(mktemp -d)"
declare -A pids=()
trap 'for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
beside() {
  local name=$1; shift
  { rc=0; "$@" || rc=$?; phase "$name"; exit "$rc"; } >"$tmp/$name.log" 2>&1 &
  pids[$name]=$!
}
collect() {
  local rc=0
  wait "${pids[$1]}" || rc=$?
  unset "pids[$1]"
  cat "$tmp/$1.log"
  return "$rc"
}
# internal/chaos is the longest package (its scenarios run in real time,
# mostly waiting). It runs without the race detector: the engine it
# tests runs in chaosproc processes, built without it, so the detector
# would watch only the harness, at a sixth of the package's CPU.
beside chaos go test -count=1 -timeout 20m ./internal/chaos/...
# A short fuzz of each decoder beyond its seed corpus (the seeds run with
# the tests). Counted in executions, not seconds: with a time budget Go's
# fuzzing coordinator can fail a target with "context deadline exceeded"
# and no failing input when the deadline falls while its workers are busy
# (say, minimizing a new input, which does not count as executions).
# Minimizing is bounded too (each new interesting input is minimized, one
# second at most), so a run stays short. The inputs earlier runs
# found interesting are dropped first (Go keeps them in its build cache,
# and each run would replay them all before fuzzing: minutes after a few
# hundred runs); a crasher is kept in testdata/fuzz, which stays. The
# config parser (YAML, then every check) runs tens of times slower per
# input than the record decoders (under 100 inputs a second on two busy
# cores), so it gets far fewer. The counts are what
# the 5-minute budget of the whole command leaves: the fuzzers take a
# core's share while the package tests run.
fuzz() { go test -run '^$' -fuzz "^$1\$" -fuzztime "$3" -fuzzminimizetime 1s "$2"; }
fuzz_all() {
  rm -rf "$(go env GOCACHE)/fuzz/github.com/bucketq/bucketq"
  fuzz FuzzDecodeRecord ./buckets 15000x &&
    fuzz FuzzDecodeFlow ./buckets 15000x &&
    fuzz FuzzParseConfig ./cmd/engine 500x
}
beside fuzz fuzz_all
# The benchmark module's checks and smoke tests.
if [ -f bench/go.mod ]; then
  beside bench sh -c 'cd bench && go vet ./... && "$0" ./... && go test -count=1 -timeout 10m ./...' "$STATICCHECK"
fi
# The packages whose tests mostly wait (servers starting, clusters
# forming, Sentinel failing over, cmd/engine's processes) run as a job of
# their own beside the rest: run after them, one or two at a time, they
# left the cores idle for a minute at the end; cmd/engine run after
# compat_test made that pair the command's longest path.
heavy=(./engine ./compat_test ./dashboard ./buckets)
light=$(go list ./... | grep -v -e '/internal/chaos' -e '/bucketq/engine$' -e '/compat_test$' -e '/dashboard$' -e '/buckets$')
# shellcheck disable=SC2086 # one word per package
beside light go test -race -count=1 -p 2 -timeout 20m $light
rc=0
# The longest packages first, so that none starts late and runs alone.
go test -race -count=1 -p 2 -timeout 20m "${heavy[@]}" || rc=1
phase "tests"
for job in light chaos fuzz bench; do
  if [ -n "${pids[$job]:-}" ]; then
    collect "$job" || rc=1
  fi
done
exit "$rc"
