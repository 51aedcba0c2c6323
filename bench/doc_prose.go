package main

// docProse is the part of docs/benchmarks.md that holds no figure: what
// the implementations are and how to read the tables. Figures live only
// in results.json.
const docProse = `## Implementations

- ` + "`engine`" + `: this engine, default configuration (bucket resolution 10 ms, claim batches of up
  to 32, group commit window 1 ms); ` + "`engine-1ms`" + ` and ` + "`engine-100ms`" + ` change only the resolution.
- ` + "`naive`" + `: the per-task design of the classic articles, written in the harness: one ZSET
  scored by due time, pollers doing ` + "`ZRANGEBYSCORE … LIMIT 0 1`" + ` then ` + "`ZREM`" + ` to claim,
  ` + "`RPUSH`" + ` to a ready list popped by ` + "`BLPOP`" + `. It has no acknowledgement: a popped task whose
  worker dies is lost.
- ` + "`asynq`" + ` (Lua scripts; needs Redis ≥ 4) and ` + "`rmq`" + ` (no delayed tasks: enqueue and end-to-end
  only); their versions are in results.json (` + "`meta.modules`" + `). Against a server older than
  Redis 2.6 both are skipped with a note, and the engine and the naive design run alone.

## How a task is taken, and what it costs

A worker takes a lone task in three round trips: the claim's read (` + "`WATCH`" + ` and ` + "`GET`" + ` of the
record), the claim (` + "`MULTI/EXEC`" + `, which leaves a watch on the record), and the result, which
travels with the next ` + "`RPOPLPUSH`" + ` in one round trip. When the queues are deep, a worker process
takes up to K tasks of one queue in one round trip (K pipelined ` + "`RPOPLPUSH`" + ` into its in-flight
list), claims them in one transaction (two round trips), and records the results of runs that end
together in one transaction (two round trips: the read of the records and the writes): about
five round trips for K tasks. K adapts: 1 while pops find the queues shallow, doubling while every
pop finds all it asked for, bounded by the free handler slots and ` + "`Config.ClaimBatch`" + `. A batch
never mixes queues, so under strict priority a lower queue is popped only when every higher one was
empty at the pop.

**The latency cost of group commit.** A result of a batch-claimed task waits at most
` + "`Config.GroupCommitWindow`" + ` (1 ms) for other results to share its transaction, and not at all when
no other handler of the process is running or 64 results are waiting. A lone task (the queues
shallow) never goes through the group: its result is recorded with the watch its claim left, in
one round trip. ` + "`go test -run XXX -bench GroupCommitLatency ./engine`" + ` measures the time from a
handler's return to its result being recorded, with the window and without.

## Where the time goes

` + "`scripts/profiles.sh`" + ` profiles the worker's path (` + "`BenchmarkWorkerThroughput/slots8`" + `: one
worker process, 8 slots, no-op handlers, a full ready list) before batch claim and group commit
and after, and renders the CPU profiles as call graphs:
[before](img/e2e-cpu-before.svg), [after](img/e2e-cpu-after.svg) (the top functions in
` + "`img/e2e-cpu-*.txt`" + `). Most of the client's time is system calls (one per round trip) and the
scheduler waking goroutines for replies, which is why fewer round trips per task is the lever.
` + "`BENCH_STATS=1 go test -run XXX -bench WorkerThroughput ./engine`" + ` prints the commands Redis ran
per task, and ` + "`cd buckets && go test -run XXX -bench . -benchmem`" + ` times the claim, finish and move
transactions one at a time and in batches. The e2e scenario counts them too (*End to end, command
by command* below): per task, the worker's share is one ` + "`RPOPLPUSH`" + `, the claim's ` + "`SET`" + ` of the record
and ` + "`LREM`" + ` from the in-flight list, the success's ` + "`SETEX`" + ` of the done record, and a share of each
batch's ` + "`WATCH`" + `, ` + "`MGET`" + `, ` + "`MULTI`" + `/` + "`EXEC`" + ` and counters; a success nobody waits for pushes no
completion list (its kept record tells a later ` + "`Wait`" + `). The rest is the producers' enqueue.

## Reading the figures

Client and server share the machine's cores, so every rate is bounded by both processes' CPU
together; on a machine shared with other work the spread (min–max) widens. A target missed is
said so in the target table, with the figures that show it.
`
