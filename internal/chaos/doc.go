// Package chaos is the engine's fault-injection harness. It starts a
// redis-server of its own (its default user restricted to the Redis 2.4
// command table), runs the engine as real OS processes — producers,
// dispatchers, workers and reapers, all one binary, cmd/chaosproc — injects
// faults while they work, and at the end checks every task against ledgers
// the processes wrote (package chaos/ledger):
//
//   - producers append the ids of acknowledged enqueues (only after Enqueue
//     or EnqueueBatch returned nil), with due times, fsync'd per batch;
//   - handlers append a line when a run starts and one when it ends;
//   - the harness records every fault: which process it killed, when, and
//     (for a worker) what it held in Redis right after it died.
//
// A Report counts enqueued (acknowledged), executed, lost (acknowledged,
// never ran, not a dead letter), dead-lettered, executed more than once
// against the runs that explain a second run (a handler in flight when its
// worker got SIGKILL, a task claimed by it, a lease that ran out), executed
// early (on the producer's clock; with clock skew, against the skew),
// lateness, and whether every batch was all or nothing. Anything else the
// processes log at error level, unexpected exits (with the tail of their
// logs), panics and Redis 2.4 violations are reported too.
//
// The scenarios (Scenarios, Describe) are one fault each — worker kills,
// dispatcher and reaper kills, producer kills in the middle of
// EnqueueBatch, connection cuts by a proxy plus the server's idle timeout,
// redis-server restarts with an fsync'd AOF, clock skew, bad data — and all
// of them combined. Every random choice comes from the seed; a run prints
// it and Options.Seed replays it (the same faults at the same moments of
// the run; the operating system's timing still varies).
//
// RunWorkflow is the workflow scenario (chains and groups under kills,
// cuts and Redis restarts at once), with a check of its own: every chain
// completes with each step written once, every group's callback runs once
// with the members' outcomes.
//
// Every scenario also runs on shards (Options.Shards and the Shards
// fields of the other runners): lanes on redis-servers of their own,
// producers on an engine.ShardedClient, the other processes
// engine.ShardedServers, a cutting proxy in front of each server, Redis
// restarts of one server at a time, bad data in one lane's keys, and the
// ledger and the engine's check over every lane.
//
// TestChaos runs every scenario briefly as part of go test, and
// TestChaosShards (with the other ...Shards tests) runs them on three
// shards; the long runs are the command:
//
//	go run ./internal/chaos/cmd/chaos -scenario all -tasks 50000 -seed N
//	go run ./internal/chaos/cmd/chaos -scenario all -tasks 50000 -shards 3 -seed N
//
// docs/reliability.md says what the engine guarantees under each fault and
// what the long runs measured.
package chaos
