package engine

import (
	"fmt"

	"github.com/bucketq/bucketq/buckets"
)

// Priority sets the task's level within its queue, 1 to 4: a worker
// starts a queue's tasks of level 1 (the default) before any of level 2,
// and so on, each level first in, first out. Between queues the worker's
// order (Config.Queues, StrictPriority) is unchanged. A level is strict:
// while a queue's level 1 has tasks, its level 2 waits. 0 or above 4 is
// refused with ErrInvalid.
func Priority(n int) Option {
	return optionFunc(func(o *taskOptions) error {
		if n < 1 || n > buckets.MaxLevel {
			return fmt.Errorf("engine: Priority(%d): want 1 (first, the default) to %d: %w", n, buckets.MaxLevel, ErrInvalid)
		}
		o.priority = n
		return nil
	})
}

// levelOf is the record's Priority for level n: 0 for level 1, which a
// record leaves out.
func levelOf(n int) int {
	if n <= 1 {
		return 0
	}
	return n
}
