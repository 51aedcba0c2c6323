package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
	"github.com/gomodule/redigo/redis"
	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"
)

// Worker runs tasks from a set of queues with Config.Concurrency handlers
// at once, in one process. Taking a task is one atomic RPOPLPUSH from a
// ready list into the process's in-flight list, so a task is never only
// in memory; claiming it moves it to the process's pending set with a
// lease. A worker proves it is alive with a heartbeat key whose TTL the
// server keeps; when it disappears, a Reaper returns the worker's tasks.
//
// Idle, a worker sends a BLPOP and a look at its queues per IdleWait and
// a heartbeat per HeartbeatInterval (one SETEX, or one MULTI with its
// types), and a re-subscription to the control channel now and then: one
// goroutine blocks in BLPOP on the queues' wake-up lists. It reads its
// in-flight list only after it popped tasks (docs/design.md, "What an
// idle process sends").
//
// Its parts, one file each: the heartbeater (heartbeat.go), the waiter
// (waiter.go), the fetcher that pops and claims (fetcher.go), the
// processor that bounds concurrency with one semaphore (processor.go),
// the runner with its lease timers (runner.go), the finisher that records
// results and reconciles lost replies (finisher.go), the retry policy
// (retry.go), the requeuer (requeuer.go), and the in-flight recoverer
// (inflight.go).
type worker struct {
	pool *redis.Pool
	cfg  Config
	// progress writes what handlers report with SetProgress.
	progress *progressWriter
	store    store
	keys     buckets.Keys
	log      *slog.Logger
	handler  Handler
	id       string

	// types lists the task types the handler serves, sorted, when it
	// says (a *Mux does: TypeLister); nil means every type.
	types []string
	// serves reports whether the handler serves a type; nil: every type.
	serves func(typ string) bool

	control   *control
	hb        *heartbeater
	inflight  *inflightSet
	recoverer *recoverer
	fetcher   *fetcher
	proc      *processor
	runs      *runner
	finisher  *finisher
	requeuer  *requeuer

	mu        sync.Mutex
	started   bool // guarded by mu
	stopOnce  sync.Once
	stopReq   chan struct{} // closed: stop taking tasks
	abortOnce sync.Once
	abortCh   chan struct{} // closed: give running tasks back now
	done      chan struct{} // closed when Run has returned
	runErr    error         // Run's result, read after done is closed

	processed, failed atomic.Int64
	chained           atomic.Int64 // batches taken with the results before them
	ahead             atomic.Int64 // tasks of batches beyond the slots (ClaimedAhead)
}

// NewWorker returns a Worker that runs tasks with h (a *Mux, usually).
func newWorker(pool *redis.Pool, cfg Config, h Handler) (*worker, error) {
	if pool == nil || h == nil {
		return nil, fmt.Errorf("engine: NewWorker: nil pool or handler: %w", ErrInvalid)
	}
	cfg, st, err := cfg.prepare(pool)
	if err != nil {
		return nil, err
	}
	w := &worker{
		pool: pool, cfg: cfg, keys: st.Keys, handler: h,
		id:      uuid.NewString(),
		stopReq: make(chan struct{}),
		abortCh: make(chan struct{}),
		done:    make(chan struct{}),
	}
	w.log = cfg.Logger.With(keyComponent, "worker", keyWorker, w.id)
	w.store = &redisStore{
		st: st, log: w.log, lanes: w.lane, id: w.id, doneTTL: cfg.doneTTL(), maxRecoveries: cfg.maxRecoveries(),
		now: func() int64 { return ms(cfg.Advanced.Clock.Now()) },
		deadline: func(r *buckets.Record) int64 {
			return ms(cfg.Advanced.Clock.Now()) + r.TimeoutMs + cfg.Advanced.LeaseGrace.Milliseconds()
		},
	}
	w.control = newControl(controlParams{store: w.store, pool: pool, channel: st.Keys.Control(), idleWait: cfg.Advanced.IdleWait, log: w.log})
	w.hb = newHeartbeater(heartbeatParams{store: w.store, ttl: cfg.Advanced.HeartbeatTTL, interval: cfg.Advanced.HeartbeatInterval,
		clock: cfg.Advanced.Clock, beats: clockwork.NewRealClock(), queues: queueNames(cfg.Queues), concurrency: cfg.Concurrency, log: w.log})
	w.inflight = newInflightSet()
	w.recoverer = &recoverer{store: w.store, inflight: w.inflight, lane: w.lane, interval: cfg.Advanced.HeartbeatInterval, log: w.log}
	w.fetcher = newFetcher(w)
	w.proc = newProcessor(w)
	w.progress = newProgressWriter(pool, st, cfg, w.log)
	w.finisher = &finisher{w: w, policy: retryPolicy{cfg: cfg}}
	w.requeuer = &requeuer{store: w.store, lane: w.lane, observe: w.cfg.observeRecovered, log: w.log}
	w.runs = newRunner(runnerParams{handler: h, clock: cfg.Advanced.Clock, maxResult: cfg.MaxResult,
		progress: w.progress, requeuer: w.requeuer, log: w.log})
	return w, nil
}

