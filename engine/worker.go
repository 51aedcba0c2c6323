package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
	"github.com/google/uuid"
)

// Worker runs tasks from a set of queues with Config.Concurrency handlers
// at once, in one process. Taking a task is one atomic RPOPLPUSH from a
// ready list into the process's in-flight list, so a task is never only
// in memory; claiming it moves it to the process's pending set with a
// lease. A worker proves it is alive with a heartbeat key whose TTL the
// server keeps; when it disappears, a Reaper returns the worker's tasks.
//
// Idle, a worker sends about one command per IdleWait plus its heartbeat:
// its handler slots wait in memory, and one goroutine blocks in BLPOP on
// the queues' wake-up lists.
type Worker struct {
	pool    *redis.Pool
	cfg     Config
	store   *buckets.Store
	log     *slog.Logger
	handler Handler
	id      string

	queues     []string
	weights    []float64
	notifyKeys []string

	kick   chan struct{} // wakes one idle slot
	idleCh chan struct{} // tells the waiter a slot went idle
	idle   atomic.Int32

	mu        sync.Mutex
	running   map[string]*activeRun // guarded by mu
	started   bool                  // guarded by mu
	stopOnce  sync.Once
	stopReq   chan struct{} // closed: stop taking tasks
	abortOnce sync.Once
	abortCh   chan struct{} // closed: give running tasks back now
	done      chan struct{}

	aborting atomic.Bool // handlers still running were given back
	timers   sync.WaitGroup

	// inflight is read-locked by a slot from its pop until its claim, and
	// write-locked to give back the in-flight list after a lost pop reply
	// (dirty).
	inflight sync.RWMutex
	dirty    atomic.Bool

	processed, failed atomic.Int64

	// born and lastBeat (nanoseconds since born, monotonic) tell whether
	// the heartbeat key may have expired: then a reaper may have
	// forgotten this worker, and it must not take tasks it could die with
	// unseen.
	born     time.Time
	lastBeat atomic.Int64

	// faults is a test seam: called at each step; an error makes the
	// worker behave as if its process had died at that step.
	faults  func(stage, id string) error
	crashed atomic.Bool
}

type activeRun struct {
	rec       *buckets.Record
	cancel    context.CancelFunc
	leaseLost atomic.Bool
	timer     *time.Timer
}

// NewWorker returns a Worker that runs tasks with h (a *Mux, usually).
func NewWorker(pool *redis.Pool, cfg Config, h Handler) (*Worker, error) {
	if pool == nil || h == nil {
		return nil, fmt.Errorf("engine: NewWorker: nil pool or handler: %w", ErrInvalidOption)
	}
	cfg, st, err := cfg.prepare()
	if err != nil {
		return nil, err
	}
	w := &Worker{
		pool: pool, cfg: cfg, store: st, handler: h,
		id:      uuid.NewString(),
		born:    time.Now(),
		kick:    make(chan struct{}, 1),
		idleCh:  make(chan struct{}, 1),
		running: map[string]*activeRun{},
		stopReq: make(chan struct{}),
		abortCh: make(chan struct{}),
		done:    make(chan struct{}),
	}
	w.log = cfg.Logger.With(keyComponent, "worker", keyWorker, w.id)
	for _, q := range cfg.Queues {
		w.queues = append(w.queues, q.Name)
		w.weights = append(w.weights, float64(q.Weight))
		w.notifyKeys = append(w.notifyKeys, st.Keys.Notify(q.Name))
	}
	return w, nil
}

// ID is the worker process's id, as its heartbeat and in-flight keys name it.
func (w *Worker) ID() string { return w.id }

// Processed and Failed count this worker's finished runs.
func (w *Worker) Processed() int64 { return w.processed.Load() }

// Failed counts this worker's runs that failed.
func (w *Worker) Failed() int64 { return w.failed.Load() }

