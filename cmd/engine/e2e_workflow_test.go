package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/redistest"
)

// TestWorkflowShowAndCancel: `engine workflow show` prints a chain's steps
// and states; `cancel` cancels it; a missing one exits 3.
func TestWorkflowShowAndCancel(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, out, errOut := inproc(t, srv)
	var ns string
	for _, kv := range a.environ {
		if v, ok := strings.CutPrefix(kv, "ENGINE_NAMESPACE="); ok {
			ns = v
		}
	}
	client, err := engine.NewClient(engine.Config{Namespace: ns}, srv.Pool(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := client.EnqueueChain(ctx, "nightly", engine.Step{Type: "extract", Delay: time.Hour},
		engine.Step{Type: "load"}); err != nil {
		t.Fatal(err)
	}
	if code := a.main(ctx, []string{"workflow", "show", "nightly"}); code != exitOK {
		t.Fatalf("show: exit %d\n%s", code, errOut.String())
	}
	for _, want := range []string{"nightly (chain)", "state", "running", "nightly~0", "extract", "scheduled", "nightly~1", "load", "pending"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("show lacks %q:\n%s", want, out.String())
		}
	}
	if code := a.main(ctx, []string{"lookup", "nightly~0"}); code != exitOK || !strings.Contains(out.String(), "chain nightly, task 1 of 2") {
		t.Fatalf("lookup of a step: exit %d\n%s", code, out.String())
	}
	if code := a.main(ctx, []string{"workflow", "cancel", "nightly"}); code != exitOK || !strings.Contains(out.String(), "workflow nightly cancelled (1 tasks cancelled)") {
		t.Fatalf("cancel: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	if code := a.main(ctx, []string{"workflow", "cancel", "nightly"}); code != exitRefused {
		t.Fatalf("second cancel: exit %d, want %d", code, exitRefused)
	}
	if code := a.main(ctx, []string{"workflow", "show", "nightly", "--json"}); code != exitOK || !strings.Contains(out.String(), `"state": "cancelled"`) {
		t.Fatalf("show --json: exit %d\n%s", code, out.String())
	}
	if code := a.main(ctx, []string{"workflow", "show", "nope"}); code != exitNotFound {
		t.Fatalf("show of no workflow: exit %d, want %d", code, exitNotFound)
	}
	if code := a.main(ctx, []string{"workflow", "show"}); code != exitUsage {
		t.Fatalf("show without an id: exit %d, want %d", code, exitUsage)
	}
}

// TestWorkflowEnqueue: `engine workflow enqueue` writes a chain (spec on
// stdin, a JSON payload kept as JSON, a string payload as its text) and a
// group (spec in a file, callback and policy); an id in use exits 5;
// a bad spec exits 2 saying where, before anything is sent.
func TestWorkflowEnqueue(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, out, errOut := inproc(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	chain := `{"id": "order-42", "chain": [
	  {"type": "charge", "payload": {"order": 42, "cents": 1999}, "queue": "billing", "max_attempts": 3, "delay": "1h"},
	  {"type": "ship", "payload": "by boat", "pass_result": true, "timeout": "30s"}]}`
	a.stdin = strings.NewReader(chain)
	if code := a.main(ctx, []string{"workflow", "enqueue", "--file", "-"}); code != exitOK {
		t.Fatalf("enqueue of a chain: exit %d\n%s", code, errOut.String())
	}
	if got := strings.TrimSpace(out.String()); got != "order-42" {
		t.Fatalf("enqueue printed %q, want the workflow id", got)
	}
	out.Reset()
	if code := a.main(ctx, []string{"lookup", "order-42~0", "--json"}); code != exitOK {
		t.Fatalf("lookup of the first step: exit %d\n%s", code, errOut.String())
	}
	for _, want := range []string{`"queue": "billing"`, `"max_attempts": 3`, `"state": "scheduled"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("first step lacks %s:\n%s", want, out.String())
		}
	}
	client, err := engine.NewClient(engine.Config{Namespace: namespaceOf(a)}, srv.Pool(t))
	if err != nil {
		t.Fatal(err)
	}
	info, err := client.Lookup(ctx, "order-42~0")
	if err != nil || string(info.Payload) != `{"order":42,"cents":1999}` {
		t.Fatalf("first step's payload %q, %v; want the JSON object as JSON", info.Payload, err)
	}

	spec := filepath.Join(t.TempDir(), "group.json")
	group := `{"id": "report-7", "group": [{"type": "part", "payload": "a"}, {"type": "part", "payload": "b"}],
	  "callback": {"type": "merge", "delay": "5s"}, "policy": "continue"}`
	if err := os.WriteFile(spec, []byte(group), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := a.main(ctx, []string{"workflow", "enqueue", "--file", spec, "--json"}); code != exitOK {
		t.Fatalf("enqueue of a group: exit %d\n%s", code, errOut.String())
	}
	for _, want := range []string{`"id": "report-7"`, `"kind": "group"`, `"policy": "continue"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("group lacks %s:\n%s", want, out.String())
		}
	}
	if info, err := client.Lookup(ctx, "report-7~1"); err != nil || string(info.Payload) != "b" || info.State != engine.StateReady {
		t.Fatalf("second member: %+v, %v; want ready, payload b", info, err)
	}
	if code := a.main(ctx, []string{"workflow", "enqueue", "--file", spec}); code != exitExists {
		t.Fatalf("enqueue of an id in use: exit %d, want %d\n%s", code, exitExists, errOut.String())
	}

	for _, c := range []struct{ spec, want string }{
		{`{"chain": [{"type": "a"}]}`, `"id" is required`},
		{`{"id": "w", "chain": [{"type": "a"}], "group": [{"type": "b"}]}`, "not both"},
		{`{"id": "w", "chain": [{"type": "a"}, {"payload": "x"}]}`, `chain[1]: "type" is required`},
		{`{"id": "w", "chain": [{"type": "a", "delay": "soon"}]}`, `chain[0]: "delay" "soon"`},
		{`{"id": "w", "group": [{"type": "a", "pass_result": true}]}`, `group[0]: "pass_result" belongs to a chain's step`},
		{`{"id": "w", "group": [{"type": "a"}], "policy": "maybe"}`, `"policy" "maybe"`},
		{`{"id": "w", "chain": [{"type": "a", "retries": 3}]}`, `unknown field "retries"`},
		{`{"id": "w", "chain": []}`, "no steps"},
		{`{"id": "w"}`, `want "chain"`},
	} {
		a.stdin = strings.NewReader(c.spec)
		errOut.Reset()
		if code := a.main(ctx, []string{"workflow", "enqueue", "--file", "-"}); code != exitUsage || !strings.Contains(errOut.String(), c.want) {
			t.Errorf("spec %s: exit %d, stderr %q; want %d saying %q", c.spec, code, errOut.String(), exitUsage, c.want)
		}
	}
	if code := a.main(ctx, []string{"workflow", "enqueue"}); code != exitUsage {
		t.Errorf("enqueue without --file: exit %d, want %d", code, exitUsage)
	}
}
