package engine

import (
	"context"
	"errors"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// finisher records a run's outcome. With the claim's watch still held on
// the task's connection it does so in one round trip that also takes the
// next task; otherwise the checked way (Finish), retrying while Redis is
// unreachable until the run's lease ends. When a reply was lost it tells
// its own recorded result from a run that was recovered elsewhere, and a
// record deleted or corrupted while the task ran is cleared (Abandon).
type finisher struct {
	w      *worker
	policy retryPolicy
	group  *committer // nil: no group commit (Config.Advanced.GroupCommitWindow < 0), or not running
}

// popped is a task moved into the in-flight list, not yet claimed; the
// in-flight set holds its id. prev and mine are its place in the order in
// which popped tasks take slots (processor.reserveTurn), nil for none.
type popped struct {
	id, q      string
	prev, mine chan struct{}
}

// pass gives up the task's place in the slot order: the tasks popped after
// it no longer wait for it.
func (n *popped) pass() {
	if n.mine != nil {
		passTurn(n.prev, n.mine)
		n.prev, n.mine = nil, nil
	}
}

// finish records the outcome herr of c's run (with result, stored when
// the outcome is a success) and returns the task taken with it, if any.
func (f *finisher) finish(fetchCtx, ctx context.Context, c claimed, herr error, result []byte) popped {
	w := f.w
	rec := c.rec
	now := w.cfg.Advanced.Clock.Now()
	decide := func(r *buckets.Record) buckets.Outcome {
		out := f.policy.decide(r, now, herr)
		if out == buckets.Done {
			r.Result = result
		}
		return out
	}
	var next popped
	cut := false // a connection failed after a result may have been sent
	if c.batch != nil || (c.held == nil && f.group != nil) {
		// The group gives the slot back with the group's (see
		// committer.commit), even when the group fails and this result
		// goes the checked way: a result whose slot went back holds one
		// of the unrecorded tokens until it is recorded, so there are
		// never more such results than the bound.
		unrecorded := w.proc.unrecorded
		unrecorded <- struct{}{}
		defer func() { <-unrecorded }()
		item := buckets.FinishItem{ID: rec.ID, Run: rec.Runs, Now: ms(now), Decide: decide}
		var (
			res  buckets.FinishResult
			sent bool
			gerr error
		)
		if c.batch != nil {
			res, sent, gerr = c.batch.commit(item, rec, c.waited, c.tok)
		} else {
			res, sent, gerr = f.group.commit(item, c.tok)
		}
		switch {
		case gerr == nil && res.Err == nil:
			f.logOutcome(res.Rec, res.Out, herr)
			return next
		case gerr == nil && errors.Is(res.Err, buckets.ErrLeaseLost):
			f.notOurs(rec, res.Rec, false)
			return next
		case gerr != nil:
			// The group's EXEC may have run: Finish tells.
			cut = sent
		}
		// A record that could not be read: the checked way says why.
		return f.checked(ctx, c.h, rec, now, decide, herr, cut, next)
	}
	if c.held != nil && c.h.Conn() == c.held.Conn() && c.held.Conn().Err() == nil {
		var pop []txn.Cmd
		if order := w.fetcher.order(); fetchCtx.Err() == nil && w.hb.alive() && len(order) > 0 && w.fetcher.shallow() {
			next.q = order[0]
			next.prev, next.mine = w.proc.reserveTurn() // before the pop is sent
			pop = []txn.Cmd{w.store.PopNext(next.q, w.id)}
		}
		var (
			r   *buckets.Record
			out buckets.Outcome
			err error
		)
		held := func() (string, bool, error) {
			var reps []interface{}
			r, out, reps, err = w.store.FinishHeld(ctx, c.held, w.id, rec, c.waited, ms(now), w.cfg.doneTTL(), decide, pop)
			if pop == nil {
				return "", false, nil
			}
			if len(reps) != 1 {
				return "", true, nil // the pop's reply is lost
			}
			id, _ := redis.String(reps[0], nil)
			return id, false, nil
		}
		if pop != nil {
			next.id, _ = w.inflight.pop(held)
		} else {
			_, _, _ = held()
		}
		if next.id == "" {
			next.pass()
			next = popped{}
		} else {
			w.fetcher.adapt(1, 1) // the queue had more: deep enough to take several
		}
		switch {
		case err == nil:
			f.logOutcome(r, out, herr)
			return next
		case errors.Is(err, buckets.ErrWatchLost):
			// The record changed since the claim: the checked way says why.
		default:
			c.h.Drop()
			cut = true
		}
	}
	return f.checked(ctx, c.h, rec, now, decide, herr, cut, next)
}

// checked records the outcome with Finish, which reads the record first.
// It retries a connection failure until the run's lease ends (a reaper may
// return the task after that), and never an error reply of the server.
func (f *finisher) checked(ctx context.Context, h *rconn.Holder, rec *buckets.Record, now time.Time,
	decide func(*buckets.Record) buckets.Outcome, herr error, cut bool, next popped) popped {
	w := f.w
	bo := w.backoff()
	leaseEnd := time.UnixMilli(rec.Deadline)
	for {
		conn, err := h.Get(context.WithoutCancel(ctx))
		if err == nil {
			var (
				r   *buckets.Record
				out buckets.Outcome
			)
			r, out, err = w.store.Finish(ctx, conn, w.id, rec.ID, rec.Runs, ms(now), w.cfg.doneTTL(), decide)
			switch {
			case err == nil:
				f.logOutcome(r, out, herr)
				return next
			case errors.Is(err, buckets.ErrLeaseLost):
				f.notOurs(rec, r, cut)
				return next
			case errors.Is(err, buckets.ErrNotFound) && cut && w.cfg.DoneRetention < 0:
				// A done record not kept: this very result, recorded
				// before the reply was lost.
				w.log.Debug("result already recorded before the connection dropped", keyTaskID, rec.ID)
				return next
			case errors.Is(err, buckets.ErrNotFound), errors.Is(err, buckets.ErrMalformed), buckets.IsWrongType(err):
				f.abandon(ctx, h, rec, err)
				return next
			}
			h.Drop()
			cut = true
		}
		if ctx.Err() != nil {
			w.log.Error("could not record a task's result before shutdown; it stays running and a reaper returns it when the lease ends",
				keyTaskID, rec.ID, keyErr, err)
			return next
		}
		if w.cfg.Advanced.Clock.Now().After(leaseEnd) {
			w.log.Error("could not record a task's result before its lease ended; it will run again",
				keyTaskID, rec.ID, keyErr, err)
			return next
		}
		// The task's id goes with the warning: an error from dialing
		// names no task.
		if !bo.Wait(ctx, w.log.With(keyTaskID, rec.ID), "record result", err) {
			return next
		}
	}
}

// notOurs explains a result that Finish found the record no longer waits
// for: cur is the record as it is.
func (f *finisher) notOurs(rec, cur *buckets.Record, cut bool) {
	w := f.w
	attrs := []any{keyTaskID, rec.ID, keyType, rec.Type}
	switch {
	case cur == nil:
		w.log.Warn("task record changed while it ran; its result is dropped", attrs...)
	case cur.Runs == rec.Runs && cur.Recoveries == rec.Recoveries && cur.State != buckets.StateRunning && cut:
		w.log.Debug("result already recorded before the connection dropped", attrs...)
	case cur.Recoveries > rec.Recoveries || cur.Runs > rec.Runs:
		w.log.Warn("task was recovered elsewhere while it ran (its lease ran out, or this worker was taken for dead); its result is dropped and it runs again",
			append(attrs, "state", cur.State, "runs", cur.Runs, "recoveries", cur.Recoveries)...)
	default:
		w.log.Warn("task record changed while it ran; its result is dropped",
			append(attrs, "state", cur.State, "runs", cur.Runs, "worker", cur.Worker)...)
	}
}

// abandon clears a run whose record was deleted, corrupted or replaced by
// a key of another type while it ran: its pending entry and the running
// gauge in one transaction, and a dead letter when there is something to
// keep. A few tries; past them the lease backstop of the reaper clears
// the entry.
func (f *finisher) abandon(ctx context.Context, h *rconn.Holder, rec *buckets.Record, cause error) {
	w := f.w
	attrs := []any{keyTaskID, rec.ID, keyType, rec.Type, keyErr, cause}
	if buckets.IsWrongType(cause) {
		w.setAsideRunKeys(context.WithoutCancel(ctx), rec.Queue)
	}
	bo := w.backoff()
	for {
		conn, err := h.Get(context.WithoutCancel(ctx))
		if err == nil {
			var res buckets.AbandonResult
			res, err = w.store.Abandon(context.WithoutCancel(ctx), conn, w.id, rec, ms(w.cfg.Advanced.Clock.Now()))
			if err == nil {
				switch res {
				case buckets.AbandonDropped:
					w.log.Error("task record deleted while it ran; its result is dropped", attrs...)
				case buckets.AbandonBuried:
					w.log.Error("task record corrupted or replaced by a key of another type while it ran; sent to the dead letters", attrs...)
				case buckets.AbandonStillOurs:
					w.log.Warn("task record still shows the run; its result could not be recorded and it stays running until its lease ends", attrs...)
				}
				return
			}
			h.Drop()
		}
		if bo.Fails() >= cleanupTries-1 || !bo.Wait(context.WithoutCancel(ctx), w.log, "clear an unfinishable run", err) {
			w.log.Error("could not clear a run whose record was lost; a reaper clears it when the lease ends", append(attrs, "clear_err", err)...)
			return
		}
	}
}

func (f *finisher) logOutcome(r *buckets.Record, out buckets.Outcome, herr error) {
	w := f.w
	w.observeOutcome(r, out, herr)
	// The attributes only for an outcome that is logged: a success is
	// not, and this runs once per task.
	attrs := func() []any {
		return []any{keyTaskID, r.ID, keyType, r.Type, keyQueue, r.Queue, keyAttempt, r.Attempts}
	}
	switch out {
	case buckets.Done:
		w.processed.Add(1)
	case buckets.Again:
		if r.State == buckets.StateRetry {
			w.failed.Add(1)
			w.log.Warn("task failed; will retry", append(attrs(), keyErr, herr, "retry_at", fromMs(r.Due))...)
		}
	case buckets.Bury:
		w.failed.Add(1)
		w.log.Error("task failed; sent to the dead letters", append(attrs(), keyErr, herr)...)
	}
}
