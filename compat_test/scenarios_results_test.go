package compat_test

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/engine"
)

// scenarioUniqueResults: a unique key refuses a duplicate while its task
// can run and is free after Cancel, success and death; a retry takes it
// again; results, Wait (before and after the end) and reply tasks.
func scenarioUniqueResults(e *env) {
	t := e.t
	ctx, cancel := e.ctxTimeout(60 * time.Second)
	defer cancel()
	cfg := e.cfg
	cfg.Queues = []engine.QueueConfig{{Name: "default"}, {Name: "replies"}}
	mux := engine.NewMux()
	replies := make(chan *engine.Outcome, 8)
	mux.HandleFunc(engine.ReplyType, func(ctx context.Context, task *engine.Task) error {
		o, err := engine.DecodeReply(task.Payload)
		if err != nil {
			return engine.Permanent(err)
		}
		replies <- o
		return nil
	})
	nextReply := func() *engine.Outcome {
		t.Helper()
		select {
		case o := <-replies:
			return o
		case <-time.After(outcomeWait):
			t.Fatal("no reply task ran")
			return nil
		}
	}
	mux.HandleFunc("echo", func(ctx context.Context, task *engine.Task) error {
		return engine.SetResult(ctx, append([]byte("echo:"), task.Payload...))
	})
	var died atomic.Bool
	mux.HandleFunc("die", func(ctx context.Context, task *engine.Task) error {
		if died.CompareAndSwap(false, true) {
			return engine.Permanent(errors.New("dies"))
		}
		return nil // revived
	})
	c := e.client()
	dup := func(err error, holder string) {
		t.Helper()
		var de *engine.ExistsError
		if !errors.As(err, &de) || de.IDs[0] != holder {
			t.Fatalf("enqueue: %v, want a duplicate of %s", err, holder)
		}
	}
	// Held while scheduled; Cancel frees it.
	first, err := c.Enqueue(ctx, "echo", nil, engine.UniqueKey("k", 0), engine.In(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Enqueue(ctx, "echo", nil, engine.UniqueKey("k", 0))
	dup(err, first.ID)
	if err := c.Cancel(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if o, err := c.Wait(ctx, first.ID); err != nil || o.State != engine.StateCancelled {
		t.Fatalf("wait for a cancelled task: %+v %v", o, err)
	}

	_, stop := e.server(cfg, mux)
	defer stop()
	// Done with a result, a reply, a key with a ttl.
	ok, err := c.Enqueue(ctx, "echo", []byte("x"), engine.Unique(time.Hour), engine.ReplyTo("replies"))
	if err != nil {
		t.Fatal(err)
	}
	o, err := c.Wait(ctx, ok.ID)
	if err != nil || o.State != engine.StateDone || string(o.Result) != "echo:x" {
		t.Fatalf("wait: %+v %v", o, err)
	}
	if r, err := c.Result(ctx, ok.ID); err != nil || string(r) != "echo:x" {
		t.Fatalf("result: %q %v", r, err)
	}
	if r := nextReply(); r.ID != ok.ID || string(r.Result) != "echo:x" {
		t.Fatalf("reply: %+v", r)
	}
	// Dead frees a key; a retry of the dead letter takes it again.
	dead, err := c.Enqueue(ctx, "die", nil, engine.UniqueKey("d", 0), engine.ReplyTo("replies"))
	if err != nil {
		t.Fatal(err)
	}
	if o, err := c.Wait(ctx, dead.ID); err != nil || o.State != engine.StateDead {
		t.Fatalf("wait for a dead task: %+v %v", o, err)
	}
	if r := nextReply(); r.State != engine.StateDead {
		t.Fatalf("reply of a dead task: %+v", r)
	}
	if res, err := e.inspector().Act(ctx, engine.ActionRetry, dead.ID); err != nil || res.Done != 1 {
		t.Fatalf("retry the dead letter: %+v %v", res, err)
	}
	if r := nextReply(); r.ID != dead.ID {
		t.Fatalf("reply of the revived task: %+v", r)
	}
	again, err := c.Enqueue(ctx, "echo", nil, engine.UniqueKey("d", 0))
	if err != nil {
		t.Fatalf("the key after the revived task ended: %v", err)
	}
	if _, err := c.Wait(ctx, again.ID); err != nil {
		t.Fatal(err)
	}
}
