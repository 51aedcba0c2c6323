package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/txn"
)

// enqueueGroup is a Client's producer-side group commit. An enqueue of
// plain tasks (generated ids, no unique key) that finds fewer than lanes
// of the Client's enqueues in flight runs at once on its own goroutine,
// as without grouping: a lone producer never waits. One that finds lanes
// in flight joins the queue; when a transaction in flight ends, its
// goroutine writes the queued enqueues (up to EnqueueGroupMax tasks) in
// one transaction, then the next lot, until none is queued; between two
// lots it yields for the last lot's callers to come back (regroup). With two
// lanes or more, the next group is built and sent while a round trip is
// out, so the producers' client and the server work at the same time.
//
// A waiting caller whose context ends returns at once. If its enqueue was
// still queued, it is withdrawn and nothing of it is written: the error
// matches its context's error, not ErrUncertain, and wraps as well why
// the transaction in flight is being tried again, if it is (with no
// master to write to, a waiter's error says so, as a lone enqueue's
// does). If it was already taken into a transaction, that transaction may
// or may not commit, and the error matches ErrUncertain as well, unless
// the caller's deadline is the transaction's (the latest of its group's):
// the transaction then ends at the same moment, and the caller gets its
// answer, which says whether anything was written.
type enqueueGroup struct {
	c   *laneClient
	max int

	mu       sync.Mutex
	lanes    int              // transactions allowed in flight at once
	yields   int              // regroup's bound (regroupYields)
	inflight int              // transactions in flight
	wait     []*enqueueWaiter // queued, in arrival order
	// retrying is why an enqueue in flight is being tried again (an
	// attempt that no server ran: no master, a redirection), nil while
	// none of the attempts since the last lot was taken failed so.
	retrying error

	// queued, when set (tests), is called with each enqueue that joins
	// the queue, after it joined.
	queued func()
}

// Waiter states.
const (
	waiterQueued int32 = iota // in the queue: may still be withdrawn
	waiterTaken               // in a transaction: its outcome is the group's
	waiterGone                // withdrawn by its caller: never written
)

type enqueueWaiter struct {
	recs     []*buckets.Record
	deadline time.Time // zero: the caller's context has none
	until    time.Time // once taken: the group transaction's deadline (under mu)
	state    atomic.Int32
	done     chan enqueueOutcome // buffered: the writer never blocks
}

type enqueueOutcome struct {
	infos []*TaskInfo
	err   error
}

// enqueueGroupTimeout bounds a group transaction whose callers set no
// deadline, and caps any other.
const enqueueGroupTimeout = 10 * time.Second

// groupable reports whether recs may share a transaction with other
// enqueues: none has a caller-chosen id or a unique key.
func groupable(recs []*buckets.Record, chosen []string) bool {
	if len(chosen) > 0 {
		return false
	}
	for _, r := range recs {
		if r.Unique != "" {
			return false
		}
	}
	return true
}

// enqueue writes recs (checked records, made at now) alone if a lane is
// free, or in the next group transaction otherwise.
func (g *enqueueGroup) enqueue(ctx context.Context, now time.Time, recs []*buckets.Record) ([]*TaskInfo, error) {
	g.mu.Lock()
	if g.inflight < g.lanes {
		if g.inflight == 0 {
			g.retrying = nil
		}
		g.inflight++
		g.mu.Unlock()
		infos, err := g.c.write(txn.OnNotRun(ctx, g.noteRetry), now, recs, nil)
		g.release()
		return infos, err
	}
	w := &enqueueWaiter{recs: recs, done: make(chan enqueueOutcome, 1)}
	w.deadline, _ = ctx.Deadline()
	g.wait = append(g.wait, w)
	queued := g.queued
	g.mu.Unlock()
	if queued != nil {
		queued()
	}
	select {
	case out := <-w.done:
		return out.infos, out.err
	case <-ctx.Done():
	}
	if w.state.CompareAndSwap(waiterQueued, waiterGone) {
		err := ctx.Err()
		g.mu.Lock()
		if g.retrying != nil {
			err = fmt.Errorf("%w, while the transaction in flight was being retried after: %w", err, g.retrying)
		}
		g.mu.Unlock()
		return nil, failed("enqueue (withdrawn while waiting for the transaction in flight)", err)
	}
	g.mu.Lock()
	until := w.until
	g.mu.Unlock()
	if !w.deadline.IsZero() && errors.Is(ctx.Err(), context.DeadlineExceeded) && !until.After(w.deadline) {
		// The group's transaction runs to this same deadline (this
		// caller's is the latest of the group's): its answer is at hand
		// and says what happened, written or not, where giving up now
		// could only say "uncertain".
		out := <-w.done
		return out.infos, out.err
	}
	select {
	case out := <-w.done: // answered meanwhile
		return out.infos, out.err
	default:
	}
	return nil, failed("enqueue", fmt.Errorf("%w: stopped waiting for its group transaction: %w", buckets.ErrUncertain, ctx.Err()))
}

