package main

import (
	"context"
	"fmt"
	"time"
)

// enqueueCases measures how fast producers can add tasks:
//
//   - single, due now: Impl.Enqueue, one task per call, with each producer count;
//   - single, delayed: Scheduler.Schedule with due times spread over the hour
//     that starts an hour from now (3600 distinct seconds);
//   - batch, due now / delayed: Batcher.EnqueueBatch / BatchScheduler.ScheduleBatch
//     with Sizes.Batch tasks per call, with each producer count.
//
// Every measurement adds Sizes.EnqueueN tasks with Sizes.Payload-byte
// payloads to an empty namespace; tasks/s = EnqueueN / wall time from the
// first call to the last reply.
func enqueueCases(s Sizes) []*Case {
	rate := append([]MetricDef{{Key: "rate", Unit: "tasks/s"}}, cpuMetrics...)
	type kind struct {
		name    string
		batch   int
		delayed bool
		need    func(Impl) string
	}
	kinds := []kind{
		{"single, due now", 1, false, needNothing},
		{"single, delayed", 1, true, needScheduler},
		{fmt.Sprintf("batch of %d, due now", s.Batch), s.Batch, false, needBatcher},
		{fmt.Sprintf("batch of %d, delayed", s.Batch), s.Batch, true, needBatchScheduler},
	}
	var cs []*Case
	for _, k := range kinds {
		for _, p := range s.Producers {
			n := s.EnqueueN
			cs = append(cs, &Case{
				Scenario: "enqueue",
				Title:    fmt.Sprintf("%s, producers=%d, n=%d", k.name, p, n),
				Params: map[string]any{"batch": k.batch, "delayed": k.delayed, "producers": p, "n": n,
					"payload_bytes": s.Payload},
				Metrics: rate,
				Needs:   k.need,
				Run: func(ctx context.Context, m *Measure) (map[string]float64, error) {
					return runEnqueue(ctx, m, n, p, k.batch, k.delayed)
				},
			})
		}
	}
	return cs
}

// runEnqueue performs one enqueue measurement.
func runEnqueue(ctx context.Context, m *Measure, n, producers, batch int, delayed bool) (map[string]float64, error) {
	var due func(int) time.Time
	if delayed {
		base := time.Now().Add(time.Hour).Truncate(time.Second)
		due = func(i int) time.Time { return base.Add(time.Duration(i%3600) * time.Second) }
	}
	ts := m.H.makeTasks(n, due)
	calls := (n + batch - 1) / batch
	call := func(i int) error {
		chunk := ts[i*batch : min((i+1)*batch, n)]
		switch {
		case batch == 1 && !delayed:
			return m.Impl.Enqueue(ctx, chunk[0])
		case batch == 1:
			return m.Impl.(Scheduler).Schedule(ctx, chunk[0])
		case !delayed:
			return m.Impl.(Batcher).EnqueueBatch(ctx, chunk)
		default:
			return m.Impl.(BatchScheduler).ScheduleBatch(ctx, chunk)
		}
	}
	cpu := startCPU(m)
	t0 := time.Now()
	if err := parallel(ctx, calls, producers, call); err != nil {
		return nil, err
	}
	el := time.Since(t0)
	out := map[string]float64{"rate": float64(n) / el.Seconds()}
	cpu.add(out, n)
	return out, nil
}
