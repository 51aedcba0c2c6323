package engine

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
)

// requeuer returns running tasks of this worker to the front of their
// queues: a hung run's task when its lease ends, the unfinished ones at
// the shutdown deadline.
type requeuer struct {
	store store
	lane  func() *lane
	// observe tells the Observer what was returned.
	observe func(buckets.RequeueResult, buckets.Reason)
	log     *slog.Logger
}

// requeue returns ids, retrying a few times on a tested connection; past
// that it leaves them to a reaper (they stay in the pending set) and
// returns the error.
func (q *requeuer) requeue(ids []string, why buckets.Reason) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l := q.lane()
	defer l.close()
	var bo rconn.Backoff
	for {
		res, err := q.store.Requeue(ctx, l, ids, why)
		if err == nil {
			q.observe(res, why)
			return nil
		}
		if bo.Fails() >= cleanupTries-1 || !bo.Wait(ctx, q.log, "return tasks", err) {
			q.log.Error("could not return tasks; a reaper will recover them", "tasks", len(ids), keyErr, err)
			return fmt.Errorf("engine: worker: return %d tasks (%s): %w", len(ids), why, err)
		}
	}
}
