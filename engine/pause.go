package engine

import (
	"context"
	"time"
)

// PauseQueue pauses queue q: once it returns nil, no worker starts a task
// of q (a claim reads the paused set under WATCH; a task taken from q
// meanwhile goes back to the front of it). Running tasks finish; the
// dispatcher still makes due tasks ready; enqueueing still works. Workers
// leave q out of their fetches and wake-up waits within milliseconds
// (pub/sub on the namespace's control channel). The pause is kept in
// Redis and survives restarts of every process, until ResumeQueue.
// Pausing a paused queue does nothing more.
func (c *laneClient) PauseQueue(ctx context.Context, q string) error {
	if err := validateQueue(q); err != nil {
		return err
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := c.store.Pause(ctx, conn, q); err != nil {
		return failed("pause queue "+q, err)
	}
	return nil
}

// ResumeQueue resumes queue q: workers take its tasks again, idle ones at
// once (the resume pushes wake-up tokens and tells the subscribed
// workers). Resuming a queue that is not paused only wakes idle workers.
func (c *laneClient) ResumeQueue(ctx context.Context, q string) error {
	if err := validateQueue(q); err != nil {
		return err
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := c.store.Resume(ctx, conn, q); err != nil {
		return failed("resume queue "+q, err)
	}
	return nil
}

// UnservedType is a task type that a worker gave back on a queue because
// it has no handler for it, while no live worker serves it there.
type UnservedType struct {
	Queue string `json:"queue"`
	Type  string `json:"type"`
	// Since is when a worker first gave back a task of the type while
	// none served it (that worker's clock). Once Config.Advanced.UnknownTypeGrace
	// has passed since, the unknown-type policy applies to its tasks.
	Since time.Time `json:"since"`
}

// Unserved lists, for every known queue, the task types that workers
// gave back and that no live worker serves now (a live worker serving a
// type says so in its heartbeat). A type stays listed until a worker
// serving it on that queue starts.
func (c *laneClient) Unserved(ctx context.Context) ([]UnservedType, error) {
	conn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	qs, err := c.store.KnownQueues(ctx, conn)
	if err != nil {
		return nil, failed("list unserved types", err)
	}
	raw, err := c.store.Unserved(ctx, conn, qs)
	if err != nil {
		return nil, failed("list unserved types", err)
	}
	out := make([]UnservedType, len(raw))
	for i, u := range raw {
		out[i] = UnservedType{Queue: u.Queue, Type: u.Type, Since: fromMs(u.Since)}
	}
	return out, nil
}

// SetQueueLimits is Inspector.SetQueueLimits for one lane.
func (c *laneClient) SetQueueLimits(ctx context.Context, qc QueueConfig) error {
	if err := validateQueue(qc.Name); err != nil {
		return err
	}
	lim, err := qc.limits()
	if err != nil {
		return err
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := c.store.SetQueueLimits(ctx, conn, qc.Name, lim); err != nil {
		return failed("set the limits of queue "+qc.Name, err)
	}
	return nil
}
