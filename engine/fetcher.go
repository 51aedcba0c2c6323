package engine

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// fetcher takes tasks: it picks the order of the queues, pops an id into
// the in-flight list and claims it. When every queue is empty it waits
// with the waiter.
type fetcher struct {
	w       *Worker
	queues  []string
	weights []float64
	waiter  *waiter
	h       rconn.Holder // the fetching loop's connection
	bo      rconn.Backoff

	// A queue whose task the worker gave back for another worker (a type
	// it does not serve) is left out of the fetch order for a while, which
	// doubles while it keeps happening: the task waits at the front for a
	// worker that serves it, and this one does not spin on it.
	skipMu    sync.Mutex
	skipUntil map[string]time.Time     // guarded by skipMu
	skipStep  map[string]time.Duration // guarded by skipMu
}

// Skip intervals after a task is given back for another worker.
const (
	minSkip = 50 * time.Millisecond
	maxSkip = time.Second
)

// skip leaves q out of the fetch order for an interval, which doubles
// when the previous one ended without a claim of q in between (give-backs
// of tasks popped during one interval count once).
func (f *fetcher) skip(q string) {
	f.skipMu.Lock()
	defer f.skipMu.Unlock()
	now := time.Now()
	if until, ok := f.skipUntil[q]; ok && now.Before(until) {
		return
	}
	d := min(max(2*f.skipStep[q], minSkip), maxSkip)
	f.skipStep[q] = d
	f.skipUntil[q] = now.Add(d)
}

// unskip forgets q's interval after a task of q was claimed.
func (f *fetcher) unskip(q string) {
	f.skipMu.Lock()
	defer f.skipMu.Unlock()
	if _, ok := f.skipStep[q]; ok {
		delete(f.skipStep, q)
		delete(f.skipUntil, q)
	}
}

// skipped reports whether q is left out now, and until when.
func (f *fetcher) skipped(q string, now time.Time) (time.Time, bool) {
	f.skipMu.Lock()
	defer f.skipMu.Unlock()
	until, ok := f.skipUntil[q]
	return until, ok && now.Before(until)
}

// available reports whether the worker takes tasks from q now: it is
// neither paused nor skipped.
func (f *fetcher) available(q string, now time.Time) bool {
	if f.w.control.isPaused(q) {
		return false
	}
	_, skip := f.skipped(q, now)
	return !skip
}

func newFetcher(w *Worker) *fetcher {
	f := &fetcher{w: w, waiter: &waiter{w: w}, skipUntil: map[string]time.Time{}, skipStep: map[string]time.Duration{}}
	f.waiter.blocker.Pool = w.pool
	f.h.Pool = w.pool
	for _, q := range w.cfg.Queues {
		f.queues = append(f.queues, q.Name)
		f.weights = append(f.weights, float64(q.Weight))
	}
	return f
}

// claimed is a task claimed by this worker, with the holder whose
// connection keeps the claim's WATCH on the record (held is that watch,
// or nil).
type claimed struct {
	rec  *buckets.Record
	h    *rconn.Holder
	held *txn.Held
}

// next pops one task into the in-flight list, waiting while every queue
// is empty; the in-flight set holds its id until the caller's claim. It
// returns false when ctx ended.
func (f *fetcher) next(ctx context.Context) (popped, bool) {
	w := f.w
	for ctx.Err() == nil {
		if !w.hb.alive() {
			// Heartbeats are failing: take nothing until one succeeds.
			if !rconn.Sleep(ctx, min(w.cfg.HeartbeatInterval, time.Second)) {
				break
			}
			continue
		}
		conn, err := f.h.Get(ctx)
		if err != nil {
			if !f.bo.Wait(ctx, w.log, "fetch", err) {
				break
			}
			continue
		}
		var q string
		id, err := w.inflight.pop(func() (string, bool, error) {
			var id string
			var err error
			id, q, err = f.popAny(ctx, conn)
			return id, err != nil && !buckets.IsServerError(err), err
		})
		if err != nil {
			f.h.Drop()
			if !f.bo.Wait(ctx, w.log, "fetch", err) {
				break
			}
			continue
		}
		f.bo.Reset()
		if id == "" {
			f.waiter.wait(ctx)
			continue
		}
		return popped{id: id, q: q}, true
	}
	return popped{}, false
}

func (f *fetcher) close() {
	f.waiter.close()
	f.h.Close()
}

// order is the order to try the available queues (neither paused nor
// skipped) in for one fetch: as configured under strict priority;
// otherwise a weighted random order, so each queue comes first in
// proportion to its weight. It is empty when no queue is available.
func (f *fetcher) order() []string {
	now := time.Now()
	avail := f.queues
	for i, q := range f.queues {
		if !f.available(q, now) {
			avail = nil
			for j, q := range f.queues {
				if j < i || (j > i && f.available(q, now)) {
					avail = append(avail, q)
				}
			}
			break
		}
	}
	if f.w.cfg.StrictPriority || len(avail) <= 1 {
		return avail
	}
	type kq struct {
		k float64
		q string
	}
	ks := make([]kq, 0, len(avail))
	for i, q := range f.queues {
		if !slices.Contains(avail, q) {
			continue
		}
		// Efraimidis-Spirakis: sorting by u^(1/w) samples without
		// replacement in proportion to weight.
		ks = append(ks, kq{math.Pow(rand.Float64(), 1/f.weights[i]), q})
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i].k > ks[j].k })
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.q
	}
	return out
}

