package dashboard_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/dashboard"
	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/internal/testwait"
)

// The workflow page lists a chain's steps with their states, and a step's
// task page links to its workflow and shows the result and the progress
// it recorded; the running listing shows a running task's progress.
func TestWorkflowAndResultPages(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pool := srv.Pool(t)
	cfg := engine.DefaultConfig()
	cfg.Namespace = redistest.Namespace(t)
	t.Cleanup(func() { srv.Cleanup(t, cfg.Namespace) })
	cfg.Logger = slog.New(slog.DiscardHandler)
	client, err := engine.NewClient(cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	mux := engine.NewMux()
	mux.HandleFunc("fetch", func(ctx context.Context, _ *engine.Task) error {
		if err := engine.SetProgress(ctx, 42, "lines read so far"); err != nil {
			return err
		}
		return engine.SetResult(ctx, []byte("42 lines fetched"))
	})
	holding, release := make(chan struct{}), make(chan struct{})
	mux.HandleFunc("hold", func(ctx context.Context, _ *engine.Task) error {
		if err := engine.SetProgress(ctx, 7, "rows & <b>counted</b>"); err != nil {
			return err
		}
		close(holding)
		<-release
		return nil
	})
	mux.HandleFunc("report", func(context.Context, *engine.Task) error { return nil })
	es, err := engine.NewServer(cfg, mux, engine.AllRoles, pool)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = es.Run(ctx) }()
	t.Cleanup(func() {
		sctx, c := context.WithTimeout(context.Background(), 10*time.Second)
		defer c()
		_ = es.Shutdown(sctx)
		cancel()
		<-done
	})
	t.Cleanup(func() { close(release) }) // before the server's stop: cleanups run last first
	wf, err := client.EnqueueChain(context.Background(), "import-7",
		engine.Step{Type: "fetch"}, engine.Step{Type: "report", PassResult: true})
	if err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 20*time.Second, "the chain to finish", func() bool {
		info, err := client.Workflow(context.Background(), wf.ID)
		if err == nil && info.State == "done" {
			wf = info
			return true
		}
		return false
	})
	in, err := engine.NewInspector(cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dashboard.New(in, dashboard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(d)
	t.Cleanup(hs.Close)
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	page := get("/workflows/" + url.PathEscape(wf.ID))
	for _, want := range []string{"Chain", wf.ID, wf.Steps[0].ID, wf.Steps[1].ID, "fetch", "report", "s-done"} {
		if !strings.Contains(page, want) {
			t.Errorf("workflow page lacks %q", want)
		}
	}
	// A run's report is written by the worker's progress writer, apart
	// from its result: wait for it to land.
	testwait.Until(t, 20*time.Second, "the first step's report", func() bool {
		return strings.Contains(get("/tasks/"+url.PathEscape(wf.Steps[0].ID)), "42 lines read so far")
	})
	step := get("/tasks/" + url.PathEscape(wf.Steps[0].ID))
	for _, want := range []string{"/workflows/" + url.PathEscape(wf.ID), "step 0 of 2", "42 lines fetched", "42 lines read so far", "<dt>Priority</dt><dd>1 "} {
		if !strings.Contains(step, want) {
			t.Errorf("task page of the first step lacks %q", want)
		}
	}
	if err := in.SetQueueLimits(context.Background(), engine.QueueConfig{Name: "default", MaxRunning: 5}); err != nil {
		t.Fatal(err)
	}
	if page := get("/"); !strings.Contains(page, "/5</td>") {
		t.Errorf("the overview does not show the queue's limit of 5:\n%s", page)
	}
	held, err := client.Enqueue(context.Background(), "hold", nil)
	if err != nil {
		t.Fatal(err)
	}
	<-holding
	// The progress is written on a connection of its own.
	testwait.Until(t, 20*time.Second, fmt.Sprintf("the running listing to show task %s's progress", held.ID), func() bool {
		return strings.Contains(get("/queues/default?state=running"), "7 rows &amp; &lt;b&gt;counted&lt;/b&gt;")
	})
	resp, err := http.Get(hs.URL + "/workflows/no-such-workflow")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("an unknown workflow: %d, want 404", resp.StatusCode)
	}
}