// noteRetry records why the enqueue in flight is being tried again.
func (g *enqueueGroup) noteRetry(err error) {
	g.mu.Lock()
	g.retrying = err
	g.mu.Unlock()
}

// release ends an enqueue that ran on its caller's goroutine: if others
// queued meanwhile, a goroutine writes them.
func (g *enqueueGroup) release() {
	g.mu.Lock()
	if len(g.wait) == 0 {
		g.inflight--
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	go g.drain()
}

// drain writes the queued enqueues, a group at a time, until none is left.
func (g *enqueueGroup) drain() {
	for {
		batch, deadline := g.take()
		if len(batch) == 0 {
			return
		}
		g.commit(batch, deadline)
		g.regroup(len(batch))
	}
}

// regroupYields bounds how many times drain yields the processor, after
// answering a group, for that group's callers to come back.
const regroupYields = 8

// regroup lets the k callers of the group just answered come back with
// their next enqueues before the next take, so that they share its
// transaction. Without it the take finds the queue empty, the busy spell
// ends, the first caller back runs alone and the others queue behind it,
// and eight producers' transactions carry about half as many tasks each
// (BenchmarkEnqueueDelayed8 reports tasks/exec). It yields at most
// g.yields times and stops as soon as k enqueues are queued; it never
// sleeps, and it holds the lane, so enqueues that arrive meanwhile queue.
func (g *enqueueGroup) regroup(k int) {
	for range g.yields {
		g.mu.Lock()
		n := len(g.wait)
		g.mu.Unlock()
		if n >= k {
			return
		}
		runtime.Gosched()
	}
}

// take removes from the queue the next group (at least one enqueue, then
// more while they fit in max tasks), marking each taken, and returns it
// with the deadline of its transaction: the latest of its callers', at
// most enqueueGroupTimeout away. With nothing queued it ends the busy
// spell.
func (g *enqueueGroup) take() ([]*enqueueWaiter, time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var batch []*enqueueWaiter
	n, i := 0, 0
	for ; i < len(g.wait); i++ {
		w := g.wait[i]
		if len(batch) > 0 && n+len(w.recs) > g.max {
			break
		}
		if !w.state.CompareAndSwap(waiterQueued, waiterTaken) {
			continue // withdrawn
		}
		batch = append(batch, w)
		n += len(w.recs)
	}
	rest := copy(g.wait, g.wait[i:])
	clear(g.wait[rest:])
	g.wait = g.wait[:rest]
	if len(batch) == 0 {
		g.inflight--
		return nil, time.Time{}
	}
	limit := time.Now().Add(enqueueGroupTimeout)
	var deadline time.Time
	for _, w := range batch {
		if w.deadline.IsZero() || w.deadline.After(limit) {
			deadline = limit
		} else if w.deadline.After(deadline) {
			deadline = w.deadline
		}
	}
	for _, w := range batch {
		w.until = deadline
	}
	g.retrying = nil
	return batch, deadline
}

// commit writes one group in one transaction and answers each of its
// callers. The transaction's context is none of theirs (one caller giving
// up must not cut the others' round trip): it ends at deadline (see take).
func (g *enqueueGroup) commit(batch []*enqueueWaiter, deadline time.Time) {
	now := g.c.cfg.Advanced.Clock.Now()
	n := 0
	for _, w := range batch {
		n += len(w.recs)
	}
	recs := make([]*buckets.Record, 0, n)
	for _, w := range batch {
		recs = append(recs, w.recs...)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	_, err := g.c.write(txn.OnNotRun(ctx, g.noteRetry), now, recs, nil)
	for _, w := range batch {
		if err != nil {
			w.done <- enqueueOutcome{err: err}
			continue
		}
		w.done <- enqueueOutcome{infos: enqueued(w.recs, now)}
	}
}
