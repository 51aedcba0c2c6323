package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/bucketq/bucketq/buckets"
)

// requeuer returns running tasks of this worker to the front of their
// queues: a hung run's task when its lease ends, the unfinished ones at
// the shutdown deadline.
type requeuer struct {
	w *worker
}

// requeue returns ids, retrying a few times on a tested connection; past
// that it leaves them to a reaper (they stay in the pending set) and
// returns the error.
func (q *requeuer) requeue(ids []string, why buckets.Reason) error {
	w := q.w
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l := w.lane()
	defer l.close()
	bo := w.backoff()
	for {
		res, err := w.store.Requeue(ctx, l, ids, why)
		if err == nil {
			w.cfg.observeRecovered(res, why)
			return nil
		}
		if bo.Fails() >= cleanupTries-1 || !bo.Wait(ctx, w.log, "return tasks", err) {
			w.log.Error("could not return tasks; a reaper will recover them", "tasks", len(ids), keyErr, err)
			return fmt.Errorf("engine: worker: return %d tasks (%s): %w", len(ids), why, err)
		}
	}
}
