package engine

import (
	"context"
	"fmt"
	"testing"
)

// TestShardWorkflows: a sharded client enqueues chains and groups each in
// the lane its id hashes to, and finds their steps by id although the
// steps' ids ("<workflow>~<i>") do not name that lane; the workflows run
// to the end under a ShardedServer.
func TestShardWorkflows(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	const n = 3
	c := e.shardedClient(t, e.sameServer(n))
	mux := NewMux()
	mux.HandleFunc("step", func(ctx context.Context, _ *Task) error { return SetResult(ctx, []byte("ok")) })
	srv, err := newShardedServer(e.sameServer(n), e.cfg, mux, AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, srv.Run)
	var ids []string
	lanes := map[int]bool{}
	for i := range 6 {
		id := fmt.Sprintf("import-%d", i)
		if i%2 == 0 {
			if _, err := c.EnqueueChain(ctx, id, Step{Type: "step"}, Step{Type: "step", PassResult: true}, Step{Type: "step"}); err != nil {
				t.Fatal(err)
			}
		} else {
			if _, err := c.EnqueueGroup(ctx, Group{ID: id, Members: []Step{{Type: "step"}, {Type: "step"}}, Callback: &Step{Type: "step"}}); err != nil {
				t.Fatal(err)
			}
		}
		ids = append(ids, id)
		lanes[c.LaneOf(id)] = true
	}
	if len(lanes) < 2 {
		t.Fatalf("the workflows went to lanes %v; want them spread", lanes)
	}
	for _, id := range ids {
		waitFor(t, outcomeWait, "workflow "+id+" done", func() bool {
			info, err := c.Workflow(ctx, id)
			return err == nil && info.State == "done"
		})
		info, err := c.Workflow(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		steps := append([]WorkflowStep(nil), info.Steps...)
		if info.Callback != nil {
			steps = append(steps, *info.Callback)
		}
		for _, s := range steps {
			ti, err := c.Lookup(ctx, s.ID)
			if err != nil || ti.State != StateDone {
				t.Errorf("lookup of %s's step %s through the sharded client: %+v, %v", id, s.ID, ti, err)
			}
			if v, err := c.inspector().Task(ctx, s.ID); err != nil || v.State != StateDone {
				t.Errorf("inspector task %s: %v", s.ID, err)
			}
		}
	}
}
