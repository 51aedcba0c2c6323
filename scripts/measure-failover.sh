#!/usr/bin/env bash
# The failover and shard-kill figures of docs/scaling.md, from test runs:
# runs the Cluster, Sentinel and 2.4-promotion tests of ./topology RUNS times
# and TestShardThreeServersKill once with 100 000 tasks, each appending what
# it measured to a log ($BUCKETQ_MEASURE_LOG, see internal/measured), then
# renders the log into the generated blocks of docs/scaling.md. Not run by
# CI (about 5 minutes a run on two cores). Needs redis-server, redis-cli and
# redis-sentinel.
#
#   scripts/measure-failover.sh [RUNS]     # default 3
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export BUCKETQ_MEASURE_LOG=$log
for i in $(seq "$runs"); do
  echo "run $i of $runs: go test -count=1 -run 'Cluster|Sentinel' ./topology" >&2
  go test -count=1 -run 'Cluster|Sentinel' ./topology >&2
done
echo "go test -count=1 -run TestShardThreeServersKill ./engine (100 000 tasks)" >&2
ENGINE_TEST_SHARD_TASKS=100000 go test -count=1 -timeout 20m -run 'TestShardThreeServersKill$' ./engine >&2
go run ./internal/measured/render -log "$log" -doc docs/scaling.md
