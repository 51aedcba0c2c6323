package engine

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

// TestWriteSizeLimit: one rule bounds the bytes of tasks one transaction
// writes, MaxWriteBytes: a chain's steps, a group's members and callback
// (a group of 1,000 members of 512 KiB each was accepted while a chain was
// capped), a batch (which may still hold one task as large as MaxPayload).
// Past it the call is refused, naming the limit, and nothing is written.
func TestWriteSizeLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	ctx := context.Background()
	c := e.client(t)
	big := bytes.Repeat([]byte("x"), 512<<10-100) // room for the types and queues
	n := maxWriteBytes/len(big) + 1               // members that pass the limit together

	members := make([]Step, n)
	for i := range members {
		members[i] = Step{Type: "m", Payload: big}
	}
	_, err := c.EnqueueGroup(ctx, Group{ID: "g", Members: members})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "limit") {
		t.Errorf("group of %d x ~512 KiB: %v, want ErrTooLarge naming the limit", n, err)
	}
	// The callback counts too.
	_, err = c.EnqueueGroup(ctx, Group{ID: "g", Members: members[:n-1], Callback: &Step{Type: "cb", Payload: big}})
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("group with a 512 KiB callback past the limit: %v, want ErrTooLarge", err)
	}
	if _, err := c.EnqueueChain(ctx, "c", members...); !errors.Is(err, ErrTooLarge) {
		t.Errorf("chain of %d x ~512 KiB: %v, want ErrTooLarge", n, err)
	}
	tasks := make([]NewTask, n)
	for i := range tasks {
		tasks[i] = NewTask{Type: "b", Payload: big}
	}
	if _, err := c.EnqueueBatch(ctx, tasks); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "limit") {
		t.Errorf("batch of %d x ~512 KiB: %v, want ErrTooLarge naming the limit", n, err)
	}
	if keys := e.keys(t); len(keys) != 0 {
		t.Fatalf("refused writes left keys: %v", keys)
	}

	// Up to the limit, all are written.
	if _, err := c.EnqueueGroup(ctx, Group{ID: "g", Members: members[:n-1]}); err != nil {
		t.Errorf("group of %d x ~512 KiB: %v", n-1, err)
	}
	if _, err := c.EnqueueBatch(ctx, tasks[:n-1]); err != nil {
		t.Errorf("batch of %d x ~512 KiB: %v", n-1, err)
	}
	// A batch of one task is bounded by MaxPayload alone.
	e.cfg.MaxPayload = maxWriteBytes * 2
	c = e.client(t)
	huge := bytes.Repeat([]byte("y"), maxWriteBytes+1)
	if _, err := c.EnqueueBatch(ctx, []NewTask{{Type: "b", Payload: huge}}); err != nil {
		t.Errorf("batch of one task over MaxWriteBytes under MaxPayload: %v", err)
	}
}
