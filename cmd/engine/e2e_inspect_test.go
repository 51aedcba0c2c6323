package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/bucketq/bucketq/engine"
)

// fits fails the test if a line of out is wider than a terminal, but for
// ids, which are never cut: a line may be wider by what the longest id
// in out needs beyond idW, the id column's width.
func fits(t *testing.T, what, out string, idW int) {
	t.Helper()
	extra := 0
	for _, id := range idLike.FindAllString(out, -1) {
		extra = max(extra, len(id)-idW)
	}
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if strings.HasPrefix(l, "more: --cursor ") {
			continue // meant to be copied, not read
		}
		if n := utf8.RuneCountInString(l); n > 80+extra {
			t.Errorf("%s: a line of %d characters:\n%s", what, n, l)
		}
	}
}

// idLike matches the ids of TestE2EInspect: workers', tasks' and its
// long one.
var idLike = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\b[0-9A-Za-z]{22}\b|order-x+`)

// TestE2EInspect: tasks list in every state, workers and queues, as
// tables that fit 80 columns and as JSON; paging with --cursor; the
// actions on ids and on a filter, with their counts; a check after them
// finds nothing.
func TestE2EInspect(t *testing.T) {
	h := newHarness(t)
	h.startRun(nil)
	running, _ := h.startSleeper()
	longID := "order-" + strings.Repeat("x", 90)
	long := h.enqueue("--type", "append", "--id", longID, "--payload", strings.Repeat("long payload ", 20), "--in", "1h")
	s1 := h.enqueue("--type", "append", "--payload", "first", "--in", "2h")
	s2 := h.enqueue("--type", "append", "--payload", "second", "--in", "3h")
	dead := h.enqueue("--type", "flaky", "--max-attempts", "1")
	r1 := h.enqueue("--type", "append", "--queue", "idle", "--payload", "red apple")
	r2 := h.enqueue("--type", "append", "--queue", "idle", "--payload", "green pear")
	h.eventually(15*time.Second, "the dead letter", func() bool { return h.lookup(dead).State == "dead" })

	out := h.ok("tasks", "list", "--queue", "default", "--state", "scheduled")
	fits(t, "tasks list", out, 14)
	if !strings.Contains(out, longID+" ") || !strings.Contains(out, "long payload long p…") ||
		!strings.Contains(out, "3 shown of 3 scheduled in queue default") || strings.Index(out, "order-") > strings.Index(out, s1[:13]) {
		t.Errorf("tasks list scheduled, in due order, long id whole and payload cut:\n%s", out)
	}
	var page pageJSON
	if err := json.Unmarshal([]byte(h.ok("tasks", "list", "--state", "scheduled", "--json")), &page); err != nil ||
		len(page.Tasks) != 3 || page.Total != 3 || page.Tasks[0].ID != long || page.Tasks[1].ID != s1 || page.Tasks[2].ID != s2 {
		t.Errorf("tasks list --json = %+v, %v", page, err)
	}
	// Paging: one at a time, resumed with --cursor.
	var seen []string
	args := []string{"tasks", "list", "--state", "scheduled", "--limit", "1", "--json"}
	for i := 0; i < 5; i++ {
		var p pageJSON
		if err := json.Unmarshal([]byte(h.ok(args...)), &p); err != nil {
			t.Fatal(err)
		}
		for _, x := range p.Tasks {
			seen = append(seen, x.ID)
		}
		if p.Next == "" {
			break
		}
		args = append(args[:len(args):len(args)], "--cursor", p.Next)
	}
	if strings.Join(seen, " ") != strings.Join([]string{long, s1, s2}, " ") {
		t.Errorf("paged one at a time: %v", seen)
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--state", "running"}, []string{running[:13], "1 shown of 1 running"}},
		{[]string{"--state", "running", "--queue", ""}, []string{running[:13], "in every queue"}},
		{[]string{"--state", "dead"}, []string{dead[:13], "exited with status 3", "1 shown of 1 dead"}},
		{[]string{"--state", "ready", "--queue", "idle"}, []string{r1[:13], r2[:13], "red apple", "2 shown of 2 ready"}},
		{[]string{"--state", "ready", "--queue", "idle", "--search", "pear"}, []string{r2[:13], "1 shown of 2 ready"}},
	} {
		out := h.ok(append([]string{"tasks", "list"}, c.args...)...)
		fits(t, strings.Join(c.args, " "), out, 14)
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("tasks list %v lacks %q:\n%s", c.args, w, out)
			}
		}
	}
	if _, errOut, code := h.cli("tasks", "list", "--state", "done"); code != exitUsage || !strings.Contains(errOut, "by id") {
		t.Errorf("tasks list --state done: exit %d, %q", code, errOut)
	}
	if _, _, code := h.cli("tasks", "list", "--state", "bogus"); code != exitUsage {
		t.Errorf("tasks list --state bogus: exit %d, want %d", code, exitUsage)
	}

	out = h.ok("workers")
	fits(t, "workers", out, 20)
	if !strings.Contains(out, "yes") || !strings.Contains(out, "1 workers") || !strings.Contains(out, "default") {
		t.Errorf("workers:\n%s", out)
	}
	var ws []engine.WorkerInfo
	if err := json.Unmarshal([]byte(h.ok("workers", "--json")), &ws); err != nil || len(ws) != 1 || !ws[0].Alive ||
		ws[0].Running != 1 || len(ws[0].Tasks) != 1 || ws[0].Tasks[0].ID != running || ws[0].PID == 0 {
		t.Errorf("workers --json = %+v, %v", ws, err)
	}
	out = h.ok("queues")
	fits(t, "queues", out, 14)
	if !strings.Contains(out, "idle") || !strings.Contains(out, "default") {
		t.Errorf("queues:\n%s", out)
	}
	var qs []engine.QueueInfo
	if err := json.Unmarshal([]byte(h.ok("queues", "--json")), &qs); err != nil || len(qs) != 2 ||
		qs[0].Queue != "default" || qs[0].Scheduled != 3 || qs[0].Running != 1 || qs[0].Dead != 1 || qs[1].Ready != 2 || qs[1].Latency <= 0 {
		t.Errorf("queues --json = %+v, %v", qs, err)
	}

	// Actions on ids.
	if out := h.ok("tasks", "run", s2); !strings.Contains(out, "run: 1 done, 0 skipped") {
		t.Errorf("tasks run: %q", out)
	}
	h.eventually(10*time.Second, "the task run now", func() bool { return strings.Contains(h.file("out"), "second "+s2) })
	if out, _, code := h.cli("tasks", "run", running); code != exitRefused || !strings.Contains(out, "1 skipped") {
		t.Errorf("tasks run of a running task: exit %d %q, want %d", code, out, exitRefused)
	}
	if _, _, code := h.cli("tasks", "cancel", "no-such-task"); code != exitNotFound {
		t.Errorf("tasks cancel of an unknown id: exit %d, want %d", code, exitNotFound)
	}
	// Actions on a filter: refused without --yes off a terminal.
	if _, errOut, code := h.cli("tasks", "delete", "--all", "--state", "scheduled"); code != exitUsage || !strings.Contains(errOut, "--yes") {
		t.Errorf("delete --all without --yes: exit %d %q", code, errOut)
	}
	if out := h.ok("tasks", "cancel", "--all", "--queue", "idle", "--state", "ready", "--search", "apple", "--yes"); !strings.Contains(out, "cancel: 1 done") {
		t.Errorf("cancel --all --search: %q", out)
	}
	if out := h.ok("tasks", "delete", "--all", "--state", "scheduled", "--yes"); !strings.Contains(out, "delete: 2 done") {
		t.Errorf("delete --all: %q", out)
	}
	if l := h.lookup(r1); l.State != "cancelled" {
		t.Errorf("cancelled by filter: %+v", l)
	}
	var res engine.ActionResult
	if err := json.Unmarshal([]byte(h.ok("tasks", "delete", "--json", r2, running)), &res); err != nil || res.Done != 2 {
		t.Errorf("delete --json of a ready and a running task: %+v, %v", res, err)
	}
	if out := h.ok("tasks", "retry", "--all", "--state", "dead", "--queue", "", "--yes"); !strings.Contains(out, "retry: 1 done") {
		t.Errorf("retry --all dead: %q", out)
	}
	h.eventually(15*time.Second, "the retried task to fail again", func() bool {
		return h.stats("default").Failed == 2 && h.lookup(dead).State == "dead"
	})
	h.ok("check")
}
