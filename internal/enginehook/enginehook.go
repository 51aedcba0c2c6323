// Package enginehook gives the project's own tests and fault harness what
// the public API deliberately does not: the engine's parts one at a time
// (a worker, a dispatcher, a reaper or a scheduler alone, to kill, cut or
// step it), and figures of a running Server that explain a duplicate run
// after a kill. Users run the parts through engine.Server. Package engine
// sets the functions below when it is linked in; nothing outside this
// module can import this package.
package enginehook

import (
	"context"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Worker runs tasks (engine's worker).
type Worker interface {
	Run(ctx context.Context) error
	Shutdown(ctx context.Context) error
	ID() string
	Processed() int64
	Failed() int64
	// Chained counts the batches taken with results; ClaimedAhead the
	// tasks claimed ahead of a free handler slot.
	Chained() int64
	ClaimedAhead() int64
}

// Dispatcher moves due buckets to the ready lists (engine's dispatcher).
type Dispatcher interface {
	Run(ctx context.Context) error
	Moved() int64
	Conflicts() int64
}

// Reaper recovers the tasks of dead workers (engine's reaper).
type Reaper interface {
	Run(ctx context.Context) error
	// Reap runs one pass.
	Reap(ctx context.Context) (ReapResult, error)
}

// ReapResult is what one reaper pass did.
type ReapResult struct {
	DeadWorkers   int // workers found dead and cleaned up
	Recovered     int // tasks returned to their queues
	Buried        int // tasks sent to the dead letters
	ExpiredLeases int // of Recovered, runs whose lease ran out
	TrimmedDead   int // dead letters past DeadRetention, deleted
}

// Scheduler keeps periodic entries enqueued (engine's scheduler).
type Scheduler interface {
	Run(ctx context.Context) error
	// RunPass runs one pass.
	RunPass(ctx context.Context) error
	ID() string
}

// The constructors, set by package engine. cfg is an engine.Config, h an
// engine.Handler, p an engine.Periodic; horizon 0 keeps the default.
var (
	NewWorker     func(pool *redis.Pool, cfg, h any) (Worker, error)
	NewDispatcher func(pool *redis.Pool, cfg any) (Dispatcher, error)
	NewReaper     func(pool *redis.Pool, cfg any) (Reaper, error)
	NewScheduler  func(pool *redis.Pool, cfg any, horizon time.Duration, p ...any) (Scheduler, error)
	// ServerWorkers returns the workers of an *engine.Server, one per
	// lane (none without the worker role).
	ServerWorkers func(srv any) []Worker
)
