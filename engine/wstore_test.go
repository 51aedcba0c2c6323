package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
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
	workerStore
	stage string
	fired atomic.Bool
	fatal []string // written before fired is set
}

func (d *dyingStore) dead() bool { return d.fired.Load() }

func (d *dyingStore) die(stage string) bool {
	return stage == d.stage && d.fired.CompareAndSwap(false, true)
}

func (d *dyingStore) Beat(ctx context.Context, conn redis.Conn, w string, ttl int64, info []byte, served ...buckets.Served) error {
	if d.dead() {
		return errInjected
	}
	return d.workerStore.Beat(ctx, conn, w, ttl, info, served...)
}

func (d *dyingStore) Refresh(ctx context.Context, conn redis.Conn, w string, ttl int64, info []byte, served ...buckets.Served) error {
	if d.dead() {
		return errInjected
	}
	return d.workerStore.Refresh(ctx, conn, w, ttl, info, served...)
}

func (d *dyingStore) PlaceAgain(ctx context.Context, conn redis.Conn) (int, error) {
	if d.dead() {
		return 0, errInjected
	}
	return d.workerStore.PlaceAgain(ctx, conn)
}

func (d *dyingStore) Pop(ctx context.Context, conn redis.Conn, q, w string) (string, error) {
	if d.dead() {
		return "", errInjected
	}
	id, err := d.workerStore.Pop(ctx, conn, q, w)
	if id != "" && d.die("after-pop") {
		return "", errInjected
	}
	return id, err
}

// dieWith is die for a batch stage, recording the ids of the fatal call.
func (d *dyingStore) dieWith(stage string, ids []string) bool {
	if stage != d.stage || d.fired.Load() {
		return false
	}
	d.fatal = ids
	return d.die(stage)
}

func (d *dyingStore) PopMany(ctx context.Context, conn redis.Conn, q, w string, n int) ([]string, error) {
	if d.dead() {
		return nil, errInjected
	}
	ids, err := d.workerStore.PopMany(ctx, conn, q, w, n)
	if len(ids) > 1 && d.dieWith("after-popmany", ids) {
		return nil, errInjected
	}
	return ids, err
}

func (d *dyingStore) ClaimBatch(ctx context.Context, conn redis.Conn, w, q string, ids []string, now int64, deadline func(*buckets.Record) int64, cs []buckets.ClaimState, hold bool) ([]*buckets.Record, []buckets.ClaimResult, error) {
	if d.dead() {
		return nil, nil, errInjected
	}
	recs, res, err := d.workerStore.ClaimBatch(ctx, conn, w, q, ids, now, deadline, cs, hold)
	if err == nil && len(ids) > 1 && d.dieWith("after-claimbatch", ids) {
		return nil, nil, errInjected
	}
	return recs, res, err
}

func (d *dyingStore) FinishGroup(ctx context.Context, conn redis.Conn, w string, items []buckets.FinishItem, doneTTL int64) ([]buckets.FinishResult, error) {
	if d.dead() {
		return nil, errInjected
	}
	return d.workerStore.FinishGroup(ctx, conn, w, items, doneTTL)
}

func (d *dyingStore) FinishGroupHeld(ctx context.Context, held *txn.Held, w string, items []buckets.HeldItem, doneTTL int64, next []txn.Cmd) ([]buckets.FinishResult, []interface{}, error) {
	if d.dead() {
		return nil, nil, errInjected
	}
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.Rec.ID
	}
	if d.dieWith("before-group", ids) {
		return nil, nil, errInjected
	}
	res, after, err := d.workerStore.FinishGroupHeld(ctx, held, w, items, doneTTL, next)
	if err == nil && d.dieWith("after-group", ids) {
		return nil, nil, errInjected
	}
	return res, after, err
}

func (d *dyingStore) Claim(ctx context.Context, conn redis.Conn, w, q, id string, now int64, deadline func(*buckets.Record) int64, hold bool, cs *buckets.ClaimState) (*buckets.Record, buckets.ClaimResult, error) {
	if d.dead() {
		return nil, 0, errInjected
	}
	rec, res, err := d.workerStore.Claim(ctx, conn, w, q, id, now, deadline, hold, cs)
	if err == nil && res == buckets.Claimed && d.die("after-claim") {
		return nil, 0, errInjected
	}
	return rec, res, err
}

func (d *dyingStore) FinishHeld(ctx context.Context, held *txn.Held, w string, r *buckets.Record, waited bool, now, doneTTL int64, decide func(*buckets.Record) buckets.Outcome, next []txn.Cmd) (*buckets.Record, buckets.Outcome, []interface{}, error) {
	if d.dead() || d.die("before-finish") {
		return nil, 0, nil, errInjected
	}
	rec, out, reps, err := d.workerStore.FinishHeld(ctx, held, w, r, waited, now, doneTTL, decide, next)
	if err == nil && d.die("after-finish") {
		return rec, out, nil, errInjected
	}
	return rec, out, reps, err
}

func (d *dyingStore) Finish(ctx context.Context, conn redis.Conn, w, id string, run int, now, doneTTL int64, decide func(*buckets.Record) buckets.Outcome) (*buckets.Record, buckets.Outcome, error) {
	if d.dead() || d.die("before-finish") {
		return nil, 0, errInjected
	}
	rec, out, err := d.workerStore.Finish(ctx, conn, w, id, run, now, doneTTL, decide)
	if err == nil && d.die("after-finish") {
		return rec, out, errInjected
	}
	return rec, out, err
}

func (d *dyingStore) Abandon(ctx context.Context, conn redis.Conn, w string, r *buckets.Record, now int64) (buckets.AbandonResult, error) {
	if d.dead() {
		return 0, errInjected
	}
	return d.workerStore.Abandon(ctx, conn, w, r, now)
}

func (d *dyingStore) Requeue(ctx context.Context, conn redis.Conn, w string, ids []string, now int64, why buckets.Reason, maxRecoveries int) (buckets.RequeueResult, error) {
	if d.dead() {
		return buckets.RequeueResult{}, errInjected
	}
	return d.workerStore.Requeue(ctx, conn, w, ids, now, why, maxRecoveries)
}

func (d *dyingStore) RecoverLost(ctx context.Context, conn redis.Conn, w string, now int64, limit int, held func() map[string]int) (buckets.RequeueResult, error) {
	if d.dead() {
		return buckets.RequeueResult{}, errInjected
	}
	return d.workerStore.RecoverLost(ctx, conn, w, now, limit, held)
}

func (d *dyingStore) RecoverAllInflight(ctx context.Context, conn redis.Conn, w string, now int64) (buckets.RequeueResult, error) {
	if d.dead() {
		return buckets.RequeueResult{}, errInjected
	}
	return d.workerStore.RecoverAllInflight(ctx, conn, w, now)
}

func (d *dyingStore) Forget(ctx context.Context, conn redis.Conn, w string, requireDead bool) (bool, error) {
	if d.dead() {
		return false, errInjected
	}
	return d.workerStore.Forget(ctx, conn, w, requireDead)
}

func (d *dyingStore) PausedQueues(ctx context.Context, conn redis.Conn) ([]string, error) {
	if d.dead() {
		return nil, errInjected
	}
	return d.workerStore.PausedQueues(ctx, conn)
}

func (d *dyingStore) SetAside(ctx context.Context, conn redis.Conn, want string, keys ...string) ([]string, error) {
	if d.dead() {
		return nil, errInjected
	}
	return d.workerStore.SetAside(ctx, conn, want, keys...)
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
	ds := &dyingStore{workerStore: w1.store, stage: stage}
	w1.store = ds
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