// Run registers the worker, runs tasks until ctx ends or Shutdown is
// called, then shuts down gracefully: it stops taking tasks, lets running
// handlers finish for Config.ShutdownTimeout (or until Shutdown's
// context ends), then returns the unfinished tasks to the front of their
// queues at once and cancels their handlers. Run returns after every
// goroutine it started has ended.
func (w *Worker) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.started {
		w.mu.Unlock()
		return fmt.Errorf("engine: worker already ran: %w", ErrClosed)
	}
	w.started = true
	w.mu.Unlock()
	defer close(w.done)

	if err := w.register(ctx); err != nil {
		return nil // ctx ended before Redis could be reached
	}
	w.log.Info("worker started", "queues", w.queues, "concurrency", w.cfg.Concurrency, "strict", w.cfg.StrictPriority)

	fetchCtx, stopFetch := context.WithCancel(context.Background())
	baseCtx, cancelHandlers := context.WithCancel(context.Background())
	hbCtx, stopBeat := context.WithCancel(context.Background())
	defer stopBeat()
	defer cancelHandlers()
	defer stopFetch()

	var bg, slots group
	bg.Go(func() { w.heartbeat(hbCtx) })
	bg.Go(func() { w.waiter(fetchCtx) })
	for i := 0; i < w.cfg.Concurrency; i++ {
		slots.Go(func() { w.slot(fetchCtx, baseCtx) })
	}
	// Stop fetching when asked to, when the caller's context ends, or
	// when a fault says the process died.
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
	slotsDone := make(chan struct{})
	go func() { slots.Wait(); close(slotsDone) }()
	if !w.crashed.Load() {
		select {
		case <-slotsDone:
		case <-w.abortCh:
			w.giveBack()
		}
	}
	cancelHandlers()
	<-slotsDone
	w.timers.Wait()
	stopBeat()
	bg.Wait()
	if !w.crashed.Load() {
		w.unregister()
	}
	w.log.Info("worker stopped", "processed", w.processed.Load(), "failed", w.failed.Load())
	return nil
}

// Shutdown stops the worker gracefully (see Run) with ctx as the deadline
// for running handlers, and waits for Run to return. A second call with an
// earlier deadline (an already-cancelled context, say) cuts the wait
// short: running tasks go back to their queues at once. Before Run, it
// closes the worker: Run then returns ErrClosed.
func (w *Worker) Shutdown(ctx context.Context) error {
	w.mu.Lock()
	if !w.started {
		w.started = true
		w.mu.Unlock()
		return nil
	}
	w.mu.Unlock()
	stop := context.AfterFunc(ctx, w.abort)
	defer stop()
	w.stopOnce.Do(func() { close(w.stopReq) })
	<-w.done
	return nil
}

// abort ends the grace period: running tasks are given back.
func (w *Worker) abort() { w.abortOnce.Do(func() { close(w.abortCh) }) }

// register writes the first heartbeat, retrying with backoff while Redis
// cannot be reached, so that a worker started before its Redis waits.
func (w *Worker) register(ctx context.Context) error {
	var bo retryBackoff
	for {
		err := w.beat(ctx)
		if err == nil {
			return nil
		}
		if !bo.wait(ctx, w.log, "worker registration", err) {
			return ctx.Err()
		}
	}
}

func (w *Worker) beat(ctx context.Context) error {
	host, _ := os.Hostname()
	info, _ := json.Marshal(map[string]any{
		"host": host, "pid": os.Getpid(), "queues": w.queues,
		"concurrency": w.cfg.Concurrency, "at": w.cfg.Clock.Now().UTC().Format(time.RFC3339),
	})
	conn, err := w.pool.GetContext(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	sent := time.Since(w.born)
	if err := w.store.Beat(ctx, conn, w.id, int64(w.cfg.HeartbeatTTL/time.Second), info); err != nil {
		return err
	}
	w.lastBeat.Store(int64(sent))
	return nil
}

// alive reports whether the heartbeat key certainly still exists: the
// last beat that succeeded was sent less than HeartbeatTTL minus one
// interval ago. Past that a reaper may declare this worker dead, return
// its tasks and forget it; a forgotten worker that then took a task and
// died would leave it where no reaper looks.
func (w *Worker) alive() bool {
	since := time.Since(w.born) - time.Duration(w.lastBeat.Load())
	return since < w.cfg.HeartbeatTTL-w.cfg.HeartbeatInterval
}

func (w *Worker) heartbeat(ctx context.Context) {
	t := time.NewTicker(w.cfg.HeartbeatInterval)
	defer t.Stop()
	fails := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := w.beat(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			fails++
			if fails == 1 || fails%10 == 0 {
				w.log.Warn("heartbeat failed; taking no tasks once the TTL is near, and running ones may be recovered elsewhere",
					keyErr, err, "ttl", w.cfg.HeartbeatTTL, "failures", fails)
			}
			continue
		}
		fails = 0
	}
}

