package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
)

// TestTablesKeepIDs: tasks list and workers print every id whole (a task's,
// a running task's worker's, a worker's), so that it can be pasted into
// another command; the other columns keep their places.
func TestTablesKeepIDs(t *testing.T) {
	t.Parallel()
	now := time.Now()
	task := "0d1f9c1e-7b7a-4bb4-9a51-4e1a0c0b6f2e"
	long := "order-" + strings.Repeat("x", 90)
	worker := "6f0e7f4c-43f4-4c0e-b3b6-0c8cfd3d3a11"
	view := func(id string) *engine.TaskInfo {
		v := &engine.TaskInfo{Preview: "payload"}
		v.ID, v.Type, v.State, v.Due, v.MaxAttempts = id, "email.send", engine.StateScheduled, now.Add(time.Hour), 3
		return v
	}
	var b bytes.Buffer
	printTaskPage(&b, engine.Filter{State: engine.StateScheduled, Queue: "default"},
		&engine.TaskPage{Tasks: []*engine.TaskInfo{view(task), view(long)}, Total: 2}, now)
	run := view(task)
	run.State, run.Worker, run.Started, run.Lease = engine.StateRunning, worker, now, now.Add(time.Minute)
	printTaskPage(&b, engine.Filter{State: engine.StateRunning, Queue: "default"}, &engine.TaskPage{Tasks: []*engine.TaskInfo{run}, Total: 1}, now)
	printWorkers(&b, []engine.WorkerInfo{{ID: worker, Alive: true, Host: "host", PID: 7, Queues: []string{"default"}}})
	out := b.String()
	for _, id := range []string{task, long, worker} {
		if !strings.Contains(out, id) {
			t.Errorf("id %s cut:\n%s", id, out)
		}
	}
	if strings.Contains(out, "…") {
		t.Errorf("something cut:\n%s", out)
	}
}
