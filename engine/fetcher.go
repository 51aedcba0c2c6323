package engine

import (
	"context"
	"math"
	"math/rand/v2"
	"sort"
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
}

func newFetcher(w *Worker) *fetcher {
	f := &fetcher{w: w, waiter: &waiter{w: w}}
	f.waiter.blocker.Pool = w.pool
	f.h.Pool = w.pool
	for _, q := range w.cfg.Queues {
		f.queues = append(f.queues, q.Name)
		f.weights = append(f.weights, float64(q.Weight))
		f.waiter.keys = append(f.waiter.keys, w.keys.Notify(q.Name))
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

// order is the order to try the queues in for one fetch: as configured
// under strict priority; otherwise a weighted random order, so each
// queue comes first in proportion to its weight.
func (f *fetcher) order() []string {
	if f.w.cfg.StrictPriority || len(f.queues) == 1 {
		return f.queues
	}
	type kq struct {
		k float64
		q string
	}
	ks := make([]kq, len(f.queues))
	for i, q := range f.queues {
		// Efraimidis-Spirakis: sorting by u^(1/w) samples without
		// replacement in proportion to weight.
		ks[i] = kq{math.Pow(rand.Float64(), 1/f.weights[i]), q}
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
	var (
		bo rconn.Backoff
		cs buckets.ClaimState // recognises our own claim if a reply is lost
	)
	for try := 1; ; try++ {
		conn, err := h.Get(ctx)
		if err == nil {
			rec, res, cerr := w.store.Claim(ctx, conn, w.id, q, id, ms(w.cfg.Clock.Now()), f.leaseDeadline, true, &cs)
			if cerr == nil {
				w.inflight.release(id, false)
				switch res {
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