// waiter blocks in BLPOP on the queues' wake-up lists while some slot is
// idle, and wakes one slot per token or idle timeout.
func (w *Worker) waiter(ctx context.Context) {
	b := &blocker{pool: w.pool}
	defer b.close()
	var bo retryBackoff
	for ctx.Err() == nil {
		if w.idle.Load() == 0 {
			select {
			case <-ctx.Done():
				return
			case <-w.idleCh:
			}
			continue
		}
		_, err := blockPop(ctx, b, w.notifyKeys, w.cfg.IdleWait)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if buckets.IsServerError(err) {
				// A wake-up list of the wrong type: set it aside, and let a
				// slot look at the queues meanwhile.
				setAside(ctx, w.pool, w.store, w.log, "list", w.notifyKeys...)
				w.kickOne()
			}
			if !bo.wait(ctx, w.log, "worker wake-up wait", err) {
				return
			}
			continue
		}
		bo.reset()
		w.kickOne()
	}
}

func (w *Worker) kickOne() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *Worker) waitIdle(ctx context.Context) {
	w.idle.Add(1)
	defer w.idle.Add(-1)
	select {
	case w.idleCh <- struct{}{}:
	default:
	}
	select {
	case <-ctx.Done():
	case <-w.kick:
	}
}

// order is the order to try the queues in for one fetch: as configured
// under strict priority; otherwise a weighted random order, so each
// queue comes first in proportion to its weight.
func (w *Worker) order() []string {
	if w.cfg.StrictPriority || len(w.queues) == 1 {
		return w.queues
	}
	type kq struct {
		k float64
		q string
	}
	ks := make([]kq, len(w.queues))
	for i, q := range w.queues {
		// Efraimidis-Spirakis: sorting by u^(1/w) samples without
		// replacement in proportion to weight.
		ks[i] = kq{math.Pow(rand.Float64(), 1/w.weights[i]), q}
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i].k > ks[j].k })
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.q
	}
	return out
}

// slot is one handler slot: take a task, claim it, run it, record the
// result; wait when every queue is empty.
//
// Round trips per task: the claim's read, the claim (which leaves a WATCH
// on the record held on the slot's connection), and the result, which is
// built from the claimed record without reading it again and carries the
// next RPOPLPUSH in the same round trip. Any change to the record since
// the claim (a lease given back, a reaper) voids the held watch, and the
// result is then recorded the checked way.
func (w *Worker) slot(fetchCtx, baseCtx context.Context) {
	h := &connHolder{pool: w.pool}
	defer h.close()
	var (
		bo   retryBackoff
		next popped // taken with the previous result, already in f:<w>
	)
	for fetchCtx.Err() == nil {
		p := next
		next = popped{}
		if p.id == "" {
			if w.dirty.Load() {
				w.recoverOwnInflight(fetchCtx)
			}
			if !w.alive() {
				// Heartbeats are failing: take nothing until one succeeds.
				if !sleep(fetchCtx, min(w.cfg.HeartbeatInterval, time.Second)) {
					return
				}
				continue
			}
			conn, err := h.get(fetchCtx)
			if err != nil {
				if !bo.wait(fetchCtx, w.log, "fetch", err) {
					return
				}
				continue
			}
			w.inflight.RLock()
			p.id, p.q, err = w.fetch(fetchCtx, conn)
			if err != nil {
				w.inflight.RUnlock()
				if !buckets.IsServerError(err) {
					// The reply may be lost after the server moved a task
					// into the in-flight list: give the list back when quiet.
					w.dirty.Store(true)
				}
				h.drop()
				if !bo.wait(fetchCtx, w.log, "fetch", err) {
					return
				}
				continue
			}
			bo.reset()
			if p.id == "" {
				w.inflight.RUnlock()
				w.waitIdle(fetchCtx)
				continue
			}
		}
		// The read lock is held from the pop until the claim, so that a
		// worker giving back its own in-flight list never takes an id a
		// slot is about to claim.
		w.kickOne() // there may be more: let another idle slot look
		if w.fault("after-pop", p.id) {
			w.inflight.RUnlock()
			return
		}
		rec, held := w.claim(fetchCtx, h, p.q, p.id)
		w.inflight.RUnlock()
		if rec == nil {
			continue
		}
		if w.fault("after-claim", p.id) {
			return
		}
		next = w.execute(fetchCtx, baseCtx, h, rec, held)
	}
	if next.id != "" {
		w.inflight.RUnlock()
	}
}

