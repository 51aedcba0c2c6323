package main

import (
	"context"
	"fmt"
	"time"
)

// dispatchCases measure how fast due tasks are moved from the delayed store
// to the ready list(s), from a backlog in which every task is already due,
// for each backlog size and dispatcher count and two shapes:
//
//   - burst: every task due within the same second (5s ago);
//   - spread: due times spread evenly over the hour before now, so in a
//     design that groups tasks by due second most groups hold one task.
//
// Only the move is timed (see Dispatcher): seeding and starting the
// dispatchers come first; the clock starts before Release and stops when
// ReadyCount reaches the backlog, polled every 0.5ms (2ms after 100ms, 10ms
// after 2s, so the poll itself stays a negligible load). No worker runs.
func dispatchCases(s Sizes) []*Case {
	var cs []*Case
	for _, shape := range []string{"burst", "spread"} {
		for _, n := range s.Backlogs {
			for _, d := range s.Dispatchers {
				cs = append(cs, &Case{
					Scenario: "dispatch",
					Title:    fmt.Sprintf("%s, backlog=%d, dispatchers=%d", shape, n, d),
					Params: map[string]any{"shape": shape, "backlog": n, "dispatchers": d,
						"payload_bytes": s.Payload},
					Metrics: append([]MetricDef{{Key: "rate", Unit: "tasks/s"}}, cpuMetrics...),
					Needs:   needDispatcher,
					Timeout: 3*time.Minute + time.Duration(n/1000)*time.Second,
					Run: func(ctx context.Context, m *Measure) (map[string]float64, error) {
						return runDispatch(ctx, m, shape, n, d)
					},
				})
			}
		}
	}
	return cs
}

// dueShape returns the due-time function of a backlog of n tasks.
func dueShape(shape string, n int, now time.Time) func(int) time.Time {
	if shape == "burst" {
		base := now.Truncate(time.Second).Add(-5 * time.Second)
		return func(i int) time.Time { return base.Add(time.Duration(i%1000) * time.Millisecond) }
	}
	start := now.Add(-time.Hour)
	step := time.Hour / time.Duration(max(n, 1))
	return func(i int) time.Time { return start.Add(time.Duration(i) * step) }
}

// runDispatch performs one dispatch measurement.
func runDispatch(ctx context.Context, m *Measure, shape string, n, dispatchers int) (map[string]float64, error) {
	dp := m.Impl.(Dispatcher)
	ts := m.H.makeTasks(n, dueShape(shape, n, time.Now()))
	t := time.Now()
	if err := dp.SeedDue(ctx, ts); err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	m.Detail("seed_seconds", time.Since(t).Seconds())
	if since := time.Since(t); since > 5*time.Second {
		m.Progress("seeded %d tasks in %.1fs", n, since.Seconds())
	}
	stop, err := dp.StartDispatchers(ctx, dispatchers)
	if err != nil {
		return nil, fmt.Errorf("start dispatchers: %w", err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()
	cpu := startCPU(m)
	t0 := time.Now()
	if err := dp.Release(ctx); err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	lastReport := t0
	var last int64
	for {
		c, err := dp.ReadyCount(ctx)
		if err != nil {
			return nil, fmt.Errorf("ready count: %w", err)
		}
		if c >= int64(n) {
			break
		}
		el := time.Since(t0)
		if time.Since(lastReport) >= 10*time.Second {
			m.Progress("moved %d/%d after %.0fs", c, n, el.Seconds())
			if c == last {
				return nil, fmt.Errorf("no progress for 10s at %d/%d", c, n)
			}
			last, lastReport = c, time.Now()
		}
		iv := 500 * time.Microsecond
		if el > 2*time.Second {
			iv = 10 * time.Millisecond
		} else if el > 100*time.Millisecond {
			iv = 2 * time.Millisecond
		}
		if !sleepCtx(ctx, iv) {
			return nil, ctx.Err()
		}
	}
	el := time.Since(t0)
	out := map[string]float64{"rate": float64(n) / el.Seconds()}
	cpu.add(out, n)
	stopped = true
	if err := stop(); err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	return out, nil
}
