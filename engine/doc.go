// Package engine runs reliable immediate, delayed and scheduled tasks on
// Redis using only the Redis 2.4 command set: no Lua, no SET options, no
// TIME, no keyspace notifications.
//
// # Tasks
//
// A task is a type name, a payload of bytes and a queue. A [Client]
// enqueues it to run now ([Client.Enqueue]), at a time ([At]) or after a
// delay ([In]), or many at once in one round trip
// ([Client.EnqueueBatch]). A [Server] runs the background parts its
// [Roles] name: a dispatcher that makes scheduled tasks ready when due, a
// worker that runs them with handlers registered on a [Mux], and a reaper
// that returns the tasks of dead workers; and the scheduler of its
// periodic entries ([Server.AddPeriodic]). An [Inspector] administers.
//
// Within a queue a task has a level ([Priority]): a worker starts a
// queue's tasks of level 1 (the default) before any of level 2, and so
// on to 4; between queues its order is Config.Queues and StrictPriority.
//
// # The delivery promise
//
// Once Enqueue returns nil the task is in Redis and runs at least once,
// whatever process crashes or connection drops. It runs more than once only
// when the worker running it died or its lease ran out (the handler outlived
// its timeout plus Config.Advanced.LeaseGrace); [Task.Recoveries] counts those. A
// task is never made ready before its due time on the dispatcher's clock,
// and is late by about the bucket resolution (Config.Advanced.Resolution) at most
// under normal load. Handlers should therefore be idempotent.
//
// An Enqueue whose error matches [ErrUncertain] lost its connection after
// the write was sent: the task may or may not be in Redis. Give tasks your
// own ids with [TaskID] and such a retry is safe: an id that exists is
// refused with [ErrTaskExists], so there is exactly one task.
//
// # Errors
//
// Errors match the sentinels of this package with errors.Is ([ErrNotFound],
// [ErrAlreadyDone], [ErrTaskExists], [ErrUncertain], …) and, through
// Unwrap, the context's or the network's error that caused them.
//
// A handler's error decides what happens next: nil is success; an error is
// a failure, retried with backoff ([Config.RetryDelay]) until the task's
// attempts are used up, after which it becomes a dead letter; [Permanent]
// skips the remaining attempts; [Snooze] runs it again later without
// using an attempt. Panics are failures.
//
// # Redis 2.4
//
// Every change to more than one key is one MULTI/EXEC, guarded by WATCH
// where it reads first (docs/design.md lists each). Blocking waits use
// whole-second timeouts; precise waits are Go timers. The redis24 package
// checks commands against the 2.4 table; tests run every connection
// through it.
//
// The layers below engine are package buckets, its storage layer (the key
// schema and every transaction; not a stable API), and package txn, the
// optimistic transactions buckets is built on, which a program may also
// use on its own for its own keys.
//
// # Connections and deadlines
//
// Every method that talks to Redis takes a context, and each of its round
// trips is bounded by it: when the deadline passes (or the context is
// canceled) the method returns an error for which
// errors.Is(err, context.DeadlineExceeded) (or context.Canceled) holds,
// and the connection, whose reply may still be on its way, is closed so
// that the pool discards it. Give each call a deadline.
//
// A round trip that answers at once (all but the blocking waits) is also
// bounded by txn.DefaultRoundTrip (15 s) when its context has no earlier
// deadline, background loops (Run) included; txn.WithRoundTrip on the
// context given to a call or to Run sets another bound. A round trip cut
// short by that bound fails like a dropped connection: the loops retry
// with backoff. docs/operations.md ("The redigo pool of a Go program")
// shows how to build the pool and what each of its settings bounds.
//
// # Concurrency
//
// Client, Inspector and Server are safe for concurrent use, and any number
// of each may run against one namespace in one process or many. None
// closes the redigo Pool it is given. Server.Run blocks until its context
// ends (or Shutdown) and returns only after every goroutine it started
// has ended.
//
// # Lanes
//
// NewClient, NewServer and NewInspector take one pool, or one pool per
// lane (logical shard) to spread a namespace over several servers: every
// transaction stays in one lane, a task's lane is part of its id
// (Client.LaneOf), and lane 0 writes what one pool writes. The Inspector's calls
// fan out over the lanes and merge. docs/scaling.md has the routing rules,
// the shard map (AdvancedConfig.MapVersion, ErrShardMapVersion) and the
// procedure for moving a lane to another server.
package engine