// popAny takes one task from the first queue in order() that has one. A
// queue whose ready list (or the in-flight list) has the wrong type is
// set aside and the other queues are tried; a connection failure is
// returned.
func (f *fetcher) popAny(ctx context.Context, conn redis.Conn) (id, q string, err error) {
	w := f.w
	var bad error
	for _, q := range f.order() {
		id, err := w.store.Pop(ctx, conn, q, w.id)
		if err != nil && buckets.IsWrongType(err) {
			setAside(ctx, w.pool, w.store, w.keys, w.log, "list", w.keys.Ready(q), w.keys.Inflight(w.id))
			bad = err
			continue
		}
		if err != nil || id != "" {
			return id, q, err
		}
	}
	return "", "", bad
}

// claimTries bounds the attempts to claim one popped id. Past them the id
// is given back: it stays in the in-flight list, and the recoverer
// returns it to its queue (or dead-letters it) on its own connection, so
// that no error holds a slot, or the recovery, for longer.
const claimTries = 6

// claim records the popped task as running, and ends the hold on its id
// whatever happens. A failure is retried a few times on a tested
// connection (a lost EXEC reply is recognised by the ClaimState); an
// error reply of the server or a failure that persists gives the id back.
func (f *fetcher) claim(ctx context.Context, h *rconn.Holder, q, id string) (*buckets.Record, *txn.Held) {
	w := f.w
	unlock, ok := w.inflight.lockClaim(ctx, id)
	if !ok {
		// Stopping: the id stays in the in-flight list, which the worker
		// gives back when it unregisters.
		w.inflight.release(id, true)
		return nil, nil
	}
	defer unlock()
	var (
		bo rconn.Backoff
		cs buckets.ClaimState // recognises our own claim if a reply is lost
	)
	for try := 1; ; try++ {
		conn, err := h.Get(ctx)
		if err == nil {
			cs.Serves, cs.UnservedGrace = w.serves, w.cfg.unservedGraceMs()
			rec, res, cerr := w.store.Claim(ctx, conn, w.id, q, id, ms(w.cfg.Clock.Now()), f.leaseDeadline, true, &cs)
			if cerr == nil {
				w.inflight.release(id, false)
				switch res {
				case buckets.Claimed:
					f.unskip(q)
				case buckets.Paused:
					w.control.set(q, true)
					w.log.Debug("queue paused; task given back", keyTaskID, id, keyQueue, q)
				case buckets.NotServed:
					f.skip(q)
					w.log.Debug("no handler for the task's type here; given back for a worker that serves it", keyTaskID, id, keyQueue, q)
				case buckets.Buried:
					w.log.Error("task record missing, malformed or of the wrong type; sent to the dead letters", keyTaskID, id, keyQueue, q)
				case buckets.Skipped:
					w.log.Debug("task cancelled or not waiting; dropped", keyTaskID, id, keyQueue, q)
				}
				if rec == nil {
					return nil, nil
				}
				return rec, cs.Held()
			}
			err = cerr
			h.Drop()
			if buckets.IsWrongType(err) {
				// A command failed on the server: a key the claim writes
				// has the wrong type. Set such keys aside and try once more.
				w.setAsideRunKeys(ctx, q)
				try = max(try, claimTries-1)
			}
		}
		if try >= claimTries || ctx.Err() != nil {
			w.log.Error("could not claim a task; giving it back to be returned to its queue", keyTaskID, id, keyQueue, q, keyErr, err, "tries", try)
			w.inflight.release(id, true)
			return nil, nil
		}
		_ = bo.Wait(ctx, w.log, "claim", err)
	}
}

func (f *fetcher) leaseDeadline(r *buckets.Record) int64 {
	return ms(f.w.cfg.Clock.Now()) + r.TimeoutMs + f.w.cfg.LeaseGrace.Milliseconds()
}

// setAsideRunKeys sets aside the keys a claim or a result writes besides
// the record, if one has the wrong type: the in-flight list, the pending
// set, the queue's counters.
func (w *Worker) setAsideRunKeys(ctx context.Context, q string) {
	setAside(ctx, w.pool, w.store, w.keys, w.log, "list", w.keys.Inflight(w.id))
	setAside(ctx, w.pool, w.store, w.keys, w.log, "zset", w.keys.Pending(w.id))
	setAside(ctx, w.pool, w.store, w.keys, w.log, "hash", w.keys.Stats(q))
}
