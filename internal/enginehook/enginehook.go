// Package enginehook gives the project's own tests and fault harness what
// the public API deliberately does not: the engine's parts one at a time
// (a worker, a dispatcher, a reaper or a scheduler alone, to kill, cut or
// step it), and figures of a running Server that explain a duplicate run
// after a kill; and package enginetest a dispatcher and a worker stepped
// on the test's goroutine. Users run the parts through engine.Server.
// Package engine sets the functions below when it is linked in; nothing
// outside this module can import this package.
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

// Stepper is a dispatcher and a worker run one step at a time on the
// caller's goroutine, on the Config's clock (package enginetest's Drain).
type Stepper interface {
	// Step makes ready every task due by the clock's now, then takes at
	// most one ready task, runs its handler and records its result.
	// took reports whether it took a task; next is when the earliest
	// scheduled task is due (zero: none), as read before taking.
	Step(ctx context.Context) (took bool, next time.Time, err error)
	// Close gives up the dispatch turn and unregisters the worker.
	Close(ctx context.Context) error
}

// Set by package engine. cfg is an engine.Config, h an engine.Handler.
var (
	NewStepper func(ctx context.Context, pool *redis.Pool, cfg, h any) (Stepper, error)
	// UniqueKey returns the unique key task id holds: "k:<key>" for
	// engine.UniqueKey, "d:<digest>" for engine.Unique, "" for none.
	UniqueKey func(ctx context.Context, pool *redis.Pool, cfg any, id string) (string, error)
)
