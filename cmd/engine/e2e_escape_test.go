package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
)

// rawControls are what must not reach an operator's terminal as is: ESC,
// BEL, CR, a C1 CSI and the bidirectional overrides and isolates.
var rawControls = []string{"\x1b", "\x07", "\r", "\u009b", "\u202e", "\u2066"}

func checkEscaped(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, c := range rawControls {
		if strings.Contains(out, c) {
			t.Errorf("%s prints %q raw:\n%q", what, c, out)
		}
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, out)
		}
	}
}

// TestE2EOutputEscapesTaskData: a handler's stderr (the last error), and a
// type, are shown by dead list, lookup, tasks list, enqueue --wait and
// their --json forms with control and bidirectional characters escaped.
func TestE2EOutputEscapesTaskData(t *testing.T) {
	h := newHarness(t)
	cfg := filepath.Join(h.dir, "config.yaml")
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(`  evil:
    command: [sh, -c, 'printf "\033]0;pwned\007 \342\200\256gnp.exe \302\233 \342\201\246x\r boom\n" >&2; exit 3']
`)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	h.startRun(nil)
	id := h.enqueue("--type", "evil", "--max-attempts", "1")
	h.eventually(15*time.Second, "the task in the dead letters", func() bool { return h.lookup(id).State == "dead" })

	checkEscaped(t, "dead list", h.ok("dead", "list"), id, `\x1b]0;pwned\x07`, `\u202egnp.exe`)
	checkEscaped(t, "lookup", h.ok("lookup", id), id, `\x1b]0;pwned\x07`, `\u202egnp.exe`)
	checkEscaped(t, "tasks list", h.ok("tasks", "list", "--state", "dead", "--queue", "default"), id[:8])
	js := h.ok("dead", "list", "--json")
	checkEscaped(t, "dead list --json", js)
	var dead []taskJSON
	if err := json.Unmarshal([]byte(js), &dead); err != nil || len(dead) != 1 || !strings.Contains(dead[0].LastError, "\x1b]0;pwned\x07 \u202egnp.exe \u009b \u2066x\r boom") {
		t.Errorf("dead list --json = %+v, %v: want the error as the handler wrote it, once decoded", dead, err)
	}
	checkEscaped(t, "lookup --json", h.ok("lookup", id, "--json"))

	_, errOut, code := h.cli("enqueue", "--type", "evil", "--max-attempts", "1", "--wait", "--wait-timeout", "20s")
	if code != exitWaitDead {
		t.Errorf("enqueue --wait: exit %d, want %d: %s", code, exitWaitDead, errOut)
	}
	checkEscaped(t, "enqueue --wait", errOut, `\x1b]0;pwned\x07`)

	// A type may hold characters that are not control characters of
	// ASCII: a C1 control, a bidirectional override. The CLI refuses such
	// a type (a quoting slip), but a program's producer may write one.
	typ := "pay\u202eexe.\u009b"
	other := h.enqueueLibrary(typ, time.Hour)
	checkEscaped(t, "lookup of a task of a strange type", h.ok("lookup", other), `pay\u202eexe.\u009b`)
	checkEscaped(t, "tasks list of a strange type", h.ok("tasks", "list", "--state", "scheduled", "--queue", "default"), `pay\u202e`)
	checkEscaped(t, "stats", h.ok("stats"))
}

// enqueueLibrary enqueues a task of type typ due in d through the library,
// in the binary's namespace, and returns its id.
func (h *harness) enqueueLibrary(typ string, d time.Duration) string {
	h.t.Helper()
	ns := ""
	for _, kv := range h.env {
		if v, ok := strings.CutPrefix(kv, "ENGINE_NAMESPACE="); ok {
			ns = v
		}
	}
	c, err := engine.NewClient(engine.Config{Namespace: ns}, h.srv.Pool(h.t))
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := c.Enqueue(ctx, typ, nil, engine.In(d))
	if err != nil {
		h.t.Fatal(err)
	}
	return info.ID
}