// popped is a task moved into the in-flight list, not yet claimed.
type popped struct{ id, q string }

// recoverOwnInflight gives this worker's in-flight list back to the
// queues after a pop whose reply was lost: it holds the write lock, so no
// slot is between a pop and its claim, and everything in the list is
// such a lost pop.
func (w *Worker) recoverOwnInflight(ctx context.Context) {
	// Never make the other slots wait: if one is between a pop and its
	// claim, try again on a later turn.
	if !w.inflight.TryLock() {
		return
	}
	defer w.inflight.Unlock()
	if !w.dirty.Load() {
		return
	}
	conn, err := w.pool.GetContext(ctx)
	if err != nil {
		return
	}
	defer conn.Close()
	res, err := w.store.RecoverAllInflight(ctx, conn, w.id, ms(w.cfg.Clock.Now()))
	if res.Requeued+res.Buried > 0 {
		w.log.Warn("returned tasks whose pop reply was lost", "requeued", res.Requeued, "buried", res.Buried)
	}
	if err == nil {
		w.dirty.Store(false)
	}
}

// fetch takes one task from the first queue in order() that has one. A
// queue whose ready list (or the in-flight list) has the wrong type is set
// aside and the other queues are tried; a connection failure is returned.
func (w *Worker) fetch(ctx context.Context, conn redis.Conn) (id, q string, err error) {
	var bad error
	for _, q := range w.order() {
		id, err := w.store.Pop(ctx, conn, q, w.id)
		if err != nil && buckets.IsServerError(err) {
			setAside(context.Background(), w.pool, w.store, w.log, "list", w.store.Keys.Ready(q), w.store.Keys.Inflight(w.id))
			bad = err
			continue
		}
		if err != nil || id != "" {
			return id, q, err
		}
	}
	return "", "", bad
}

// claim records the popped task as running. A failure to reach Redis is
// retried: the id is safe in the in-flight list meanwhile, and if the
// worker stops first, it gives the in-flight list back on its way out.
func (w *Worker) claim(ctx context.Context, h *connHolder, q, id string) (*buckets.Record, *txn.Held) {
	var (
		bo retryBackoff
		cs buckets.ClaimState // recognises our own claim if a reply is lost
	)
	for {
		conn, err := h.get(ctx)
		if err == nil {
			rec, res, cerr := w.store.Claim(ctx, conn, w.id, q, id, ms(w.cfg.Clock.Now()), w.leaseDeadline, true, &cs)
			if cerr == nil {
				switch res {
				case buckets.Buried:
					w.log.Error("task record missing or malformed; sent to the dead letters", keyTaskID, id, keyQueue, q)
				case buckets.Skipped:
					w.log.Debug("task cancelled or not waiting; dropped", keyTaskID, id, keyQueue, q)
				}
				if rec == nil {
					return nil, nil
				}
				return rec, cs.Held()
			}
			err = cerr
			h.drop()
		}
		if !bo.wait(ctx, w.log, "claim", err) {
			return nil, nil
		}
	}
}

