package main

import (
	"context"
	"fmt"
	"time"
)

// e2eCases measure no-op tasks per second from enqueue to acknowledgement:
// Consume runs with each handler count (and 1 dispatcher), then
// Sizes.E2EProducers goroutines Enqueue Sizes.E2EN tasks (due now) one per
// call; the clock runs from the first enqueue to the last handler call (the
// acknowledgement of the last task is not waited for). Every task must be
// delivered exactly once.
func e2eCases(s Sizes) []*Case {
	var cs []*Case
	for _, hs := range s.Handlers {
		n, p := s.E2EN, s.E2EProducers
		cs = append(cs, &Case{
			Scenario: "e2e",
			Title:    fmt.Sprintf("no-op, handlers=%d, producers=%d, n=%d", hs, p, n),
			Params:   map[string]any{"handlers": hs, "producers": p, "n": n, "payload_bytes": s.Payload},
			Metrics:  []MetricDef{{Key: "rate", Unit: "tasks/s"}},
			Needs:    needNothing,
			Run: func(ctx context.Context, m *Measure) (map[string]float64, error) {
				return runE2E(ctx, m, n, p, hs)
			},
		})
	}
	return cs
}

// runE2E performs one e2e measurement.
func runE2E(ctx context.Context, m *Measure, n, producers, handlers int) (map[string]float64, error) {
	ts := m.H.makeTasks(n, nil)
	tr := newTracker(n)
	stop, err := m.Impl.Consume(ctx, ConsumeConfig{Workers: handlers, Dispatchers: 1}, tr.handle)
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	t0 := time.Now()
	err = parallel(ctx, n, producers, func(i int) error { return m.Impl.Enqueue(ctx, ts[i]) })
	if err == nil {
		err = tr.wait(ctx, 30*time.Second, time.Time{})
	}
	el := time.Since(t0)
	if serr := stop(); serr != nil && err == nil {
		err = fmt.Errorf("consumer: %w", serr)
	}
	if err != nil {
		return nil, err
	}
	if err := tr.check(); err != nil {
		return nil, err
	}
	return map[string]float64{"rate": float64(n) / el.Seconds()}, nil
}