// ID is the worker process's id, as its heartbeat and in-flight keys name it.
func (w *worker) ID() string { return w.id }

// Processed counts this worker's runs that succeeded.
func (w *worker) Processed() int64 { return w.processed.Load() }

// Failed counts this worker's runs that failed.
func (w *worker) Failed() int64 { return w.failed.Load() }

// Chained counts the batches this worker took in the same round trip as
// the results of the batch before them: while the queues are deep, a
// batch of every slot (Concurrency at most ClaimBatch) sends the next
// batch's pops behind its results' EXEC (docs/design.md, "The worker").
func (w *worker) Chained() int64 { return w.chained.Load() }

// ClaimedAhead counts the tasks this worker claimed ahead of its handler
// slots (Config.Advanced.Prefetch): those of each batch beyond Concurrency.
func (w *worker) ClaimedAhead() int64 { return w.ahead.Load() }

// Run registers the worker, runs tasks until ctx ends or Shutdown is
// called, then shuts down gracefully: it stops taking tasks, lets running
// handlers finish for Config.ShutdownTimeout (or until Shutdown's
// deadline, see Shutdown), then returns the unfinished tasks to the front of their
// queues at once and cancels their handlers. Run returns after every
// goroutine it started has ended.
//
// Run returns nil after a clean stop. Otherwise it returns, joined with
// errors.Join: ErrClosed if the worker already ran or was shut down; the
// context's error (wrapped) if it was stopped before Redis could be
// reached to register; the error of giving unfinished tasks back at the
// deadline; the error of unregistering (tasks are then left for a reaper).
func (w *worker) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.started {
		w.mu.Unlock()
		return fmt.Errorf("engine: worker already ran: %w", ErrClosed)
	}
	w.started = true
	w.mu.Unlock()
	defer close(w.done)
	w.runErr = w.run(ctx)
	return w.runErr
}

func (w *worker) run(ctx context.Context) error {
	regCtx, stopReg := context.WithCancel(ctx)
	go func() {
		select {
		case <-w.stopReq:
			stopReg()
		case <-regCtx.Done():
		}
	}()
	w.listTypes()
	err := w.hb.register(regCtx)
	stopReg()
	if err != nil {
		return fmt.Errorf("engine: worker: stopped before it could register: %w", err)
	}
	w.log.Info("worker started", "queues", w.fetcher.queues, "concurrency", w.cfg.Concurrency, "strict", w.cfg.StrictPriority)

	// Run's ctx ends the fetching (the stop request), not the handlers or
	// the bookkeeping; its values (a round-trip bound, txn.WithRoundTrip)
	// are kept.
	detached := context.WithoutCancel(ctx)
	fetchCtx, stopFetch := context.WithCancel(detached)
	baseCtx, cancelHandlers := context.WithCancel(detached)
	bgCtx, stopBg := context.WithCancel(detached)
	defer stopBg()
	defer cancelHandlers()
	defer stopFetch()

	// Know the paused queues before the first fetch (the claim checks
	// anyway); the subscriber keeps them.
	if err := w.control.reread(regCtx); err != nil && regCtx.Err() == nil {
		w.log.Warn("could not read the paused queues; the control channel will tell", keyErr, err)
	}
	var bg, work sync.WaitGroup
	bg.Go(func() { w.control.run(bgCtx) })
	bg.Go(func() { w.hb.run(bgCtx) })
	bg.Go(func() { w.recoverer.run(bgCtx) })
	progressCtx, stopProgress := context.WithCancel(detached)
	defer stopProgress()
	var progressDone sync.WaitGroup
	progressDone.Go(func() { w.progress.run(progressCtx) })
	work.Go(func() { w.proc.run(fetchCtx, baseCtx) })

	select {
	case <-ctx.Done():
		// Nobody called Shutdown: running handlers get ShutdownTimeout.
		if w.cfg.ShutdownTimeout < 0 {
			w.abort()
		} else {
			t := time.AfterFunc(w.cfg.ShutdownTimeout, w.abort)
			defer t.Stop()
		}
	case <-w.stopReq:
	}
	stopFetch()

	// Let running handlers finish until the deadline.
	workDone := make(chan struct{})
	go func() { work.Wait(); close(workDone) }()
	var errs []error
	select {
	case <-workDone:
	case <-w.abortCh:
		errs = append(errs, w.runs.giveBack())
	}
	cancelHandlers()
	<-workDone
	w.runs.wait()
	stopProgress() // every run offered its last report: write them
	progressDone.Wait()
	stopBg()
	bg.Wait()
	errs = append(errs, w.unregister())
	w.log.Info("worker stopped", "processed", w.processed.Load(), "failed", w.failed.Load())
	return errors.Join(errs...)
}

// shutdownSlack is how long Shutdown waits past its deadline for Run to
// give the unfinished tasks back before it returns.
const shutdownSlack = 250 * time.Millisecond

