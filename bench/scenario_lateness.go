package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync/atomic"
	"time"
)

// latenessCases measure how late (or early) delayed tasks start: Consume runs
// with Sizes.LatenessWorkers handlers and 1 dispatcher; Sizes.LatenessProducers
// goroutines (defaultLatenessProducers) Schedule
// tasks at a steady rate per second (one case per Sizes.LatenessRates) for Sizes.LatenessDuration,
// each due at (time of its Schedule call) + a delay uniform in
// [0, Sizes.LatenessMaxDelay] (seeded, so every implementation gets the same
// delays). Lateness = handler start − due time, both read from this
// process's clock. Reported: p50, p99, max and min lateness, the share of
// tasks started before their due time (should be 0), and tasks not delivered
// within max delay + 30s after the last Schedule.
//
// One more case, for the engine only, runs the highest rate with
// latenessDiagFactor times the handlers (Params "diagnostic"): it tells the
// wait for a free handler slot from the dispatcher's lateness, for the
// page's account of a missed target. It is no target of its own.
func latenessCases(s Sizes) []*Case {
	var cs []*Case
	for _, rate := range s.LatenessRates {
		cs = append(cs, latenessCase(s, rate, s.LatenessWorkers, needScheduler, ""))
	}
	if len(s.LatenessRates) > 0 {
		top := slices.Max(s.LatenessRates)
		engineOnly := func(i Impl) string {
			if i.Name() != "engine" {
				return "a diagnostic of the engine's lateness"
			}
			return needScheduler(i)
		}
		cs = append(cs, latenessCase(s, top, latenessDiagFactor*s.LatenessWorkers, engineOnly, latenessDiagLabel))
	}
	return cs
}

// defaultLatenessProducers is how many goroutines schedule the lateness
// cases unless -lateness-producers says otherwise; results from before the
// cases named it ran with this many.
const defaultLatenessProducers = 4

// latenessDiagFactor is how many times the handlers the diagnostic
// lateness case runs.
const latenessDiagFactor = 4

// latenessDiagLabel is the diagnostic case's "diagnostic" parameter, by
// which the page finds it.
var latenessDiagLabel = fmt.Sprintf("%d× the handlers", latenessDiagFactor)

// latenessCase is one lateness case: rate tasks/s, workers handlers; diag
// names a diagnostic case ("" for a target's).
func latenessCase(s Sizes, rate, workers int, needs func(Impl) string, diag string) *Case {
	n := int(float64(rate) * s.LatenessDuration.Seconds())
	producers := max(s.LatenessProducers, 1)
	title := fmt.Sprintf("%d/s for %s (n=%d), delay 0–%s, 1 dispatcher + %d workers",
		rate, s.LatenessDuration, n, s.LatenessMaxDelay, workers)
	if producers != defaultLatenessProducers {
		title += fmt.Sprintf(", %d producers", producers)
	}
	params := map[string]any{"rate": rate, "seconds": s.LatenessDuration.Seconds(), "n": n,
		"max_delay_seconds": s.LatenessMaxDelay.Seconds(), "workers": workers, "dispatchers": 1,
		"payload_bytes": s.Payload, "producers": producers}
	if diag != "" {
		title += " (diagnostic: " + diag + ")"
		params["diagnostic"] = diag
	}
	return &Case{
		Scenario: "lateness",
		Title:    title,
		Params:   params,
		Metrics: []MetricDef{
			{Key: "p50", Unit: "ms"}, {Key: "p99", Unit: "ms"}, {Key: "max", Unit: "ms"}, {Key: "min", Unit: "ms"},
			{Key: "early", Unit: "%"}, {Key: "lost", Unit: "tasks"},
		},
		Needs:   needs,
		Timeout: s.LatenessDuration + s.LatenessMaxDelay + 3*time.Minute,
		Run: func(ctx context.Context, m *Measure) (map[string]float64, error) {
			return runLateness(ctx, m, n, rate, s.LatenessMaxDelay, workers, producers)
		},
	}
}

// runLateness performs one lateness measurement.
func runLateness(ctx context.Context, m *Measure, n, rate int, maxDelay time.Duration, workers, producers int) (map[string]float64, error) {
	sch := m.Impl.(Scheduler)
	rng := rand.New(rand.NewPCG(1, 2))
	delays := make([]time.Duration, n)
	for i := range delays {
		delays[i] = time.Duration(rng.Int64N(int64(maxDelay) + 1))
	}
	ts := m.H.makeTasks(n, nil)
	dues := make([]atomic.Int64, n)
	lats := make([]int64, n) // written once per index by onFirst, read after stop
	tr := newTracker(n)
	tr.onFirst = func(i int, start time.Time) { lats[i] = start.UnixNano() - dues[i].Load() }
	stop, err := m.Impl.Consume(ctx, ConsumeConfig{Workers: workers, Dispatchers: 1}, tr.handle)
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	interval := time.Second / time.Duration(rate)
	start := time.Now().Add(50 * time.Millisecond)
	err = parallel(ctx, n, producers, func(i int) error {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		t := ts[i]
		t.Due = time.Now().Add(delays[i])
		dues[i].Store(t.Due.UnixNano())
		return sch.Schedule(ctx, t)
	})
	produced := time.Since(start)
	m.Detail("schedule_seconds", produced.Seconds())
	if err == nil {
		if werr := tr.wait(ctx, maxDelay+30*time.Second, time.Now().Add(maxDelay+30*time.Second)); werr != nil {
			m.Progress("%v", werr)
		}
	}
	if serr := stop(); serr != nil && err == nil {
		err = fmt.Errorf("consumer: %w", serr)
	}
	if err != nil {
		return nil, err
	}
	if err := tr.check(); err != nil {
		return nil, err
	}
	var got []int64
	for i := range n {
		if tr.seen[i].Load() {
			got = append(got, lats[i])
		}
	}
	if len(got) == 0 {
		return nil, fmt.Errorf("no task delivered")
	}
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	early := 0
	for _, l := range got {
		if l < 0 {
			early++
		}
	}
	ms := func(ns int64) float64 { return float64(ns) / 1e6 }
	q := func(p float64) float64 { return ms(got[int(p*float64(len(got)-1))]) }
	return map[string]float64{
		"p50":   q(0.50),
		"p99":   q(0.99),
		"max":   ms(got[len(got)-1]),
		"min":   ms(got[0]),
		"early": 100 * float64(early) / float64(len(got)),
		"lost":  float64(n - len(got)),
	}, nil
}
