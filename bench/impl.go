package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// Task is one unit of work that the harness hands to an implementation.
type Task struct {
	// ID is unique within one measurement. Implementations must hand it back
	// unchanged in the Delivery so the harness can match deliveries to tasks
	// (it is a short decimal string without '|').
	ID string
	// Payload is opaque; implementations must hand it back unchanged.
	Payload []byte
	// Due is when the task may start. Only Scheduler, BatchScheduler and
	// Dispatcher look at it; Enqueue and EnqueueBatch ignore it (due now).
	Due time.Time
}

// Delivery is what a Handler receives for one task.
type Delivery struct {
	ID      string
	Payload []byte
}

// Handler processes one delivered task. The harness's handlers are safe for
// concurrent use, return quickly and always return nil.
type Handler func(ctx context.Context, d Delivery) error

// Env is what an implementation is opened with.
type Env struct {
	// Addr is the Redis server, host:port.
	Addr string
	// Namespace is unique to one measurement of the harness's run (and to the
	// run too on a shared server) and matches [a-z0-9-]+. Every key
	// an implementation writes must be derived from it (a prefix, a queue
	// name, ...) and be covered by its KeyPatterns, so that runs against a
	// shared server (-redis) never touch anything else.
	Namespace string
	// Poll is the interval polling implementations wait when they find nothing
	// to do (the naive poller's sleep, asynq's forwarder and task-check
	// intervals, rmq's poll duration). Zero means each one's own default.
	Poll time.Duration
	// Logf prints a diagnostic line on stderr.
	Logf func(format string, args ...any)
}

// ConsumeConfig says how many goroutines of each kind Consume starts.
type ConsumeConfig struct {
	// Workers is the number of handlers that may run at once.
	Workers int
	// Dispatchers is the number of movers of due tasks (delayed → ready) to
	// run beside the workers; implementations without delayed tasks ignore it.
	Dispatchers int
	// MaxRunning, when above 0, is the consumed queue's concurrency limit
	// across every consumer. Only the engine has one (cases that set it
	// apply to the engine alone); the other implementations ignore it.
	MaxRunning int
}

// Impl is one task-queue implementation under test. Every method may be
// called from several goroutines at once, except Open and Close.
//
// The harness creates a fresh Impl (through its registered constructor) for
// every single measurement, calls Open, runs the scenario, and calls Close.
type Impl interface {
	// Name is the registered name ("naive", "asynq", ...).
	Name() string
	// Open connects to env.Addr. An error wrapping ErrNotImplemented or
	// ErrUnsupported makes the harness skip this implementation with a note
	// instead of failing.
	Open(ctx context.Context, env Env) error
	// Enqueue adds one task for immediate processing (t.Due is ignored).
	Enqueue(ctx context.Context, t Task) error
	// Consume starts cfg.Workers handlers (and cfg.Dispatchers movers when the
	// implementation has delayed tasks) that call h once per delivered task,
	// acknowledging it afterwards where the design has acknowledgements. It
	// returns once they are running; stop ends them and waits for them.
	Consume(ctx context.Context, cfg ConsumeConfig, h Handler) (stop func() error, err error)
	// KeyPatterns are Redis glob patterns covering every key the
	// implementation may have written in its namespace; the harness deletes
	// them after each measurement when it runs against a shared server.
	KeyPatterns() []string
	// Close releases connections. It is called once, after stop.
	Close() error
}

// Scheduler is implemented by designs with delayed tasks.
type Scheduler interface {
	// Schedule adds one task to start at t.Due (which may be in the past:
	// then it is due at once).
	Schedule(ctx context.Context, t Task) error
}

// Batcher is implemented by designs with a batch enqueue API.
type Batcher interface {
	// EnqueueBatch adds tasks for immediate processing in one call.
	EnqueueBatch(ctx context.Context, ts []Task) error
}

// BatchScheduler is implemented by designs with a batch schedule API.
type BatchScheduler interface {
	// ScheduleBatch adds delayed tasks in one call.
	ScheduleBatch(ctx context.Context, ts []Task) error
}

