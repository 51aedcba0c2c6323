package engine

import (
	"context"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
)

// waiter blocks, while the worker has a free slot and every queue is
// empty, in BLPOP on the queues' wake-up lists, on a connection of its
// own, until a producer pushes a token or IdleWait passes.
type waiter struct {
	w       *Worker
	keys    []string
	blocker rconn.Blocker
	bo      rconn.Backoff
}

// wait returns when a token arrived, IdleWait passed, or after a failure
// (with backoff); false when ctx ended.
func (wt *waiter) wait(ctx context.Context) bool {
	w := wt.w
	_, err := wt.blocker.Pop(ctx, wt.keys, w.cfg.IdleWait)
	if err == nil {
		wt.bo.Reset()
		return true
	}
	if ctx.Err() != nil {
		return false
	}
	if buckets.IsServerError(err) {
		// A wake-up list of the wrong type: set it aside, and look at
		// the queues meanwhile.
		setAside(ctx, w.pool, w.store, w.keys, w.log, "list", wt.keys...)
	}
	// A failed wait must not become a poll: back off.
	return wt.bo.Wait(ctx, w.log, "worker wake-up wait", err)
}

func (wt *waiter) close() { wt.blocker.Close() }
