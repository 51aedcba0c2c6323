package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// TestE2EShardsInspect: with a shards: map of three lanes on two servers,
// `dead`, `queue`, `tasks`, `workers`, `queues`, `periodic` and `workflow`
// span the lanes: lists merge every lane's tasks, calls by id go to the
// id's lane (and find a workflow's step in the workflow's lane, which its
// id does not name), pauses reach every lane, and the periodic entries
// are listed from lane 0, where they live.
func TestE2EShardsInspect(t *testing.T) {
	h := newHarness(t, redistest.Private())
	other := redistest.Start(t, redistest.Private())
	lanes := []string{h.srv.Addr, other.Addr, h.srv.Addr}
	const n = 3
	h.env = append(h.env, "ENGINE_SHARDS_LANES="+strings.Join(lanes, ","), "ENGINE_SHARDS_VERSION=1")
	var ns string
	for _, kv := range h.env {
		if v, ok := strings.CutPrefix(kv, "ENGINE_NAMESPACE="); ok {
			ns = v
		}
	}
	t.Cleanup(func() { other.Cleanup(t, ns) })
	pa, pb := h.srv.Pool(t), other.Pool(t)
	cfg := engine.Config{Namespace: ns}
	cfg.Advanced.MapVersion = 1
	sc, err := engine.NewClient(cfg, pa, pb, pa)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := func(prefix string, k int) string { return fmt.Sprintf("%s-%d~%d", prefix, k, k) }
	// The periodic entry's firings go to a queue of their own: the next
	// one is planned once the hour is within the scheduler's horizon, and
	// in the default queue it was listed with the tasks below in a run
	// near the top of an hour.
	run := h.startRun([]string{`ENGINE_PERIODIC=[{name: hourly, every: 1h, type: append, queue: ticks, payload: tick}]`})

	// dead: one dead letter in each lane.
	for k := range n {
		h.enqueue("--type", "flaky", "--max-attempts", "1", "--id", id("dead", k))
	}
	allDead := func() bool {
		for k := range n {
			if h.lookup(id("dead", k)).State != "dead" {
				return false
			}
		}
		return true
	}
	h.eventually(20*time.Second, "a dead letter in each lane", allDead)
	var dl []taskJSON
	if err := json.Unmarshal([]byte(h.ok("dead", "list", "--json")), &dl); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range dl {
		got = append(got, d.ID)
	}
	slices.Sort(got)
	if want := []string{id("dead", 0), id("dead", 1), id("dead", 2)}; !slices.Equal(got, want) {
		t.Errorf("dead list --json over the lanes: %v, want %v", got, want)
	}
	if out := h.ok("dead", "list"); !strings.Contains(out, "3 shown of 3 dead letters") {
		t.Errorf("dead list:\n%s", out)
	}
	// Paged one at a time, the listing's order (lane after lane, each
	// lane's newest first) gives each once.
	var paged []string
	for off := range n + 1 {
		var p []taskJSON
		if err := json.Unmarshal([]byte(h.ok("dead", "list", "--json", "--offset", fmt.Sprint(off), "--limit", "1")), &p); err != nil {
			t.Fatal(err)
		}
		for _, d := range p {
			paged = append(paged, d.ID)
		}
	}
	for i, d := range dl {
		if i >= len(paged) || paged[i] != d.ID {
			t.Errorf("dead list paged by --offset: %v, want the order %v", paged, got)
			break
		}
	}
	if len(paged) != n {
		t.Errorf("dead list paged by --offset: %v", paged)
	}
	if out := h.ok("dead", "retry", id("dead", 1)); !strings.Contains(out, "retried "+id("dead", 1)) {
		t.Errorf("dead retry in lane 1: %s", out)
	}
	h.eventually(20*time.Second, "the retried task to die again", func() bool {
		return h.lookup(id("dead", 1)).Attempts == 1 && allDead()
	})
	if out := h.ok("dead", "purge", "--all"); !strings.Contains(out, "purged 3 dead letters") {
		t.Errorf("dead purge --all over the lanes: %s", out)
	}
	if out := strings.TrimSpace(h.ok("dead", "list", "--json")); out != "[]" {
		t.Errorf("dead list after purge --all: %s", out)
	}

	// queue: a pause reaches every lane, and so does the resume.
	// Each lane's set of paused queues, read on the lane's server under
	// the lane's prefix.
	in, err := engine.NewInspector(cfg, pa, pb, pa)
	if err != nil {
		t.Fatal(err)
	}
	lanePools := []*redis.Pool{pa, pb, pa}
	pausedIn := func() []int {
		var ks []int
		for _, st := range in.LaneStatuses(ctx) {
			conn := lanePools[st.Lane].Get()
			paused, err := redis.Bool(conn.Do("SISMEMBER", st.Prefix+"paused", "default"))
			conn.Close()
			if err != nil {
				t.Fatal(err)
			}
			if paused {
				ks = append(ks, st.Lane)
			}
		}
		return ks
	}
	h.ok("queue", "pause", "default")
	if ks := pausedIn(); len(ks) != n {
		t.Errorf("queue pause: paused in lanes %v, want all %d", ks, n)
	}
	h.ok("queue", "resume", "default")
	if ks := pausedIn(); len(ks) != 0 {
		t.Errorf("queue resume: still paused in lanes %v", ks)
	}

	// tasks list: every lane's scheduled tasks, page after page.
	for k := range n {
		h.enqueue("--type", "append", "--id", id("s", k), "--in", "1h", "--payload", "sched")
	}
	var listed []string
	args := []string{"tasks", "list", "--state", "scheduled", "--json"}
	for range 2 * n {
		var p pageJSON
		if err := json.Unmarshal([]byte(h.ok(args...)), &p); err != nil {
			t.Fatal(err)
		}
		if p.Total != n {
			t.Errorf("tasks list: total %d, want %d over the lanes", p.Total, n)
		}
		for _, x := range p.Tasks {
			listed = append(listed, x.ID)
		}
		if p.Next == "" {
			break
		}
		args = append(args[:5:5], "--cursor", p.Next)
	}
	slices.Sort(listed)
	if want := []string{id("s", 0), id("s", 1), id("s", 2)}; !slices.Equal(listed, want) {
		t.Errorf("tasks list over the lanes: %v, want %v", listed, want)
	}
	// tasks cancel by id: each in its lane.
	if out := h.ok("tasks", "cancel", id("s", 0), id("s", 1)); !strings.Contains(out, "cancel: 2 done, 0 skipped") {
		t.Errorf("tasks cancel in lanes 0 and 1: %s", out)
	}
	for k := range 2 {
		if st := h.lookup(id("s", k)).State; st != "cancelled" {
			t.Errorf("lane %d's task after tasks cancel: %s", k, st)
		}
	}
	// tasks run by id of a workflow step: "<workflow>~0" names lane 0,
	// and the step is in the workflow's lane 2.
	wf := ""
	for i := 0; wf == ""; i++ {
		if c := fmt.Sprintf("wf%d", i); sc.LaneOf(c) == 2 {
			wf = c
		}
	}
	if _, err := sc.EnqueueChain(ctx, wf, engine.Step{Type: "append", Payload: []byte("step"), Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	step := wf + "~0"
	if sc.LaneOf(step) != 0 {
		t.Fatalf("step %s names lane %d", step, sc.LaneOf(step))
	}
	if out := h.ok("tasks", "run", step); !strings.Contains(out, "run: 1 done, 0 skipped (state does not allow it), 0 not found") {
		t.Errorf("tasks run of a workflow's step in another lane than its id names: %s", out)
	}
	h.eventually(20*time.Second, "the workflow's step to run", func() bool { return h.lookup(step).State == "done" })
	if out := h.ok("workflow", "show", wf); !strings.Contains(out, step) {
		t.Errorf("workflow show from lane 2:\n%s", out)
	}
	// tasks run --all: what is left scheduled, in lane 2.
	if out := h.ok("tasks", "run", "--all", "--state", "scheduled", "--yes"); !strings.Contains(out, "run: 1 done") {
		t.Errorf("tasks run --all over the lanes: %s", out)
	}
	h.eventually(20*time.Second, "lane 2's task to run", func() bool { return h.lookup(id("s", 2)).State == "done" })
	if _, _, code := h.cli("tasks", "cancel", "nosuch-task"); code != exitNotFound {
		t.Errorf("tasks cancel of an id no lane holds: exit %d, want %d", code, exitNotFound)
	}

	// workers and queues: every lane's.
	var ws []engine.WorkerInfo
	if err := json.Unmarshal([]byte(h.ok("workers", "--json")), &ws); err != nil {
		t.Fatal(err)
	}
	if len(ws) != n {
		t.Errorf("workers over the lanes: %d, want one per lane (%d)", len(ws), n)
	}
	var qs []engine.QueueInfo
	if err := json.Unmarshal([]byte(h.ok("queues", "--json")), &qs); err != nil {
		t.Fatal(err)
	}
	var def *engine.QueueInfo
	for i := range qs {
		if qs[i].Queue == "default" {
			def = &qs[i]
		}
	}
	// Processed: the two done tasks of lanes 2 (the step and s-2) and
	// every attempt of the three dead letters and the retried one.
	if def == nil || def.Scheduled != 0 || def.Processed < 2 {
		t.Errorf("queues over the lanes: %+v", qs)
	}

	// periodic: the entries, kept in lane 0.
	if out := h.ok("periodic", "list"); !strings.Contains(out, "hourly") || !strings.Contains(out, "1 live") {
		t.Errorf("periodic list with shards:\n%s", out)
	}

	if code, _ := run.stop(syscall.SIGTERM, 10*time.Second); code != 0 {
		t.Errorf("run exit %d", code)
	}
	redistest.RequireNoViolations(t, h.srv)
	redistest.RequireNoViolations(t, other)
}
