package engine

import (
	"context"
	"errors"
	"time"

	"github.com/bucketq/bucketq/buckets"
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
	item := finishItem{FinishItem: buckets.FinishItem{ID: rec.ID, Run: rec.Runs, Now: ms(now), Decide: decide}, rec: rec, waited: c.waited}
	var next popped
	if c.batch != nil || (!c.held && f.group != nil) {
		// The group gives the slot back with the group's (see
		// committer.commit), even when the group fails and this result
		// goes the checked way: a result whose slot went back holds one
		// of the unrecorded tokens until it is recorded, so there are
		// never more such results than the bound.
		w.proc.unrecorded.take(context.Background())
		defer w.proc.unrecorded.give(1)
		var (
			res  buckets.FinishResult
			sent bool
			gerr error
		)
		if c.batch != nil {
			res, sent, gerr = c.batch.commit(item, c.tok)
		} else {
			res, sent, gerr = f.group.commit(item, c.tok)
		}
		if gerr == nil {
			f.settle(ctx, c.l, rec, res, herr, false)
			return next
		}
		// The group failed as a whole; its EXEC may have run (sent).
		return f.checked(ctx, c.l, item, herr, sent, next)
	}
	if !c.held {
		return f.checked(ctx, c.l, item, herr, false, next)
	}
	// Recorded with the claim's watch, in one round trip that also takes
	// the next task while the queues look shallow.
	req := finishReq{items: []finishItem{item}, held: true}
	if order := w.fetcher.order(); fetchCtx.Err() == nil && w.hb.alive() && len(order) > 0 && w.fetcher.shallow() {
		next.q = order[0]
		next.prev, next.mine = w.proc.reserveTurn() // before the pop is sent
		req.pop, req.popN = next.q, 1
	}
	var (
		res finishRes
		err error
	)
	if req.popN > 0 {
		ids, _ := w.inflight.popMany(func() ([]string, bool, error) {
			res, err = w.store.Finish(ctx, c.l, req)
			return res.popped, res.popLost, nil
		})
		if len(ids) > 0 {
			next.id = ids[0]
		}
	} else {
		res, err = w.store.Finish(ctx, c.l, req)
	}
	if next.id == "" {
		next.pass()
		next = popped{}
	} else {
		w.fetcher.adapt(1, 1) // the queue had more: deep enough to take several
	}
	if err == nil {
		f.settle(ctx, c.l, rec, res.results[0], herr, false)
		return next
	}
	return f.checked(ctx, c.l, item, herr, res.sent, next)
}

// settle acts on what recording rec's result found (r): its outcome; a
// record no longer this run's (ErrLeaseLost); a done record not kept,
// which after a lost reply (cut) is this very result; or a record lost,
// corrupted or of the wrong type, cleared (abandon).
func (f *finisher) settle(ctx context.Context, l *lane, rec *buckets.Record, r buckets.FinishResult, herr error, cut bool) {
	w := f.w
	switch {
	case r.Err == nil:
		f.logOutcome(r.Rec, r.Out, herr)
	case errors.Is(r.Err, buckets.ErrLeaseLost):
		f.notOurs(rec, r.Rec, cut)
	case errors.Is(r.Err, buckets.ErrNotFound) && cut && w.cfg.DoneRetention < 0:
		w.log.Debug("result already recorded before the connection dropped", keyTaskID, rec.ID)
	default: // not found, malformed, of the wrong type
		f.abandon(ctx, l, rec, r.Err)
	}
}

// checked records the outcome the way that reads the record first
// (store.Finish without held). It retries a connection failure until the
// run's lease ends (a reaper may return the task after that), and never
// an error reply of the server.
func (f *finisher) checked(ctx context.Context, l *lane, it finishItem, herr error, cut bool, next popped) popped {
	w := f.w
	rec := it.rec
	bo := w.backoff()
	leaseEnd := time.UnixMilli(rec.Deadline)
	for {
		res, err := w.store.Finish(context.WithoutCancel(ctx), l, finishReq{items: []finishItem{it}})
		if err == nil {
			f.settle(ctx, l, rec, res.results[0], herr, cut)
			return next
		}
		cut = cut || res.sent
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
func (f *finisher) abandon(ctx context.Context, l *lane, rec *buckets.Record, cause error) {
	w := f.w
	attrs := []any{keyTaskID, rec.ID, keyType, rec.Type, keyErr, cause}
	bo := w.backoff()
	for {
		res, err := w.store.Abandon(context.WithoutCancel(ctx), l, rec)
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
