package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bucketq/bucketq/engine"
)

// A chain: each step runs once its predecessor succeeded, and is given
// its result. The next step is written by the transaction that records
// the step's success.
func ExampleClient_EnqueueChain() {
	pool, done := newPool()
	defer done()
	ctx := context.Background()
	cfg := engine.Config{Namespace: "example", Logger: quiet}
	client, _ := engine.NewClient(cfg, pool)

	finished := make(chan string, 1)
	mux := engine.NewMux()
	mux.HandleFunc("fetch", func(ctx context.Context, t *engine.Task) error {
		return engine.SetResult(ctx, []byte("42 lines"))
	})
	mux.HandleFunc("count", func(ctx context.Context, t *engine.Task) error {
		w := t.Workflow
		fmt.Printf("step %d of %d got %q\n", w.Index, w.Total, w.Input)
		return engine.SetResult(ctx, []byte(strings.ToUpper(string(w.Input))))
	})
	mux.HandleFunc("report", func(ctx context.Context, t *engine.Task) error {
		finished <- fmt.Sprintf("report of %s: %s", t.Workflow.ID, t.Workflow.Input)
		return nil
	})
	srv, _ := engine.NewServer(cfg, mux, engine.AllRoles, pool)
	go srv.Run(ctx)
	defer srv.Shutdown(ctx)

	_, err := client.EnqueueChain(ctx, "import-7",
		engine.Step{Type: "fetch", Payload: []byte("s3://bucket/file")},
		engine.Step{Type: "count", PassResult: true},
		engine.Step{Type: "report", PassResult: true, Delay: 10 * time.Millisecond},
	)
	if err != nil {
		panic(err)
	}
	fmt.Println(<-finished)
	// The last step's outcome is recorded with the chain's.
	if _, err := client.Wait(ctx, "import-7~2"); err != nil {
		panic(err)
	}
	wf, _ := client.Workflow(ctx, "import-7")
	fmt.Println(wf.State)
	for _, s := range wf.Steps {
		fmt.Println(s.ID, s.Type, s.State)
	}
	_, err = client.EnqueueChain(ctx, "import-7", engine.Step{Type: "fetch"})
	fmt.Println(errors.Is(err, engine.ErrTaskExists))
	// Output:
	// step 1 of 3 got "42 lines"
	// report of import-7: 42 LINES
	// done
	// import-7~0 fetch done
	// import-7~1 count done
	// import-7~2 report done
	// true
}

// A group: members run in parallel; the callback runs once, after the
// last member ended, with every member's outcome.
func ExampleClient_EnqueueGroup() {
	pool, done := newPool()
	defer done()
	ctx := context.Background()
	cfg := engine.Config{Namespace: "example", Logger: quiet}
	client, _ := engine.NewClient(cfg, pool)

	summary := make(chan []engine.Outcome, 1)
	mux := engine.NewMux()
	mux.HandleFunc("resize", func(ctx context.Context, t *engine.Task) error {
		if string(t.Payload) == "broken.png" {
			return engine.Permanent(errors.New("not an image"))
		}
		return engine.SetResult(ctx, []byte("thumb-"+string(t.Payload)))
	})
	mux.HandleFunc("album.ready", func(ctx context.Context, t *engine.Task) error {
		summary <- t.Workflow.Outcomes
		return nil
	})
	srv, _ := engine.NewServer(cfg, mux, engine.AllRoles, pool)
	go srv.Run(ctx)
	defer srv.Shutdown(ctx)

	var members []engine.Step
	for _, f := range []string{"a.png", "broken.png", "c.png"} {
		members = append(members, engine.Step{Type: "resize", Payload: []byte(f)})
	}
	_, err := client.EnqueueGroup(ctx, engine.Group{
		ID:                "album-3",
		Members:           members,
		Callback:          &engine.Step{Type: "album.ready"},
		ContinueOnFailure: true, // the callback runs even if a member died
	})
	if err != nil {
		panic(err)
	}
	for _, o := range <-summary {
		fmt.Printf("%s %s %q%s\n", o.ID, o.State, o.Result, strings.TrimRight(" "+o.Error, " "))
	}
	// Output:
	// album-3~0 done "thumb-a.png"
	// album-3~1 dead "" not an image
	// album-3~2 done "thumb-c.png"
}
