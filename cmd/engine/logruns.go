package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/bucketq/bucketq/engine"
)

// logRuns is middleware that logs each run at debug, with task id, type,
// queue, attempt, duration and error (workers log every failure at warn
// or error themselves).
func logRuns(log *slog.Logger) engine.Middleware {
	return func(next engine.Handler) engine.Handler {
		return engine.HandlerFunc(func(ctx context.Context, t *engine.Task) error {
			start := time.Now()
			err := next.ProcessTask(ctx, t)
			attrs := []any{"task_id", t.ID, "type", t.Type, "queue", t.Queue, "attempt", t.Attempt,
				"duration", time.Since(start).Round(time.Microsecond)}
			if d, snoozed := engine.IsSnooze(err); snoozed {
				log.Debug("task snoozed", append(attrs, "in", d)...)
			} else if err == nil {
				log.Debug("task done", attrs...)
			} else {
				log.Debug("task failed", append(attrs, "err", err)...)
			}
			return err
		})
	}
}
