package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
)

// TestE2EQueuePauseResume: engine queue pause keeps the daemon from
// running the queue's tasks across its restart; stats shows the queue
// paused and the task ready; engine queue resume runs it.
func TestE2EQueuePauseResume(t *testing.T) {
	h := newHarness(t)
	if out := h.ok("queue", "pause", "default"); !strings.Contains(out, "queue default paused") {
		t.Errorf("pause printed %q", out)
	}
	id := h.enqueue("--type", "append", "--payload", "held")
	run := h.startRun(nil)
	// The daemon is up and has looked at the queue: its worker registered
	// and the task is still ready.
	h.eventually(10*time.Second, "the daemon's worker to start", func() bool { return strings.Contains(run.log(), "worker started") })
	if st := h.stats("default"); !st.Paused || st.Ready != 1 {
		t.Errorf("stats while paused = %+v, want paused with 1 ready", st)
	}
	if code, _ := run.stop(syscall.SIGTERM, 10*time.Second); code != 0 {
		t.Errorf("SIGTERM: exit %d", code)
	}
	run = h.startRun(nil)
	h.eventually(10*time.Second, "the restarted worker", func() bool { return strings.Contains(run.log(), "worker started") })
	if l := h.lookup(id); l.State != "ready" {
		t.Errorf("lookup while paused = %+v, want ready", l)
	}
	if out := h.ok("queue", "resume", "default"); !strings.Contains(out, "queue default resumed") {
		t.Errorf("resume printed %q", out)
	}
	h.eventually(10*time.Second, "the resumed task to run", func() bool { return strings.Contains(h.file("out"), "held "+id) })
	if st := h.stats("default"); st.Paused {
		t.Errorf("stats after resume = %+v, want not paused", st)
	}
	for _, args := range [][]string{{"queue", "pause"}, {"queue", "pause", "a b"}, {"queue", "stop", "x"}, {"queue", "resume", "a", "b"}} {
		if _, errOut, code := h.cli(args...); code != exitUsage || errOut == "" {
			t.Errorf("engine %v: exit %d, stderr %q; want a usage error", args, code, errOut)
		}
	}
	run.stop(syscall.SIGTERM, 10*time.Second)
}

// TestE2EUnservedQueueHint: a task enqueued into a queue no live worker
// serves is not waited for silently: enqueue --wait says so on stderr,
// and stats lists the queue below its table, as it lists unserved types.
func TestE2EUnservedQueueHint(t *testing.T) {
	h := newHarness(t)
	h.startRun(nil)
	// --wait-timeout is the real time the wait is given; 1s is plenty,
	// since the hint comes before the wait.
	_, errOut, code := h.cli("enqueue", "--type", "echo", "--queue", "typo", "--wait", "--wait-timeout", "1s")
	if code != exitWaitTimeout || !strings.Contains(errOut, `no live worker serves queue "typo"`) || !strings.Contains(errOut, "default") {
		t.Errorf("enqueue --queue typo --wait: exit %d, stderr %q; want %d and a hint naming the queues served", code, errOut, exitWaitTimeout)
	}
	out := h.ok("stats")
	if !strings.Contains(out, "queues no live worker serves") || !strings.Contains(out, "typo") {
		t.Errorf("stats lacks the unserved queue:\n%s", out)
	}
	var st struct {
		UnservedQueues []string `json:"unserved_queues"`
	}
	if err := json.Unmarshal([]byte(h.ok("stats", "--json")), &st); err != nil || len(st.UnservedQueues) != 1 || st.UnservedQueues[0] != "typo" {
		t.Errorf("stats --json unserved_queues = %v, %v; want [typo]", st.UnservedQueues, err)
	}
}

