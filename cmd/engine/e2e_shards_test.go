package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/redistest"
)

// TestE2EShards: `engine run` with a shards: map serves every lane of two
// servers; `engine shards`, `stats` and `check` span the lanes, and
// enqueue, lookup and cancel route to the task's lane (the inspector's
// commands: TestE2EShardsInspect); a lane whose server is down is shown and fails
// `engine shards`.
func TestE2EShards(t *testing.T) {
	h := newHarness(t, redistest.Private())
	other := redistest.Start(t, redistest.Private())
	lanes := []string{h.srv.Addr, other.Addr, h.srv.Addr}
	h.env = append(h.env, "ENGINE_SHARDS_LANES="+strings.Join(lanes, ","), "ENGINE_SHARDS_VERSION=1")
	var ns string
	for _, kv := range h.env {
		if v, ok := strings.CutPrefix(kv, "ENGINE_NAMESPACE="); ok {
			ns = v
		}
	}

	run := h.startRun(nil)

	pa, pb := h.srv.Pool(t), other.Pool(t)
	cfg := engine.Config{Namespace: ns}
	cfg.Advanced.MapVersion = 1
	sc, err := engine.NewClient(cfg, pa, pb, pa)
	if err != nil {
		t.Fatal(err)
	}
	const n = 12
	inLane := map[int]int{}
	for i := range n {
		ti, err := sc.Enqueue(context.Background(), "append", []byte(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		inLane[sc.LaneOf(ti.ID)]++
	}
	if len(inLane) != 3 {
		t.Fatalf("tasks in lanes %v, want all three", inLane)
	}
	// The CLI routes too: enqueue to a lane, look up and cancel there.
	cliIDs := map[int]string{}
	for i := 0; len(cliIDs) < 3 && i < 50; i++ {
		id := strings.TrimSpace(h.ok("enqueue", "--type", "append", "--in", "1h", "--payload", "cli"))
		cliIDs[sc.LaneOf(id)] = id
	}
	for k, id := range cliIDs {
		if ti := h.lookup(id); ti.State != "scheduled" {
			t.Errorf("lookup of lane %d's %s: %+v", k, id, ti)
		}
		h.ok("cancel", id)
	}
	h.eventually(20*time.Second, "every task to run", func() bool {
		return strings.Count(h.file("out"), "\n") >= n
	})

	var sh shardsJSON
	if err := json.Unmarshal([]byte(h.ok("shards", "--json")), &sh); err != nil {
		t.Fatal(err)
	}
	if len(sh.Lanes) != 3 || sh.MapVersion != 1 {
		t.Fatalf("shards: %+v", sh)
	}
	for k, l := range sh.Lanes {
		if !l.Reachable || l.Server != lanes[k] || l.Role != "master" || l.Workers != 1 {
			t.Errorf("lane %d: %+v", k, l)
		}
	}
	if st := h.stats("default"); st.Processed != n {
		t.Errorf("stats over the lanes: %d processed, want %d", st.Processed, n)
	}
	// One report for the three lanes: their tasks together.
	if out := h.ok("check"); strings.Count(out, "no findings") != 1 || !strings.HasPrefix(out, "checked ") {
		t.Errorf("check over three lanes:\n%s", out)
	}
	// The dashboard and /metrics span the lanes too.
	dash := h.start(nil, "dashboard", "--http", "127.0.0.1:0")
	base := dash.httpAddr()
	h.eventually(10*time.Second, "/readyz to answer 200", func() bool { code, _ := httpGet(t, base+"/readyz"); return code == 200 })
	if code, body := httpGet(t, base+"/"); code != 200 || !strings.Contains(body, "default") {
		t.Errorf("dashboard over the lanes: %d\n%s", code, body)
	}
	if code, body := httpGet(t, base+"/metrics"); code != 200 || !strings.Contains(body, "bucketq_redis_stats_up 1") ||
		!strings.Contains(body, `bucketq_queue_tasks{queue="default",state="ready"} 0`) {
		t.Errorf("/metrics over the lanes: %d, want the gauges read from every lane\n%s", code, body)
	}
	dash.stop(syscall.SIGTERM, 10*time.Second)
	table := h.ok("shards")
	if !strings.Contains(table, other.Addr) || !strings.Contains(table, "shard map version 1") {
		t.Errorf("shards table:\n%s", table)
	}

	run.stop(syscall.SIGTERM, 10*time.Second)
	other.Kill(t)
	out, _, code := h.cli("shards")
	if code != exitFailure || !strings.Contains(out, "NO") {
		t.Errorf("shards with lane 1's server down: exit %d\n%s", code, out)
	}
	redistest.RequireNoViolations(t, h.srv)
	redistest.RequireNoViolations(t, other)
}
