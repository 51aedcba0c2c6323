package main

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"
)

// tracker counts deliveries of tasks "0".."n-1": first deliveries, repeated
// ones and unknown IDs, and closes done when every task was delivered.
type tracker struct {
	n       int
	seen    []atomic.Bool
	count   atomic.Int64
	dups    atomic.Int64
	unknown atomic.Int64
	done    chan struct{}
	// onFirst, if set, is called with the task index and the handler's start
	// time on each first delivery.
	onFirst func(i int, start time.Time)
}

func newTracker(n int) *tracker {
	return &tracker{n: n, seen: make([]atomic.Bool, n), done: make(chan struct{})}
}

// handle is the Handler given to implementations.
func (t *tracker) handle(_ context.Context, d Delivery) error {
	start := time.Now()
	i, err := strconv.Atoi(d.ID)
	if err != nil || i < 0 || i >= t.n {
		t.unknown.Add(1)
		return nil
	}
	if !t.seen[i].CompareAndSwap(false, true) {
		t.dups.Add(1)
		return nil
	}
	if t.onFirst != nil {
		t.onFirst(i, start)
	}
	if t.count.Add(1) == int64(t.n) {
		close(t.done)
	}
	return nil
}

// wait blocks until every task was delivered, ctx is done, no delivery
// happened for stall, or the deadline (if not zero) passed.
func (t *tracker) wait(ctx context.Context, stall time.Duration, deadline time.Time) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last, lastAt := t.count.Load(), time.Now()
	for {
		select {
		case <-t.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case now := <-tick.C:
			c := t.count.Load()
			if c != last {
				last, lastAt = c, now
			}
			if now.Sub(lastAt) > stall {
				return fmt.Errorf("stalled: %d/%d delivered, none in the last %s", c, t.n, stall)
			}
			if !deadline.IsZero() && now.After(deadline) {
				return fmt.Errorf("deadline: %d/%d delivered", c, t.n)
			}
		}
	}
}

// check returns an error if a task was delivered twice or an unknown ID came.
func (t *tracker) check() error {
	if d, u := t.dups.Load(), t.unknown.Load(); d != 0 || u != 0 {
		return fmt.Errorf("%d duplicate and %d unknown deliveries", d, u)
	}
	return nil
}
