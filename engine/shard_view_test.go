package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// TestShardOneView: stats, the inspector, check and the lane statuses
// fan out over every lane and merge; a lane whose server is down is named
// while the others are still reported.
func TestShardOneView(t *testing.T) {
	t.Parallel()
	sa := redistest.Start(t, redistest.Private())
	sb := redistest.Start(t, redistest.Private())
	e := newEnv(t, sa)
	pa, pb := sa.Pool(t), sb.Pool(t)
	sh := shardSpec{Pools: []*redis.Pool{pa, pb, pa}}
	c := e.shardedClient(t, sh)
	ctx := context.Background()

	perLane := map[int]int{}
	var ids []string
	for i := range 30 {
		opts := []Option{Queue("mail")}
		if i%3 == 0 {
			opts = append(opts, In(time.Hour))
		}
		ti, err := c.Enqueue(ctx, "job", nil, opts...)
		if err != nil {
			t.Fatal(err)
		}
		perLane[c.LaneOf(ti.ID)]++
		ids = append(ids, ti.ID)
	}
	if len(perLane) != 3 {
		t.Fatalf("tasks in lanes %v, want all three", perLane)
	}
	in := c.inspector()
	stats, err := in.Queues(ctx)
	if err != nil || len(stats) != 1 || stats[0].Ready != 20 || stats[0].Scheduled != 10 {
		t.Fatalf("merged queues %+v, %v; want one queue with 20 ready and 10 scheduled", stats, err)
	}
	ls := in.LaneStatuses(ctx)
	for k, st := range ls {
		if !st.Reachable || st.Err != "" || int(st.Ready+st.Scheduled) != perLane[k] {
			t.Errorf("lane %d: %+v, want reachable with %d tasks", k, st, perLane[k])
		}
	}
	rep, err := in.Check(ctx, CheckOptions{})
	if err != nil || len(rep.Findings) != 0 || rep.Tasks != 30 {
		t.Fatalf("check: %+v, %v", rep, err)
	}
	if v, err := in.Task(ctx, ids[1]); err != nil || v.ID != ids[1] {
		t.Fatalf("inspector task: %+v %v", v, err)
	}
	listed := map[string]bool{}
	opts := ListOptions{Filter: Filter{Queue: "mail", State: StateReady}, Limit: 4}
	for pages := 0; ; pages++ {
		page, err := in.ListTasks(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		if page.Total != 20 {
			t.Errorf("page total %d, want 20", page.Total)
		}
		for _, v := range page.Tasks {
			listed[v.ID] = true
		}
		if page.Next == "" || pages > 50 {
			break
		}
		opts.Cursor = page.Next
	}
	if len(listed) != 20 {
		t.Errorf("listing found %d ready tasks, want 20", len(listed))
	}
	res, err := in.Act(ctx, ActionCancel, ids[0], ids[1], ids[2])
	if err != nil || res.Done != 3 {
		t.Fatalf("act: %+v %v", res, err)
	}

	// Lane 1's server goes down: its lane is named, the others counted.
	sb.Kill(t)
	ls = in.LaneStatuses(ctx)
	if ls[1].Reachable || ls[1].Err == "" || !ls[0].Reachable || !ls[2].Reachable {
		t.Errorf("with lane 1 down: %+v", ls)
	}
	stats, err = in.Queues(ctx)
	if err == nil || !strings.Contains(err.Error(), "lane 1") || len(stats) != 1 {
		t.Errorf("queues with lane 1 down: %+v, %v", stats, err)
	}
	if crep, err := in.Check(ctx, CheckOptions{}); err == nil || !strings.Contains(err.Error(), "lane 1") || crep == nil || crep.Tasks == 0 {
		t.Errorf("check with lane 1 down: %+v, %v; want lane 1 named and the others' tasks counted", crep, err)
	}
	redistest.RequireNoViolations(t, sa)
	redistest.RequireNoViolations(t, sb)
}

// TestShardBatchFallback: while a lane's server is down, the movable tasks
// of a batch meant for it go to one other lane together (one transaction),
// the pinned ones fail with the lane's error, and the result says so.
func TestShardBatchFallback(t *testing.T) {
	t.Parallel()
	sa := redistest.Start(t, redistest.Private())
	sb := redistest.Start(t, redistest.Private())
	e := newEnv(t, sa)
	pa, pb := sa.Pool(t), sb.Pool(t)
	const n = 3
	c := e.shardedClient(t, shardSpec{Pools: []*redis.Pool{pa, pb, pa}})
	sb.Kill(t)
	key := idInLane("cust", 1, n) // a shard key of lane 1
	var batch []NewTask
	for range 10 {
		batch = append(batch, NewTask{Type: "job", Options: []Option{ShardKey(key)}})
	}
	pinned := idInLane("pinned", 1, n)
	batch = append(batch, NewTask{Type: "job", Options: []Option{TaskID(pinned)}})
	res, err := c.EnqueueBatch(context.Background(), batch)
	if err == nil || !strings.Contains(err.Error(), "lane 1") {
		t.Fatalf("batch with lane 1 down: %v, want lane 1's error", err)
	}
	var be *BatchError
	if !errors.As(err, &be) || len(be.Errs) != len(batch) || len(res) != len(batch) {
		t.Fatalf("batch with lane 1 down: %v, want a *BatchError over %d tasks", err, len(batch))
	}
	to := c.LaneOf(res[0].ID)
	for i := range 10 {
		if res[i] == nil || be.Errs[i] != nil || to == 1 || c.LaneOf(res[i].ID) != to {
			t.Fatalf("movable task %d: lane %d (first %d), %+v, %v", i, c.LaneOf(res[i].ID), to, res[i], be.Errs[i])
		}
	}
	if res[10] != nil || be.Errs[10] == nil {
		t.Errorf("pinned task: %+v, %v; want not written, with lane 1's error", res[10], be.Errs[10])
	}
	if c.Rerouted() != 10 {
		t.Errorf("rerouted %d, want 10", c.Rerouted())
	}
	redistest.RequireNoViolations(t, sa)
}
