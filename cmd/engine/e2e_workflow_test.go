package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/redistest"
)

// TestWorkflowShowAndCancel: `engine workflow show` prints a chain's steps
// and states; `cancel` cancels it; a missing one exits 3.
func TestWorkflowShowAndCancel(t *testing.T) {
	srv := redistest.Start(t)
	a, out, errOut := inproc(t, srv)
	var ns string
	for _, kv := range a.environ {
		if v, ok := strings.CutPrefix(kv, "ENGINE_NAMESPACE="); ok {
			ns = v
		}
	}
	client, err := engine.NewClient(srv.Pool(t), engine.Config{Namespace: ns})
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
