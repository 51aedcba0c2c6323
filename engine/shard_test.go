package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// sameServer returns n lanes that all live on e's server (one pool).
func (e *env) sameServer(n int) shardSpec {
	sh := shardSpec{}
	for range n {
		sh.Pools = append(sh.Pools, e.pool)
	}
	return sh
}

func (e *env) shardedClient(t testing.TB, sh shardSpec) *Client {
	t.Helper()
	c, err := newShardedClient(sh, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// laneKey is the key of lane k of e's namespace.
func (e *env) laneKey(k int, suffix string) string {
	if k == 0 {
		return e.key(suffix)
	}
	return fmt.Sprintf("{%s:%d}:%s", e.ns, k, suffix)
}

func exists(t testing.TB, c redis.Conn, key string) bool {
	t.Helper()
	n, err := redis.Int(c.Do("EXISTS", key))
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

func TestShardLaneOf(t *testing.T) {
	t.Parallel()
	if got := laneOf("anything", 1); got != 0 {
		t.Errorf("one lane: %d", got)
	}
	if got := laneOf("0f8fad5b-d9cb-469f-a165-70867728950e", 8); got != 0 {
		t.Errorf("a plain UUID (an id from before lanes) is in lane 0, got %d", got)
	}
	if got := laneOf("0f8fad5b-d9cb-469f-a165-70867728950e~5", 8); got != 5 {
		t.Errorf("generated id of lane 5: %d", got)
	}
	if got, want := laneOf("order-7~r2.1700000000000", 8), laneOf("order-7", 8); got != want {
		t.Errorf("a reply task is in its parent's lane %d, got %d", want, got)
	}
	if got := laneOf("0f8fad5b-d9cb-469f-a165-70867728950e~5~r1.17", 8); got != 5 {
		t.Errorf("reply of a lane-5 task: lane %d", got)
	}
	for _, id := range []string{"order~9", "order~05", "order~-1", "order~x"} {
		if got, want := laneOf(id, 8), hashLane(id, 8); got != want {
			t.Errorf("%q: lane %d, want its hash lane %d", id, got, want)
		}
	}
	seen := map[int]bool{}
	for i := range 200 {
		seen[laneOf(fmt.Sprintf("order-%d", i), 8)] = true
	}
	if len(seen) != 8 {
		t.Errorf("200 chosen ids hashed to %d of 8 lanes", len(seen))
	}
}

// TestShardOneLaneKeepsLayout: one lane writes what NewClient writes, and
// a namespace written before it had lanes keeps working as lane 0 of a
// sharded deployment: its tasks are found by id and run.
func TestShardOneLaneKeepsLayout(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	old, err := e.client(t).Enqueue(ctx, "job", []byte("before"))
	if err != nil {
		t.Fatal(err)
	}
	one := e.shardedClient(t, e.sameServer(1))
	ti, err := one.Enqueue(ctx, "job", []byte("one lane"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(ti.ID, laneSep) {
		t.Errorf("one lane: id %q carries a lane", ti.ID)
	}
	a := e.admin(t)
	for _, id := range []string{old.ID, ti.ID} {
		if !exists(t, a, e.key("t:"+id)) {
			t.Errorf("task %s not under {%s}:", id, e.ns)
		}
	}
	// Grow to three lanes on the same server: the old tasks are lane 0's.
	three := e.shardedClient(t, e.sameServer(3))
	for _, id := range []string{old.ID, ti.ID} {
		if got, err := three.Lookup(ctx, id); err != nil || got.ID != id {
			t.Fatalf("lookup %s with three lanes: %v %v", id, got, err)
		}
	}
	var mu sync.Mutex
	ran := map[string]bool{}
	mux := NewMux()
	mux.HandleFunc("job", func(_ context.Context, tk *Task) error {
		mu.Lock()
		ran[tk.ID] = true
		mu.Unlock()
		return nil
	})
	srv, err := newShardedServer(e.sameServer(3), e.cfg, mux, AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, srv.Run)
	nw, err := three.Enqueue(ctx, "job", nil)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, outcomeWait, "every task to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return ran[old.ID] && ran[ti.ID] && ran[nw.ID]
	})
}

// TestShardRouting: chosen ids and unique keys go to their hash lane,
// ShardKey keeps a key's tasks together, the rest are spread, and a
// batch says where each task went.
func TestShardRouting(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	const n = 4
	c := e.shardedClient(t, e.sameServer(n))
	a := e.admin(t)

	for i := range 12 {
		id := fmt.Sprintf("order-%d", i)
		if _, err := c.Enqueue(ctx, "job", nil, TaskID(id)); err != nil {
			t.Fatal(err)
		}
		k := laneOf(id, n)
		if !exists(t, a, e.laneKey(k, "t:"+id)) {
			t.Errorf("%s: not in lane %d", id, k)
		}
		if _, err := c.Enqueue(ctx, "job", nil, TaskID(id)); !errors.Is(err, ErrTaskExists) {
			t.Errorf("%s again: %v, want ErrTaskExists", id, err)
		}
		if err := c.Cancel(ctx, id); err != nil {
			t.Errorf("cancel %s: %v", id, err)
		}
	}
	// Unique: producers never disagree on the holder's lane.
	first, err := c.Enqueue(ctx, "job", []byte("p"), UniqueKey("nightly", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		var de *ExistsError
		if _, err := c.Enqueue(ctx, "job", []byte("q"), UniqueKey("nightly", time.Minute)); !errors.As(err, &de) || de.IDs[0] != first.ID {
			t.Fatalf("duplicate: %v, want a DuplicateError naming %s", err, first.ID)
		}
	}
	if got, want := c.LaneOf(first.ID), hashLane("k:nightly", n); got != want {
		t.Errorf("unique holder in lane %d, want the key's lane %d", got, want)
	}
	// ShardKey: one lane for one key; spread otherwise.
	lanes := map[int]int{}
	for range 8 {
		ti, err := c.Enqueue(ctx, "job", nil, ShardKey("customer-7"))
		if err != nil {
			t.Fatal(err)
		}
		lanes[c.LaneOf(ti.ID)]++
	}
	if len(lanes) != 1 {
		t.Errorf("ShardKey tasks went to lanes %v, want one", lanes)
	}
	spread := map[int]int{}
	for range 8 {
		ti, err := c.Enqueue(ctx, "job", nil)
		if err != nil {
			t.Fatal(err)
		}
		k := c.LaneOf(ti.ID)
		spread[k]++
		if !exists(t, a, e.laneKey(k, "t:"+ti.ID)) {
			t.Errorf("%s: not in lane %d", ti.ID, k)
		}
		if got, err := c.Lookup(ctx, ti.ID); err != nil || got.State != StateReady {
			t.Errorf("lookup %s: %+v %v", ti.ID, got, err)
		}
	}
	if len(spread) != n {
		t.Errorf("8 tasks spread over lanes %v, want all %d", spread, n)
	}
	// A batch: one transaction per lane, and the result says where.
	var batch []NewTask
	for i := range 10 {
		batch = append(batch, NewTask{Type: "job", Options: []Option{TaskID(fmt.Sprintf("b-%d", i))}})
	}
	res, err := c.EnqueueBatch(ctx, batch)
	if err != nil || len(res) != 10 {
		t.Fatalf("batch: %v, %d written", err, len(res))
	}
	for i, ti := range res {
		if !exists(t, a, e.laneKey(laneOf(ti.ID, n), "t:"+ti.ID)) {
			t.Errorf("batch task %d: lane %d, id %s: no record there", i, laneOf(ti.ID, n), ti.ID)
		}
	}
	// A taken id refuses its lane's part only.
	taken := batch[3].Options[0]
	fresh := "fresh-" + e.ns
	res, err = c.EnqueueBatch(ctx, []NewTask{{Type: "job", Options: []Option{taken}}, {Type: "job", Options: []Option{TaskID(fresh)}}})
	var be *BatchError
	if !errors.Is(err, ErrTaskExists) || !errors.As(err, &be) || res[0] != nil || be.Errs[0] == nil {
		t.Fatalf("batch with a taken id: %v %+v", err, res)
	}
	if sameLane := laneOf("b-3", n) == laneOf(fresh, n); sameLane != (res[1] == nil) {
		t.Errorf("the other task's lane %d (taken id's %d) written=%v", laneOf(fresh, n), laneOf("b-3", n), res[1] != nil)
	}
	// A task whose id and unique key disagree on the lane is refused.
	for i := 0; ; i++ {
		id := fmt.Sprintf("u-%d", i)
		if laneOf(id, n) != hashLane("k:other", n) {
			if _, err := c.Enqueue(ctx, "job", nil, TaskID(id), UniqueKey("other", 0)); !errors.Is(err, ErrInvalid) {
				t.Errorf("id and unique key in different lanes: %v", err)
			}
			break
		}
	}
	redistest.RequireNoViolations(t, e.srv)
}