// TestE2EQueueLimit: engine queue limit sets a queue's concurrency limit,
// which stats shows, and --max-running 0 removes it; a bad value is a
// usage error.
func TestE2EQueueLimit(t *testing.T) {
	h := newHarness(t)
	if out := h.ok("queue", "limit", "mail", "--max-running", "3"); !strings.Contains(out, "queue mail: at most 3 running") {
		t.Errorf("limit printed %q", out)
	}
	if st := h.stats("mail"); st.MaxRunning != 3 || st.SlotsInUse != 0 {
		t.Errorf("stats = %+v, want max_running 3", st)
	}
	if out := h.ok("stats"); !strings.Contains(out, "LIMIT") || !strings.Contains(out, "0/3") {
		t.Errorf("stats table %q, want a LIMIT column with 0/3", out)
	}
	out := h.ok("queue", "limit", "mail", "--rate", "10/1s", "--key-max-running", "1", "--key-rate", "2/500ms")
	if !strings.Contains(out, "queue mail: at most 10/1s started, at most 1 running per key, at most 2/500ms started per key") {
		t.Errorf("limit printed %q", out)
	}
	if st := h.stats("mail"); st.MaxRunning != 0 || st.Rate != "10/1s" || st.KeyMaxRunning != 1 || st.KeyRate != "2/500ms" {
		t.Errorf("stats = %+v, want the max_running left out removed, the others set", st)
	}
	if out := h.ok("queue", "limit", "mail", "--max-running", "0"); !strings.Contains(out, "queue mail: no limit") {
		t.Errorf("limit 0 printed %q", out)
	}
	if st := h.stats("mail"); st.MaxRunning != 0 || st.Rate != "" || st.KeyMaxRunning != 0 {
		t.Errorf("stats after removal = %+v, want no limit", st)
	}
	for _, args := range [][]string{{"queue", "limit", "mail"}, {"queue", "limit", "mail", "--max-running", "-1"},
		{"queue", "limit", "mail", "--rate", "10"}, {"queue", "limit", "mail", "--key-rate", "1/0s"}, {"queue", "limit", "mail", "--key-max-running", "-2"},
		{"queue", "limit", "--max-running", "2"}, {"queue", "limit", "mail", "--max-running", "many"},
		{"queue", "limit", "a b", "--max-running", "2"}, {"queue", "limit", "a", "b", "--max-running", "2"}} {
		if _, errOut, code := h.cli(args...); code != exitUsage || errOut == "" {
			t.Errorf("engine %v: exit %d, stderr %q; want a usage error", args, code, errOut)
		}
	}
}

// TestE2EQueueLimitTwoDaemons: two daemons of 10 slots each on a queue
// limited to 3, tasks of 300 ms: at no instant do more than 3 commands
// run, and while the queue is deep 3 do. The commands' own start and end
// times (their spans file) are the ledger.
func TestE2EQueueLimitTwoDaemons(t *testing.T) {
	h := newHarness(t)
	h.ok("queue", "limit", "mail", "--max-running", "3")
	for range 12 {
		h.enqueue("--type", "slow300", "--queue", "mail")
	}
	a := h.startRun(nil, "--queues", "mail", "--concurrency", "10")
	b := h.startRun(nil, "--queues", "mail", "--concurrency", "10")
	h.eventually(30*time.Second, "the 12 tasks", func() bool { return h.stats("mail").Processed == 12 })
	for _, p := range []*proc{a, b} {
		if code, _ := p.stop(syscall.SIGTERM, 10*time.Second); code != 0 {
			t.Errorf("SIGTERM: exit %d", code)
		}
	}
	type edge struct {
		at    int64
		delta int
	}
	var edges []edge
	for _, l := range strings.Split(strings.TrimSpace(h.file("spans")), "\n") {
		kind, ns, _ := strings.Cut(l, " ")
		at, err := strconv.ParseInt(ns, 10, 64)
		if err != nil {
			t.Fatalf("spans line %q", l)
		}
		d := 1
		if kind == "E" {
			d = -1
		}
		edges = append(edges, edge{at, d})
	}
	if len(edges) != 24 {
		t.Fatalf("%d span lines, want 24", len(edges))
	}
	// Ends before starts at the same instant: a slot freed and taken in
	// the same nanosecond is not an overlap.
	sort.Slice(edges, func(i, j int) bool {
		return edges[i].at < edges[j].at || edges[i].at == edges[j].at && edges[i].delta < edges[j].delta
	})
	most, cur := 0, 0
	for _, e := range edges {
		cur += e.delta
		most = max(most, cur)
	}
	if most != 3 {
		t.Fatalf("at most %d commands ran at once, want exactly 3 (the limit, reached)", most)
	}
	if st := h.stats("mail"); st.SlotsInUse != 0 {
		t.Errorf("stats = %+v, want no slot in use", st)
	}
}

