package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"
)

// e2eCases measure no-op tasks per second from enqueue to acknowledgement:
// Consume runs with each handler count (and 1 dispatcher), then
// Sizes.E2EProducers goroutines Enqueue Sizes.E2EN tasks (due now) one per
// call; the clock runs from the first enqueue to the last handler call (the
// acknowledgement of the last task is not waited for). Every task must be
// delivered exactly once.
//
// Beside the rate: commands_per_task, the commands Redis executed from the
// first enqueue to the last handler call (INFO commandstats deltas, INFO
// left out) over the tasks, with the per-command figures in the detail
// (commands_per_task_by_command); n/a on a server without commandstats
// (before Redis 2.6). round_trips_per_task: the waits for replies the
// implementation's own connections counted over the same span, producers
// and workers together (RoundTripCounter; n/a otherwise). Tasks whose
// acknowledgement came after the last handler call are not counted, so
// these figures are a little low, by at most the tasks in flight.
func e2eCases(s Sizes) []*Case {
	var cs []*Case
	for _, hs := range s.Handlers {
		cs = append(cs, e2eCase(s, "e2e", hs, -1, needNothing))
	}
	return cs
}

// e2eLimitMaxRunning is the queue limit of the e2e-limit scenario: far
// above any handler count, so that it never binds.
const e2eLimitMaxRunning = 1_000_000

// e2eLimitCases measure what the engine's queue concurrency limit costs
// when it never binds: for each handler count, the e2e case without a
// limit and then with MaxRunning e2eLimitMaxRunning on the consumed
// queue (a claim of a limited queue takes its slots under WATCH, and the
// worker claims ahead only while the limit is far from binding). Both are
// in the scenario, so that the ratio is always of two figures of one run.
// The engine only.
func e2eLimitCases(s Sizes) []*Case {
	engineOnly := func(i Impl) string {
		if i.Name() != "engine" {
			return "the cost of the engine's queue limit"
		}
		return ""
	}
	var cs []*Case
	for _, hs := range s.Handlers {
		for _, lim := range []int{0, e2eLimitMaxRunning} {
			cs = append(cs, e2eCase(s, "e2e-limit", hs, lim, engineOnly))
		}
	}
	return cs
}

// redis24Env names the binary of a real Redis 2.4 redis-server, as for the
// main module's tests (internal/redistest.EnvBinary24).
const redis24Env = "REDIS24_SERVER"

// e2e24Cases are the engine's e2e cases, with e2e's handler counts, sizes
// and parameters, each measurement on a real Redis 2.4 of its own, started
// from the binary REDIS24_SERVER names (Case.RedisBin: persistence off,
// like the harness's own server), so that the page sets the engine's rate
// on 2.4 against its e2e rate of the same run. The engine only: the
// figure compares it with itself. On 2.4 there is no INFO commandstats,
// so commands_per_task is n/a. A server of another version is an error;
// the detail names the version. Without REDIS24_SERVER the cases do not
// apply, and say why.
func e2e24Cases(s Sizes) []*Case {
	bin := os.Getenv(redis24Env)
	needs := func(i Impl) string {
		switch {
		case i.Name() != "engine":
			return "the engine on Redis 2.4 against itself on the run's server"
		case bin == "":
			return redis24Env + " is not set: no Redis 2.4 to measure on (set it to the path of a Redis 2.4 redis-server)"
		}
		return ""
	}
	var cs []*Case
	for _, hs := range s.Handlers {
		c := e2eCase(s, "e2e24", hs, -1, needs)
		c.RedisBin = bin
		run := c.Run
		c.Run = func(ctx context.Context, m *Measure) (map[string]float64, error) {
			info, err := m.Admin.Info("server")
			if err != nil {
				return nil, err
			}
			v := info["redis_version"]
			if !strings.HasPrefix(v, "2.4.") {
				return nil, fmt.Errorf("%s=%s is Redis %s, not 2.4", redis24Env, bin, v)
			}
			m.Detail("redis_version", v)
			return run(ctx, m)
		}
		cs = append(cs, c)
	}
	return cs
}

// e2eCase is one e2e case of scenario with hs handlers; limit is the
// queue's MaxRunning (0: none, named in the title and params; -1: the
// plain e2e case, which names no limit).
func e2eCase(s Sizes, scenario string, hs, limit int, needs func(Impl) string) *Case {
	n, p := s.E2EN, s.E2EProducers
	title := fmt.Sprintf("no-op, handlers=%d, producers=%d, n=%d", hs, p, n)
	params := map[string]any{"handlers": hs, "producers": p, "n": n, "payload_bytes": s.Payload}
	switch {
	case limit == 0:
		title += ", no queue limit"
		params["max_running"] = 0
	case limit > 0:
		title += fmt.Sprintf(", queue limit %d", limit)
		params["max_running"] = limit
	}
	cc := ConsumeConfig{Workers: hs, Dispatchers: 1, MaxRunning: max(limit, 0)}
	return &Case{
		Scenario: scenario,
		Title:    title,
		Params:   params,
		Metrics: append([]MetricDef{
			{Key: "rate", Unit: "tasks/s"},
			{Key: "commands_per_task", Unit: "cmds/task"},
			{Key: "round_trips_per_task", Unit: "trips/task"},
		}, cpuMetrics...),
		Needs: needs,
		Run: func(ctx context.Context, m *Measure) (map[string]float64, error) {
			return runE2E(ctx, m, n, p, cc)
		},
	}
}

// runE2E performs one e2e measurement, consuming with cc.
func runE2E(ctx context.Context, m *Measure, n, producers int, cc ConsumeConfig) (map[string]float64, error) {
	ts := m.H.makeTasks(n, nil)
	tr := newTracker(n)
	stop, err := m.Impl.Consume(ctx, cc, tr.handle)
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	cmdA, cerr := m.Admin.CommandCalls()
	if cerr != nil && !errors.Is(cerr, errNoCommandStats) {
		_ = stop()
		return nil, cerr
	}
	rtc, counts := m.Impl.(RoundTripCounter)
	var rtA int64
	if counts {
		rtA = rtc.RoundTrips()
	}
	cpu := startCPU(m)
	t0 := time.Now()
	err = parallel(ctx, n, producers, func(i int) error { return m.Impl.Enqueue(ctx, ts[i]) })
	if err == nil {
		err = tr.wait(ctx, 30*time.Second, time.Time{})
	}
	el := time.Since(t0)
	out := map[string]float64{"rate": float64(n) / el.Seconds()}
	cpu.add(out, n)
	if counts {
		out["round_trips_per_task"] = float64(rtc.RoundTrips()-rtA) / float64(n)
	}
	if err == nil && cerr == nil {
		cmdB, berr := m.Admin.CommandCalls()
		if berr != nil {
			err = berr
		} else {
			total, per := perTask(cmdA, cmdB, n)
			out["commands_per_task"] = total
			m.Detail("commands_per_task_by_command", per)
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
	return out, nil
}

// perTask turns two INFO commandstats readings into commands per task:
// the total and, per command, the figure rounded to 3 decimals (commands
// below 0.001 per task left out). INFO itself is left out.
func perTask(a, b map[string]int64, n int) (float64, map[string]float64) {
	per := map[string]float64{}
	var total int64
	for name, cb := range b {
		if name == "info" {
			continue
		}
		d := cb - a[name]
		if d <= 0 {
			continue
		}
		total += d
		if v := math.Round(float64(d)/float64(n)*1000) / 1000; v > 0 {
			per[name] = v
		}
	}
	return float64(total) / float64(n), per
}
