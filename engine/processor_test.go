package engine

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// fakeStore is a worker's store in memory: ready ids per place, and what
// each claim and result did. A call the tests do not expect panics (the
// nil store it embeds).
type fakeStore struct {
	store
	mu       sync.Mutex
	ready    map[string][]string        // place → ids, oldest first
	claimed  map[string]int             // id → claims
	outcomes map[string]buckets.Outcome // id → recorded outcome
	claims   []int                      // ids per claim, in order
	groups   []int                      // results per Finish, in order
	n        int                        // ids in all
	grace    time.Duration              // the worker's LeaseGrace
	back     map[string]int             // id → times given back unstarted
	done     chan struct{}              // closed once every id has a result
}

func newFakeStore(place string, ids ...string) *fakeStore {
	return &fakeStore{ready: map[string][]string{place: ids}, claimed: map[string]int{},
		outcomes: map[string]buckets.Outcome{}, back: map[string]int{}, n: len(ids), done: make(chan struct{})}
}

func (f *fakeStore) Beat(context.Context, *lane, beat) error               { return nil }
func (f *fakeStore) PausedQueues(context.Context, *lane) ([]string, error) { return nil, nil }
func (f *fakeStore) Levels(context.Context, *lane) (map[string][]string, error) {
	return nil, nil
}
func (f *fakeStore) QueueLimits(_ context.Context, _ *lane, qs []string) ([]buckets.Limits, error) {
	return make([]buckets.Limits, len(qs)), nil
}
func (f *fakeStore) RecoverLost(context.Context, *lane, int, func() map[string]int) (buckets.RequeueResult, error) {
	return buckets.RequeueResult{}, nil
}

func (f *fakeStore) Pop(_ context.Context, _ *lane, p string, n int) (popRes, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n = min(n, len(f.ready[p]))
	ids := slices.Clone(f.ready[p][:n])
	f.ready[p] = f.ready[p][n:]
	return popRes{place: p, ids: ids}, nil
}

func (f *fakeStore) Claim(_ context.Context, _ *lane, p string, ids []string, _ []buckets.ClaimState, _ bool) ([]*buckets.Record, []buckets.ClaimResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.claims = append(f.claims, len(ids))
	now := time.Now().UnixMilli()
	recs := make([]*buckets.Record, len(ids))
	res := make([]buckets.ClaimResult, len(ids))
	for i, id := range ids {
		f.claimed[id]++
		recs[i] = &buckets.Record{ID: id, Queue: p, Type: "t", State: buckets.StateRunning, Runs: f.claimed[id],
			MaxAttempts: 1, TimeoutMs: 60_000, Started: now, Deadline: now + 60_000 + f.grace.Milliseconds()}
		res[i] = buckets.Claimed
	}
	return recs, res, nil
}

// Requeue puts tasks claimed ahead and given back unstarted at the front.
func (f *fakeStore) Requeue(_ context.Context, _ *lane, ids []string, _ buckets.Reason) (buckets.RequeueResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		f.back[id]++
	}
	for p := range f.ready {
		f.ready[p] = append(slices.Clone(ids), f.ready[p]...)
		break
	}
	return buckets.RequeueResult{Requeued: len(ids)}, nil
}

func (f *fakeStore) Finish(_ context.Context, _ *lane, req finishReq) (finishRes, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.groups = append(f.groups, len(req.items))
	out := finishRes{results: make([]buckets.FinishResult, len(req.items))}
	for i, it := range req.items {
		r := *it.rec
		o := it.Decide(&r)
		if _, dup := f.outcomes[it.ID]; dup {
			return finishRes{}, errors.New("fake store: a second result for " + it.ID)
		}
		f.outcomes[it.ID] = o
		out.results[i] = buckets.FinishResult{Rec: &r, Out: o}
	}
	if len(f.outcomes) == f.n {
		close(f.done)
	}
	return out, nil
}

// noRedis is a pool that cannot connect: the parts under test must not
// reach past the store.
func noRedis() *redis.Pool {
	return &redis.Pool{Dial: func() (redis.Conn, error) { return nil, errors.New("no Redis in this test") }}
}

// The processor, on a store in memory, runs every task of a deep queue
// once with at most Concurrency handlers at once, claims and records in
// batches, and gives every slot token back when it stops.
func TestProcessorOnFakeStore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		batch, window int
	}{
		{"one at a time", 1, -1},
		{"batches, group commit", 16, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const n, slots = 300, 4
			ids := make([]string, n)
			for i := range ids {
				ids[i] = newID()
			}
			fs := newFakeStore("default", ids...)
			var running, most atomic.Int64
			ran := make(map[string]int)
			var mu sync.Mutex
			cfg := Config{Concurrency: slots, Logger: testLogger(t), Advanced: AdvancedConfig{
				ClaimBatch: tc.batch, GroupCommitWindow: time.Duration(tc.window) * time.Millisecond,
				HeartbeatTTL: time.Hour, HeartbeatInterval: time.Minute}}
			w, err := newWorker(noRedis(), cfg, HandlerFunc(func(_ context.Context, task *Task) error {
				raise(&most, int(running.Add(1)))
				defer running.Add(-1)
				mu.Lock()
				ran[task.ID]++
				mu.Unlock()
				return nil
			}))
			if err != nil {
				t.Fatal(err)
			}
			w.setStore(fs)
			fs.grace = w.cfg.Advanced.LeaseGrace
			ctx := context.Background()
			if err := w.hb.register(ctx); err != nil {
				t.Fatal(err)
			}
			fetchCtx, stop := context.WithCancel(ctx)
			defer stop()
			finished := make(chan struct{})
			go func() { defer close(finished); w.proc.run(fetchCtx, ctx) }()
			select {
			case <-fs.done:
			case <-time.After(outcomeWait):
				t.Fatalf("not every task recorded within %v: %d of %d", outcomeWait, len(fs.outcomes), n)
			}
			stop()
			<-finished

			for _, id := range ids {
				// A task claimed ahead of a free slot may go back unstarted
				// and be claimed again.
				if ran[id] != 1 || fs.claimed[id] != 1+fs.back[id] || fs.outcomes[id] != buckets.Done {
					t.Fatalf("task %s: ran %d times, claimed %d, given back %d, outcome %v", id, ran[id], fs.claimed[id], fs.back[id], fs.outcomes[id])
				}
			}
			if m := most.Load(); m > slots {
				t.Errorf("%d handlers at once, above Concurrency %d", m, slots)
			}
			p := w.proc
			if p.taken.out() != 0 || p.slots.out() != 0 || p.unrecorded.out() != 0 {
				t.Errorf("tokens still held after the processor stopped: taken %d (reserved %d), slots %d, unrecorded %d", p.taken.out(), p.reserved, p.slots.out(), p.unrecorded.out())
			}
			if tc.batch > 1 && slices.Max(fs.claims) < 2 {
				t.Errorf("no batch claimed from a deep queue (claims %v)", fs.claims)
			}
			if tc.batch == 1 && slices.Max(fs.claims) > 1 {
				t.Errorf("a claim of %d with ClaimBatch 1", slices.Max(fs.claims))
			}
			if tc.window >= 0 && slices.Max(fs.groups) < 2 {
				t.Errorf("no results recorded together with group commit on (groups %v)", fs.groups)
			}
		})
	}
}