// Dispatcher lets the dispatch scenario time only the move of due tasks to
// the ready list(s). The harness calls, in order:
//
//	SeedDue(all tasks, every Due in the past)   — not timed
//	StartDispatchers(n)                         — not timed
//	clock starts; Release(); poll ReadyCount until it reaches len(tasks); clock stops
//	stop()
//
// SeedDue must leave the backlog where the movers will find it but must not
// let them move anything before Release: either keep it invisible until
// Release makes it visible in O(1) (naive, asynq and the engine build it
// under a temporary key and RENAME it in; the engine also pushes the wake
// tokens its idle dispatchers block on), or have StartDispatchers only
// prepare the movers and Release start them. The first keeps the movers'
// start-up (connections, first reads) out of the timed span.
type Dispatcher interface {
	SeedDue(ctx context.Context, ts []Task) error
	StartDispatchers(ctx context.Context, n int) (stop func() error, err error)
	Release(ctx context.Context) error
	// ReadyCount is the number of tasks in the ready list(s), waiting for a worker.
	ReadyCount(ctx context.Context) (int64, error)
}

// Cleaner is implemented by designs that also write outside their
// KeyPatterns (members of global sets, ...). Cleanup runs before Close, only
// when the harness runs against a shared server.
type Cleaner interface {
	Cleanup(ctx context.Context) error
}

// Idler is implemented by designs whose idle consumers wake on periods of
// their own (an idle wait, a heartbeat, a reap interval): the idle scenario
// measures over at least three times the longest, so that every period
// fires several times in the window.
type Idler interface {
	IdleIntervals() map[string]time.Duration
}

// RoundTripCounter is implemented by designs whose connections count their
// round trips (each wait for replies, however many commands a pipeline
// carried), for the idle scenario.
type RoundTripCounter interface {
	RoundTrips() int64
}

// ErrNotImplemented is returned (wrapped) by adapters not yet written.
var ErrNotImplemented = errors.New("not implemented")

// ErrUnsupported is returned (wrapped) by Open when an implementation cannot
// run against the given server (asynq on Redis < 4, ...).
var ErrUnsupported = errors.New("unsupported")

// isSkip reports whether err means "skip this implementation".
func isSkip(err error) bool {
	return errors.Is(err, ErrNotImplemented) || errors.Is(err, ErrUnsupported)
}

// registry maps implementation names to constructors.
var (
	registryMu sync.Mutex
	registry   = map[string]func() Impl{}
)

// register adds an implementation constructor; called from init functions.
func register(name string, fn func() Impl) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[name]; dup {
		panic("bench: implementation registered twice: " + name)
	}
	registry[name] = fn
}

// newImpl returns a fresh instance of the named implementation.
func newImpl(name string) (Impl, error) {
	registryMu.Lock()
	fn, ok := registry[name]
	registryMu.Unlock()
	if !ok {
		return nil, fmt.Errorf("unknown implementation %q (known: %s)", name, strings.Join(implNames(), ", "))
	}
	return fn(), nil
}

// implNames lists registered implementations, sorted.
func implNames() []string {
	registryMu.Lock()
	defer registryMu.Unlock()
	var names []string
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// encodeTask packs a task's ID and payload into one string-safe byte slice,
// "ID|payload", for designs whose only per-task datum is an opaque blob.
func encodeTask(t Task) []byte {
	b := make([]byte, 0, len(t.ID)+1+len(t.Payload))
	b = append(b, t.ID...)
	b = append(b, '|')
	return append(b, t.Payload...)
}

// decodeTask reverses encodeTask.
func decodeTask(b []byte) (Delivery, error) {
	i := bytes.IndexByte(b, '|')
	if i < 0 {
		return Delivery{}, fmt.Errorf("malformed task blob %.40q", b)
	}
	return Delivery{ID: string(b[:i]), Payload: b[i+1:]}, nil
}

// group runs goroutines until its context is cancelled and remembers the
// first error; it backs the stop functions of the implementations here.
type group struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	err    error
}

// newGroup returns a group whose context is derived from the background (so
// that its goroutines outlive the ctx of the call that started them).
func newGroup() *group {
	ctx, cancel := context.WithCancel(context.Background())
	return &group{ctx: ctx, cancel: cancel}
}

// Go starts fn in a goroutine.
func (g *group) Go(fn func(ctx context.Context) error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := fn(g.ctx); err != nil && g.ctx.Err() == nil {
			g.mu.Lock()
			if g.err == nil {
				g.err = err
			}
			g.mu.Unlock()
		}
	}()
}

// Stop cancels the goroutines, waits for them and returns the first error.
func (g *group) Stop() error {
	g.cancel()
	g.wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// sleepCtx sleeps for d or until ctx is done; it reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