// TestE2EKeys: enqueue --key gives a task its flow-control key, which
// lookup shows and tasks list --key walks; stats counts the keys waiting;
// a bad key is a usage error.
func TestE2EKeys(t *testing.T) {
	h := newHarness(t)
	a := h.enqueue("--type", "echo", "--queue", "mail", "--key", "tenant-a")
	h.enqueue("--type", "echo", "--queue", "mail", "--key", "tenant-a")
	h.enqueue("--type", "echo", "--queue", "mail", "--key", "tenant-b")
	if l := h.lookup(a); l.Key != "tenant-a" || l.State != "ready" {
		t.Errorf("lookup = %+v, want key tenant-a, ready", l)
	}
	if out := h.ok("lookup", a); !strings.Contains(out, "tenant-a") {
		t.Errorf("lookup printed %q, want the key", out)
	}
	out := h.ok("tasks", "list", "--queue", "mail", "--state", "ready", "--key", "tenant-a")
	if strings.Count(out, "echo") != 2 {
		t.Errorf("tasks list --key tenant-a printed %q, want its 2 tasks", out)
	}
	if st := h.stats("mail"); st.KeysWaiting != 2 || st.Ready != 0 {
		t.Errorf("stats = %+v, want 2 keys waiting (keyed tasks are not in ready)", st)
	}
	var keys []engine.KeyInfo
	if err := json.Unmarshal([]byte(h.ok("queue", "keys", "mail", "--json")), &keys); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, k := range keys {
		got[k.Key] = k.Waiting
	}
	if len(keys) != 2 || got["tenant-a"] != 2 || got["tenant-b"] != 1 {
		t.Errorf("queue keys = %+v, want tenant-a with 2 waiting, tenant-b with 1", keys)
	}
	if out := h.ok("queue", "keys", "mail"); !strings.Contains(out, "tenant-b") || !strings.Contains(out, "WAITING") {
		t.Errorf("queue keys printed %q", out)
	}
	if _, errOut, code := h.cli("enqueue", "--type", "echo", "--key", "a:b"); code != exitUsage || errOut == "" {
		t.Errorf("enqueue --key a:b: exit %d, stderr %q; want a usage error", code, errOut)
	}
}

// TestE2EReloadLimits: SIGHUP makes engine run read its configuration
// again and write the queues' limits it lists; a configuration that does
// not load changes nothing; the process keeps running.
func TestE2EReloadLimits(t *testing.T) {
	h := newHarness(t)
	path := filepath.Join(t.TempDir(), "engine.yaml")
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("queues:\n  - {name: mail, max_running: 2}\n")
	p := h.startRun(nil, "--config", path)
	h.eventually(10*time.Second, "the configured limit", func() bool { return h.stats("mail").MaxRunning == 2 })
	write("queues:\n  - {name: mail, rate: 10/1s, key_max_running: 1}\n")
	_ = p.cmd.Process.Signal(syscall.SIGHUP)
	h.eventually(10*time.Second, "the reloaded limits", func() bool {
		st := h.stats("mail")
		return st.MaxRunning == 0 && st.Rate == "10/1s" && st.KeyMaxRunning == 1
	})
	write("queues:\n  - {name: mail, rate: ten}\n")
	_ = p.cmd.Process.Signal(syscall.SIGHUP)
	h.eventually(10*time.Second, "the refusal logged", func() bool { return strings.Contains(p.log(), "configuration did not load") })
	if st := h.stats("mail"); st.Rate != "10/1s" || st.KeyMaxRunning != 1 {
		t.Errorf("stats after a bad reload = %+v, want the limits unchanged", st)
	}
	if code, _ := p.stop(syscall.SIGTERM, 10*time.Second); code != 0 {
		t.Errorf("SIGTERM: exit %d", code)
	}
}