func (w *Worker) leaseDeadline(r *buckets.Record) int64 {
	return ms(w.cfg.Clock.Now()) + r.TimeoutMs + w.cfg.LeaseGrace.Milliseconds()
}

// execute runs the handler and records the outcome. held is the
// connection on which the claim left a WATCH on the record (nil if none).
// It returns a task taken with the result, if any (the read lock on the
// in-flight list is then held).
func (w *Worker) execute(fetchCtx, baseCtx context.Context, h *connHolder, rec *buckets.Record, held *txn.Held) popped {
	task := taskFromRecord(rec)
	hctx, cancel := context.WithTimeout(baseCtx, task.Timeout)
	run := &activeRun{rec: rec, cancel: cancel}
	w.mu.Lock()
	w.running[rec.ID] = run
	w.mu.Unlock()
	// The lease: past timeout plus grace the handler is taken to be hung,
	// and the task is given to another worker.
	w.timers.Add(1)
	run.timer = time.AfterFunc(time.Until(time.UnixMilli(rec.Deadline))+w.clockOffset(), func() {
		defer w.timers.Done()
		w.expire(run)
	})

	err := callHandler(hctx, w.handler, task)
	cancel()
	if run.timer.Stop() {
		w.timers.Done()
	}
	w.mu.Lock()
	delete(w.running, rec.ID)
	w.mu.Unlock()

	if w.aborting.Load() || run.leaseLost.Load() {
		return popped{} // given back already
	}
	if err != nil && hctx.Err() == context.DeadlineExceeded && baseCtx.Err() == nil {
		err = fmt.Errorf("timed out after %v: %w", task.Timeout, err)
	}
	if w.fault("before-finish", rec.ID) {
		return popped{}
	}
	next := w.finish(fetchCtx, baseCtx, h, rec, held, err)
	if w.fault("after-finish", rec.ID) && next.id != "" {
		w.inflight.RUnlock()
		return popped{}
	}
	return next
}

func (w *Worker) clockOffset() time.Duration { return time.Since(w.cfg.Clock.Now()) }

// finish records a run's outcome, retrying while Redis is unreachable.
// With the claim's watch still held on the slot's connection it does so in
// one round trip that also takes the next task, which it returns (with the
// in-flight read lock held).
func (w *Worker) finish(fetchCtx, ctx context.Context, h *connHolder, rec *buckets.Record, held *txn.Held, herr error) popped {
	now := w.cfg.Clock.Now()
	decide := func(r *buckets.Record) buckets.Outcome { return w.decide(r, now, herr) }
	var next popped
	cut := false // a connection failed after a result may have been sent
	if held != nil && h.conn == held.Conn() && h.conn.Err() == nil {
		var pop []txn.Cmd
		if fetchCtx.Err() == nil && w.alive() {
			next.q = w.order()[0]
			pop = []txn.Cmd{w.store.PopNext(next.q, w.id)}
			w.inflight.RLock()
		}
		r, out, reps, err := w.store.FinishHeld(ctx, held, w.id, rec, ms(now), w.cfg.doneTTL(), decide, pop)
		if pop != nil {
			if len(reps) == 1 {
				next.id, _ = redis.String(reps[0], nil)
			} else {
				w.dirty.Store(true) // the pop's reply is lost
			}
			if next.id == "" {
				w.inflight.RUnlock()
				next = popped{}
			}
		}
		switch {
		case err == nil:
			w.logOutcome(r, out, herr)
			return next
		case errors.Is(err, buckets.ErrWatchLost):
			// The record changed since the claim: the checked way says why.
		default:
			h.drop()
			cut = true
		}
	}
	var bo retryBackoff
	for {
		conn, err := h.get(context.WithoutCancel(ctx))
		if err == nil {
			var r *buckets.Record
			var out buckets.Outcome
			r, out, err = w.store.Finish(ctx, conn, w.id, rec.ID, rec.Runs, ms(now), w.cfg.doneTTL(), decide)
			if err == nil {
				w.logOutcome(r, out, herr)
				return next
			}
			if errors.Is(err, buckets.ErrLeaseLost) || errors.Is(err, buckets.ErrNotFound) || errors.Is(err, buckets.ErrMalformed) {
				w.unfinishable(ctx, rec, err, cut)
				return next
			}
			h.drop()
			cut = true
		}
		if ctx.Err() != nil {
			// Shutting down and Redis is unreachable: the task stays
			// running in the pending set and is recovered by a reaper.
			w.log.Error("could not record a task's result before shutdown", keyTaskID, rec.ID, keyErr, err)
			return next
		}
		if !bo.wait(ctx, w.log, "record result", err) {
			return next
		}
	}
}

