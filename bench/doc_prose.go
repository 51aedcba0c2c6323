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
list), claims them in one transaction (two round trips, which leave a watch on the records), and
records the results of runs that end together in one transaction with that watch, without reading
the records again (one round trip): about four round trips for K tasks. When a group holds every
handler slot its slots go back as its round trip starts, so the next pop and claim overlap the
recording. K adapts: 1 while pops find the queues
shallow, doubling while every pop finds all it asked for, bounded by the free handler slots and
` + "`Config.ClaimBatch`" + `. While the queues are deep and the handlers quick (their mean run
time, times the tasks claimed ahead per slot, within ` + "`Config.PrefetchWait`" + `, 5 ms), a worker
also claims ahead of its free slots, up to ` + "`Config.ClaimBatch`" + ` tasks in all (` + "`Config.Prefetch`" + `):
the tasks claimed ahead wait in the process for a slot, so a worker of 8 slots pays one claim and one
result transaction for up to 32 no-op tasks, not 8. A batch
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
and after, and renders the CPU profiles as flame graphs, [before](img/e2e-flame-before.svg) and
[after](img/e2e-flame-after.svg) (` + "`go run . flame PROFILE OUT.svg`" + ` in ` + "`bench/`" + ` draws them, coloured by where the
code lives: this project, the Redis client, system calls, the Go runtime), and as call graphs:
[before](img/e2e-cpu-before.svg), [after](img/e2e-cpu-after.svg) (the top functions in
` + "`img/e2e-cpu-*.txt`" + `). Most of the client's time is system calls (one per round trip) and the
scheduler waking goroutines for replies, which is why fewer round trips per task is the lever. The same
script profiles the harness's e2e scenario as a whole, producers and dispatcher included
([flame graph](img/e2e-scenario-flame.svg), [call graph](img/e2e-scenario-cpu.svg), top functions in
` + "`img/e2e-scenario-cpu.txt`" + `): there too
system calls, the scheduler and memory allocation take most of the samples. The CPU figures of the
e2e, dispatch and enqueue cases (client and server µs per task, and how busy the cores were) say which
side a design spends its time on.
` + "`BENCH_STATS=1 go test -run XXX -bench WorkerThroughput ./engine`" + ` prints the commands Redis ran
per task, and ` + "`cd buckets && go test -run XXX -bench . -benchmem`" + ` times the claim, finish and move
transactions one at a time and in batches. The e2e scenario counts them too (*End to end, command
by command* below): per task, the worker's share is one ` + "`RPOPLPUSH`" + ` and the success's ` + "`SETEX`" + ` of the
done record, and a share of each batch's ` + "`WATCH`" + `, ` + "`MGET`" + `, ` + "`MULTI`" + `/` + "`EXEC`" + `, counters, the claim's
` + "`MSET`" + ` of its records and one ` + "`LTRIM`" + ` of the in-flight list (a task claimed alone writes its record
with a ` + "`SET`" + ` and leaves the in-flight list by an ` + "`LREM`" + ` of its own); a success nobody waits for pushes no
completion list (its kept record tells a later ` + "`Wait`" + `). The rest is the producers' enqueue.

## Reading the figures

Client and server share the machine's cores, so every rate is bounded by both processes' CPU
together; on a machine shared with other work the spread (min–max) widens. A CPU figure reads
n/a where the measured span was under 50 ms (the fastest dispatch cases): the kernel brings a
running thread's CPU time up to date only at a tick or a switch, so so short a span would mostly
measure that lag. A target missed is said so in the target table, with the figures that show it.
`

// memoryProse follows the memory breakdown tables: how to read them and
// what the figures are made of. It holds no figure of a run.
const memoryProse = `How to read it. ` + "`MEMORY USAGE`" + ` counts, for one key, its entry in the keyspace's hash
table, the allocation of the key's name, the value's object header and the value's allocations
(all the members of a list or ZSET with ` + "`SAMPLES 0`" + `). Allocations come in the allocator's size
classes (jemalloc: 16, 32, 48, 64, 80, … 128, 160, 192, …), so a key or value grows in steps: a
key name of up to 30 bytes takes a 32-byte block (a 1-byte header and a terminator), a longer one a
3-byte header; a record takes the next class up from its length plus 4. A record key's row is the
usage of a probe key of the same name length holding an integer (no value allocation), measured
and deleted after the run; the record value's row is the rest of the record keys' usage. *rest* is
what ` + "`used_memory`" + ` grew by beyond the keys' usage: the keyspace's hash table (8 bytes a slot,
a power of two at least the number of keys, two tables while it grows) and allocator rounding that
` + "`MEMORY USAGE`" + ` counts at the structures' sizes (a list's 40-byte header in a 48-byte block).

What the figures are made of. In full buckets a task costs its record key and its entry in a
bucket list (the id and two bytes). The record value is the payload (with the harness's task
number) plus a header, rounded up to a size class: the record reads the creation time from the
task's generated id and leaves out the default queue, attempts and timeout, so a waiting task's
header is its state, its due time relative to its creation and its type. On its own server the harness names each
measurement's namespace ` + "`b`" + ` and its number in base 36, as short as the default ` + "`bq`" + ` or one
character longer, so key names are a default deployment's: a record key's name (28 or 29 bytes)
fits a 32-byte block. On a shared server (` + "`-redis`" + `) its ` + "`bqb-<run>-<n>`" + ` makes each key name 11
bytes longer, and a record key's name takes a 48-byte block. A bucket list costs a key of its own
(entry, name, object header, and on Redis 7.0, which keeps every list as a
quicklist, a quicklist header, a node and a listpack; from 7.2 a short list is one listpack, up to
` + "`list-max-listpack-size`" + `, without the header and node) and an index member (entry,
skiplist node, the member's name, a slot of the ZSET's hash table). A shorter timestamp (7 base62
digits instead of 13 decimal ones) would move a member like ` + "`default:<ts>`" + ` (21 bytes) to no
smaller class, and a bucket key down by one class at most (8 bytes with the default namespace,
none with the long one of a shared server), so bucket keys and members keep their decimal time. A task alone
in its bucket keeps no list: the first task a
producer enqueues for a bucket is an inline entry, an index member ` + "`queue:<id>`" + ` (30 bytes with a generated id
and the default queue, the size class of ` + "`queue:<ts>`" + `) scored with the bucket's time, and the producer's later
tasks for that bucket go to its list, so a burst keeps a list's cost per task (the *burst* column
counts one inline entry and one list a bucket). In the *spread* column that leaves no bucket lists, an
index member a task, and fewer keys in the keyspace's hash table.

On Redis 2.4 there is no ` + "`MEMORY USAGE`" + `, so no breakdown. There a list is one ziplist (an
entry costs the id and two bytes) up to ` + "`list-max-ziplist-entries`" + ` (512) entries of at most
` + "`list-max-ziplist-value`" + ` (64) bytes, and beyond that a linked list with a node, an object
header and a string allocated per entry, several times the ziplist's cost: a bucket of more than 512
tasks costs more a task on 2.4. The index ZSET is a ziplist up to ` + "`zset-max-ziplist-entries`" + `
(128) members.
`
