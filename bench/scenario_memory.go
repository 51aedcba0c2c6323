package main

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// memoryCases measure Redis memory per scheduled task: Sizes.MemoryN tasks
// with Sizes.Payload-byte payloads are scheduled (8 producers, Schedule one
// by one, no consumer running) an hour ahead, either all within one second
// (burst) or spread evenly over an hour (spread). Reported:
// (used_memory after − used_memory before) / N, and that minus the payload
// size ("overhead"). "Before" is read after FLUSHALL (own server) and after
// 64 warm-up tasks were scheduled through the same producers, so connection
// buffers are already counted. The harness's task ID (≤7 digits) travels
// with each task and is part of the overhead.
func memoryCases(s Sizes) []*Case {
	var cs []*Case
	for _, shape := range []string{"burst", "spread"} {
		n := s.MemoryN
		cs = append(cs, &Case{
			Scenario: "memory",
			Title:    fmt.Sprintf("%s, n=%d scheduled, payload=%dB", shape, n, s.Payload),
			Params:   map[string]any{"shape": shape, "n": n, "payload_bytes": s.Payload},
			Metrics:  []MetricDef{{Key: "overhead", Unit: "B/task"}, {Key: "total", Unit: "B/task"}},
			Needs:    needScheduler,
			Timeout:  5*time.Minute + time.Duration(n/1000)*time.Second,
			Run: func(ctx context.Context, m *Measure) (map[string]float64, error) {
				return runMemory(ctx, m, shape, n)
			},
		})
	}
	return cs
}

// runMemory performs one memory measurement.
func runMemory(ctx context.Context, m *Measure, shape string, n int) (map[string]float64, error) {
	sch := m.Impl.(Scheduler)
	base := time.Now().Add(time.Hour).Truncate(time.Second)
	due := func(i int) time.Time { return base.Add(time.Duration(i%1000) * time.Millisecond) }
	if shape == "spread" {
		step := time.Hour / time.Duration(max(n, 1))
		due = func(i int) time.Time { return base.Add(time.Duration(i) * step) }
	}
	ts := m.H.makeTasks(n, due)
	warm := m.H.makeTasks(64, func(int) time.Time { return base })
	for i := range warm {
		warm[i].ID = strconv.Itoa(n + i)
	}
	if err := parallel(ctx, len(warm), 8, func(i int) error { return sch.Schedule(ctx, warm[i]) }); err != nil {
		return nil, err
	}
	before, err := m.H.Admin.InfoInt("memory", "used_memory")
	if err != nil {
		return nil, err
	}
	if err := parallel(ctx, n, 8, func(i int) error { return sch.Schedule(ctx, ts[i]) }); err != nil {
		return nil, err
	}
	after, err := m.H.Admin.InfoInt("memory", "used_memory")
	if err != nil {
		return nil, err
	}
	m.Detail("used_memory_before", before)
	m.Detail("used_memory_after", after)
	per := float64(after-before) / float64(n)
	return map[string]float64{"total": per, "overhead": per - float64(m.H.Sizes.Payload)}, nil
}