// unfinishable handles a result that no retry can record: the record is
// no longer this run's. After a cut connection that may be this very
// result, recorded before the reply was lost: the record then shows this
// run finished (same run number, same recoveries, not running). Otherwise
// the lease was lost (a reaper returned the task) and it runs again.
func (w *Worker) unfinishable(ctx context.Context, rec *buckets.Record, err error, cut bool) {
	attrs := []any{keyTaskID, rec.ID, keyType, rec.Type, keyErr, err}
	if cut && w.ownResult(ctx, rec, err) {
		w.log.Debug("result already recorded before the connection dropped", attrs...)
		return
	}
	if errors.Is(err, buckets.ErrLeaseLost) {
		w.log.Warn("task was recovered elsewhere while it ran; its result is dropped", attrs...)
		return
	}
	w.log.Error("task record deleted or corrupted while it ran; its result is dropped", attrs...)
	// Its pending entry would otherwise wait for a reaper.
	conn := w.pool.Get()
	_, _ = conn.Do("ZREM", w.store.Keys.Pending(w.id), rec.ID)
	conn.Close()
}

// ownResult reports whether the record now shows rec's run as finished by
// this worker: done or dead, or waiting for a retry, with the same run
// number and recoveries. A record gone after a cut is taken as a done task
// whose record was not kept (DoneRetention < 0).
func (w *Worker) ownResult(ctx context.Context, rec *buckets.Record, err error) bool {
	if errors.Is(err, buckets.ErrNotFound) {
		return w.cfg.DoneRetention < 0
	}
	conn := w.pool.Get()
	defer conn.Close()
	now, _, rerr := w.store.Records(ctx, conn, []string{rec.ID})
	if rerr != nil || len(now) != 1 || now[0] == nil {
		return false
	}
	r := now[0]
	return r.Runs == rec.Runs && r.Recoveries == rec.Recoveries && r.State != buckets.StateRunning
}

// decide turns a handler's result into the record's next state.
func (w *Worker) decide(r *buckets.Record, now time.Time, herr error) buckets.Outcome {
	var ra *retryAfter
	switch {
	case herr == nil:
		return buckets.Done
	case errors.As(herr, &ra):
		r.State = buckets.StateWaiting
		r.Due = msCeil(now.Add(ra.d))
		return buckets.Again
	}
	t := taskFromRecord(r)
	r.Attempts++
	r.LastError = truncateErr(herr)
	if errors.Is(herr, ErrNoHandler) && w.cfg.UnknownType == UnknownDead {
		return buckets.Bury
	}
	if IsPermanent(herr) || r.Attempts >= r.MaxAttempts {
		return buckets.Bury
	}
	r.State = buckets.StateRetry
	r.Due = msCeil(now.Add(max(w.cfg.RetryDelay(t, r.Attempts, herr), 0)))
	return buckets.Again
}

func truncateErr(err error) string {
	s := err.Error()
	var p *PanicError
	if errors.As(err, &p) {
		s += "\n" + p.Stack
	}
	if len(s) > buckets.MaxErrorLen {
		s = s[:buckets.MaxErrorLen]
	}
	return s
}