// Shutdown stops the worker gracefully (see Run) and lets running
// handlers finish until the earlier of ctx's deadline and
// Config.ShutdownTimeout from the call (negative: at once); it then
// cancels their contexts and gives their tasks back to the front of their
// queues. It waits for Run to return, or for that deadline plus a slack
// of 250 ms, whichever comes first. A second call with an earlier
// deadline (an already-cancelled context, say) cuts the wait short. Before
// Run, it closes the worker: Run then returns ErrClosed.
//
// It returns nil when every handler finished in time and Run stopped
// cleanly; Run's error when Run returned one; and an error matching
// ctx.Err(), or context.DeadlineExceeded when ShutdownTimeout passed
// (errors.Is), when the deadline came first: unfinished tasks were then
// given back, or are being given back by Run in the background.
func (w *worker) Shutdown(ctx context.Context) error {
	w.mu.Lock()
	if !w.started {
		w.started = true
		w.mu.Unlock()
		return nil
	}
	w.mu.Unlock()
	ctx, cancel := boundShutdown(ctx, w.cfg.ShutdownTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, w.abort)
	defer stop()
	w.stopOnce.Do(func() { close(w.stopReq) })
	select {
	case <-w.done:
		if ctx.Err() == nil {
			return w.runErr
		}
	case <-ctx.Done():
	}
	t := time.NewTimer(shutdownSlack)
	defer t.Stop()
	cerr := fmt.Errorf("engine: worker shutdown: %w", context.Cause(ctx))
	select {
	case <-w.done:
		return errors.Join(cerr, w.runErr)
	case <-t.C:
		return cerr
	}
}

// errShutdownTimeout is the cause of a shutdown deadline set by
// Config.ShutdownTimeout; it matches context.DeadlineExceeded.
type errShutdownTimeout time.Duration

func (e errShutdownTimeout) Error() string {
	return fmt.Sprintf("ShutdownTimeout (%v) passed: %v", time.Duration(e), context.DeadlineExceeded)
}

func (errShutdownTimeout) Is(target error) bool { return target == context.DeadlineExceeded }

// boundShutdown returns ctx bounded by timeout from now (negative: already
// over); the bound's cause is an errShutdownTimeout.
func boundShutdown(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	timeout = max(timeout, 0)
	return context.WithTimeoutCause(ctx, timeout, errShutdownTimeout(timeout))
}

// TypeLister is what a Handler implements to say which task types it
// serves (a *Mux does). A worker whose handler implements it gives a task
// of another type back at once, for a worker that serves it, without
// counting an attempt; it advertises its types in its heartbeat. See
// Config.Advanced.UnknownTypeGrace.
type typeLister interface {
	Types() []string
}

// listTypes reads the handler's types, at start (handlers are registered
// before the worker starts).
func (w *worker) listTypes() {
	tl, ok := w.handler.(typeLister)
	if !ok {
		return
	}
	types := slices.Clone(tl.Types())
	sort.Strings(types)
	if types == nil {
		types = []string{}
	}
	set := make(map[string]bool, len(types))
	for _, t := range types {
		set[t] = true
	}
	w.types = types
	w.serves = func(typ string) bool { return set[typ] }
	w.hb.serve(types)
}

// queueNames lists the names of qs.
func queueNames(qs []QueueConfig) []string {
	names := make([]string, len(qs))
	for i, q := range qs {
		names[i] = q.Name
	}
	return names
}

// setStore replaces the store of the worker and of its parts (tests wrap
// the real one).
func (w *worker) setStore(st store) {
	w.store, w.hb.store, w.recoverer.store, w.requeuer.store, w.control.store, w.fetcher.waiter.store = st, st, st, st, st, st
}

// lane is a connection of the worker's pool for a loop's store calls.
func (w *worker) lane() *lane             { return &lane{h: rconn.Holder{Pool: w.pool}} }
func (w *worker) backoff() *rconn.Backoff { return &rconn.Backoff{} }

// abort ends the grace period: running tasks are given back.
func (w *worker) abort() { w.abortOnce.Do(func() { close(w.abortCh) }) }

// cleanupTries bounds the retries of a step of the way out (giving tasks
// back, unregistering): past it the step is left to a reaper.
const cleanupTries = 8

// unregister gives back anything left in the in-flight list and removes
// the worker from the registry. After a failure it tries again with
// backoff on a freshly tested connection; past cleanupTries it leaves the
// rest to a reaper, which recovers it once the heartbeat expires.
func (w *worker) unregister() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l := w.lane()
	defer l.close()
	bo := w.backoff()
	for {
		err := w.unregisterOnce(ctx, l)
		if err == nil {
			return nil
		}
		if bo.Fails() >= cleanupTries-1 || !bo.Wait(ctx, w.log, "unregister", err) {
			w.log.Error("could not unregister; a reaper will recover what is left once the heartbeat expires", keyErr, err)
			return fmt.Errorf("engine: worker: unregister: %w", err)
		}
	}
}

func (w *worker) unregisterOnce(ctx context.Context, l *lane) error {
	if _, err := w.store.RecoverAll(ctx, l); err != nil {
		return err
	}
	ok, err := w.store.Forget(ctx, l, false)
	if err != nil {
		return err
	}
	if !ok {
		w.log.Warn("worker left tasks behind; a reaper will recover them once its heartbeat expires")
	}
	return nil
}
