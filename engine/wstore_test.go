package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
)

// dyingStore passes a worker's calls to the real store until the step
// named by stage, and from then on fails every call, as a process killed
// right there would look from Redis: what the step wrote stays, nothing
// after it is written. Stages: after-pop (the pop happened, its reply is
// lost), after-claim (likewise for the claim), before-finish (the result
// is never sent), after-finish (the result is recorded, then death). The
// batch stages name the same steps of a batch: after-popmany (a pop of
// several), after-claimbatch (a claim of several), before-group and
// after-group (a held batch's result group); fatal then holds the ids the
// fatal call handled.
type dyingStore struct {
	store
	stage string
	fired atomic.Bool
	fatal []string // written before fired is set
}

func (d *dyingStore) dead() bool { return d.fired.Load() }

func (d *dyingStore) die(stage string) bool {
	return stage == d.stage && d.fired.CompareAndSwap(false, true)
}

func (d *dyingStore) Beat(ctx context.Context, l *lane, b beat) error {
	if d.dead() {
		return errInjected
	}
	return d.store.Beat(ctx, l, b)
}

func (d *dyingStore) PlaceAgain(ctx context.Context, l *lane) (int, error) {
	if d.dead() {
		return 0, errInjected
	}
	return d.store.PlaceAgain(ctx, l)
}

// dieWith is die for a batch stage, recording the ids of the fatal call.
func (d *dyingStore) dieWith(stage string, ids []string) bool {
	if stage != d.stage || d.fired.Load() {
		return false
	}
	d.fatal = ids
	return d.die(stage)
}

func (d *dyingStore) Pop(ctx context.Context, l *lane, p string, n int) (popRes, error) {
	if d.dead() {
		return popRes{}, errInjected
	}
	r, err := d.store.Pop(ctx, l, p, n)
	if n == 1 && len(r.ids) == 1 && d.die("after-pop") {
		return popRes{}, errInjected
	}
	if len(r.ids) > 1 && d.dieWith("after-popmany", r.ids) {
		return popRes{}, errInjected
	}
	return r, err
}

func (d *dyingStore) Claim(ctx context.Context, l *lane, p string, ids []string, cs []buckets.ClaimState, hold bool) ([]*buckets.Record, []buckets.ClaimResult, error) {
	if d.dead() {
		return nil, nil, errInjected
	}
	recs, res, err := d.store.Claim(ctx, l, p, ids, cs, hold)
	if err == nil && len(ids) == 1 && res[0] == buckets.Claimed && d.die("after-claim") {
		return nil, nil, errInjected
	}
	if err == nil && len(ids) > 1 && d.dieWith("after-claimbatch", ids) {
		return nil, nil, errInjected
	}
	return recs, res, err
}

func (d *dyingStore) Finish(ctx context.Context, l *lane, req finishReq) (finishRes, error) {
	if d.dead() {
		return finishRes{}, errInjected
	}
	before, after := "before-finish", "after-finish"
	ids := make([]string, len(req.items))
	for i, it := range req.items {
		ids[i] = it.ID
	}
	if len(req.items) > 1 {
		before, after = "", ""
		if req.held {
			before, after = "before-group", "after-group"
		}
	}
	if d.dieWith(before, ids) {
		return finishRes{}, errInjected
	}
	res, err := d.store.Finish(ctx, l, req)
	if err == nil && d.dieWith(after, ids) {
		return finishRes{sent: true}, errInjected
	}
	return res, err
}

func (d *dyingStore) Abandon(ctx context.Context, l *lane, r *buckets.Record) (buckets.AbandonResult, error) {
	if d.dead() {
		return 0, errInjected
	}
	return d.store.Abandon(ctx, l, r)
}

func (d *dyingStore) Requeue(ctx context.Context, l *lane, ids []string, why buckets.Reason) (buckets.RequeueResult, error) {
	if d.dead() {
		return buckets.RequeueResult{}, errInjected
	}
	return d.store.Requeue(ctx, l, ids, why)
}

func (d *dyingStore) RecoverLost(ctx context.Context, l *lane, limit int, held func() map[string]int) (buckets.RequeueResult, error) {
	if d.dead() {
		return buckets.RequeueResult{}, errInjected
	}
	return d.store.RecoverLost(ctx, l, limit, held)
}

func (d *dyingStore) RecoverAll(ctx context.Context, l *lane) (buckets.RequeueResult, error) {
	if d.dead() {
		return buckets.RequeueResult{}, errInjected
	}
	return d.store.RecoverAll(ctx, l)
}

func (d *dyingStore) Forget(ctx context.Context, l *lane, requireDead bool) (bool, error) {
	if d.dead() {
		return false, errInjected
	}
	return d.store.Forget(ctx, l, requireDead)
}

func (d *dyingStore) PausedQueues(ctx context.Context, l *lane) ([]string, error) {
	if d.dead() {
		return nil, errInjected
	}
	return d.store.PausedQueues(ctx, l)
}

func (d *dyingStore) SetAside(ctx context.Context, want string, keys ...string) {
	if !d.dead() {
		d.store.SetAside(ctx, want, keys...)
	}
}

// dieAndTakeOver runs a worker with h that dies at stage (a dyingStore),
// waits for the death, then starts a reaper and a second worker with h,
// which take the dead worker's tasks over. It returns the dying store.
func (e *env) dieAndTakeOver(t *testing.T, h Handler, stage string) *dyingStore {
	t.Helper()
	w1, err := newWorker(e.pool, e.cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	ds := &dyingStore{store: w1.store, stage: stage}
	w1.setStore(ds)
	w1.cfg.ShutdownTimeout = 100 * time.Millisecond
	runBackground(t, func(ctx context.Context) error { _ = w1.Run(ctx); return nil })
	waitFor(t, outcomeWait, "the fault", ds.fired.Load)
	rp, err := newReaper(e.pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, rp.Run)
	w2, err := newWorker(e.pool, e.cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, func(ctx context.Context) error {
		// The tasks may all be done before this worker registers:
		// stopping it then is no fault.
		if err := w2.Run(ctx); err != nil && !(ctx.Err() != nil && errors.Is(err, context.Canceled)) {
			return err
		}
		return nil
	})
	return ds
}