func (w *Worker) logOutcome(r *buckets.Record, out buckets.Outcome, herr error) {
	attrs := []any{keyTaskID, r.ID, keyType, r.Type, keyQueue, r.Queue, keyAttempt, r.Attempts}
	switch out {
	case buckets.Done:
		w.processed.Add(1)
	case buckets.Again:
		if r.State == buckets.StateRetry {
			w.failed.Add(1)
			w.log.Warn("task failed; will retry", append(attrs, keyErr, herr, "retry_at", fromMs(r.Due))...)
		}
	case buckets.Bury:
		w.failed.Add(1)
		w.log.Error("task failed; sent to the dead letters", append(attrs, keyErr, herr)...)
	}
}

// expire gives a hung run's task back so another worker can run it. The
// handler goroutine keeps its slot until it returns.
func (w *Worker) expire(run *activeRun) {
	run.leaseLost.Store(true)
	run.cancel()
	w.log.Warn("task ran past its timeout and lease; giving it to another worker",
		keyTaskID, run.rec.ID, keyType, run.rec.Type, "timeout", time.Duration(run.rec.TimeoutMs)*time.Millisecond)
	w.requeue([]string{run.rec.ID}, buckets.LeaseExpired)
}

// giveBack returns every running task to the front of its queue at once
// (shutdown deadline passed); their handlers are cancelled next.
func (w *Worker) giveBack() {
	w.aborting.Store(true)
	w.mu.Lock()
	ids := make([]string, 0, len(w.running))
	for id := range w.running {
		ids = append(ids, id)
	}
	w.mu.Unlock()
	if len(ids) > 0 {
		w.log.Warn("shutdown deadline passed; returning unfinished tasks", "tasks", len(ids))
		w.requeue(ids, buckets.Shutdown)
	}
}

func (w *Worker) requeue(ids []string, why buckets.Reason) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var bo retryBackoff
	for {
		conn, err := w.pool.GetContext(ctx)
		if err == nil {
			_, err = w.store.Requeue(ctx, conn, w.id, ids, ms(w.cfg.Clock.Now()), why, w.cfg.maxRecoveries())
			conn.Close()
			if err == nil {
				return
			}
		}
		if !bo.wait(ctx, w.log, "return tasks", err) {
			w.log.Error("could not return tasks; a reaper will recover them", "tasks", len(ids), keyErr, err)
			return
		}
	}
}

// unregister gives back anything left in the in-flight list and removes
// the worker from the registry.
func (w *Worker) unregister() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var bo retryBackoff
	for fresh := false; ; fresh = true {
		err := w.unregisterOnce(ctx, fresh)
		if err == nil {
			return
		}
		// A pooled connection may have gone stale: try a fresh one.
		if !bo.wait(ctx, w.log, "unregister", err) {
			w.log.Error("could not unregister; a reaper will recover what is left once the heartbeat expires", keyErr, err)
			return
		}
	}
}

// unregisterOnce returns the in-flight list and forgets the worker, on a
// pooled connection or, after a failure (the pool's idle connections may
// all have been closed by the server), on a freshly dialled one.
func (w *Worker) unregisterOnce(ctx context.Context, fresh bool) error {
	var (
		conn redis.Conn
		err  error
	)
	if fresh {
		conn, err = dialFresh(ctx, w.pool)
	} else {
		conn, err = w.pool.GetContext(ctx)
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := w.store.RecoverAllInflight(ctx, conn, w.id, ms(w.cfg.Clock.Now())); err != nil {
		return err
	}
	ok, err := w.store.Forget(ctx, conn, w.id, false)
	if err != nil {
		return err
	}
	if !ok {
		w.log.Warn("worker left tasks behind; a reaper will recover them once its heartbeat expires")
	}
	return nil
}

// fault runs the test seam; true means "this process just died": stop
// everything without cleaning up, as SIGKILL would.
func (w *Worker) fault(stage, id string) bool {
	if w.faults == nil || w.crashed.Load() {
		return w.crashed.Load()
	}
	if err := w.faults(stage, id); err != nil {
		w.crashed.Store(true)
		w.aborting.Store(true)
		w.stopOnce.Do(func() { close(w.stopReq) })
		w.abort()
		return true
	}
	return false
}
