package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// keyedEnqueuer is implemented by designs whose tasks carry a fairness
// key, the tasks of a queue being taken round-robin by key.
type keyedEnqueuer interface {
	// EnqueueKeyed adds tasks due now, each with key key, in one call.
	EnqueueKeyed(ctx context.Context, ts []Task, key string) error
}

// fairChunk is how many of the tasks ahead go into one batch call.
const fairChunk = 1000

// fairCases measure the wait of one small task behind a flood on one
// queue: Sizes.FairN tasks are enqueued (in batches of fairChunk), then
// one more, the small one; only then does Consume start, with
// Sizes.FairHandlers handlers that do nothing. Reported: wait, from just
// before the small task's enqueue to its handler's start; ahead, the tasks
// whose handlers started before it; and rate, every task over the time
// from Consume to the last handler call. Two cases, the engine only: the
// flood with key "flood" and the small task with key "small" (keyed
// tasks are taken round-robin by key), and the same without keys (first
// in, first out), for contrast.
func fairCases(s Sizes) []*Case {
	var cs []*Case
	for _, keyed := range []bool{false, true} {
		n, hs := s.FairN, s.FairHandlers
		title := fmt.Sprintf("1 task behind %d, %d handlers, no keys", n, hs)
		needs := func(i Impl) string {
			if i.Name() != "engine" {
				return "the engine's fairness keys"
			}
			return needBatcher(i)
		}
		if keyed {
			title = fmt.Sprintf("1 task (key small) behind %d (key flood), %d handlers", n, hs)
			needs = func(i Impl) string {
				if i.Name() != "engine" {
					return "the engine's fairness keys"
				}
				if _, ok := i.(keyedEnqueuer); !ok {
					return "no fairness keys"
				}
				return ""
			}
		}
		cs = append(cs, &Case{
			Scenario: "fair",
			Title:    title,
			Params:   map[string]any{"n": n, "handlers": hs, "keys": keyed, "payload_bytes": s.Payload},
			Metrics: []MetricDef{
				{Key: "wait", Unit: "ms"},
				{Key: "ahead", Unit: "tasks"},
				{Key: "rate", Unit: "tasks/s"},
			},
			Needs: needs,
			Run: func(ctx context.Context, m *Measure) (map[string]float64, error) {
				return runFair(ctx, m, n, hs, keyed)
			},
		})
	}
	return cs
}

// runFair performs one fair measurement.
func runFair(ctx context.Context, m *Measure, n, handlers int, keyed bool) (map[string]float64, error) {
	ts := m.H.makeTasks(n+1, nil)
	flood, small := ts[:n], ts[n]
	enqueue := func(ts []Task, key string) error {
		if keyed {
			return m.Impl.(keyedEnqueuer).EnqueueKeyed(ctx, ts, key)
		}
		if len(ts) == 1 {
			return m.Impl.Enqueue(ctx, ts[0])
		}
		return m.Impl.(Batcher).EnqueueBatch(ctx, ts)
	}
	for i := 0; i < n; i += fairChunk {
		if err := enqueue(flood[i:min(i+fairChunk, n)], "flood"); err != nil {
			return nil, fmt.Errorf("enqueue the flood: %w", err)
		}
	}
	tr := newTracker(n + 1)
	var started atomic.Int64
	var smallAt time.Time
	ahead := int64(-1)
	tr.onFirst = func(i int, at time.Time) {
		k := started.Add(1)
		if i == n {
			smallAt, ahead = at, k-1 // read after tr.done closes
		}
	}
	t0 := time.Now()
	if err := enqueue([]Task{small}, "small"); err != nil {
		return nil, fmt.Errorf("enqueue the small task: %w", err)
	}
	c0 := time.Now()
	stop, err := m.Impl.Consume(ctx, ConsumeConfig{Workers: handlers, Dispatchers: 1}, tr.handle)
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	err = tr.wait(ctx, 30*time.Second, time.Time{})
	el := time.Since(c0)
	if serr := stop(); serr != nil && err == nil {
		err = fmt.Errorf("consumer: %w", serr)
	}
	if err != nil {
		return nil, err
	}
	if err := tr.check(); err != nil {
		return nil, err
	}
	if ahead < 0 {
		return nil, errors.New("the small task's start was not seen")
	}
	m.Progress("small task started after %d of the %d ahead", ahead, n)
	return map[string]float64{
		"wait":  float64(smallAt.Sub(t0)) / float64(time.Millisecond),
		"ahead": float64(ahead),
		"rate":  float64(n+1) / el.Seconds(),
	}, nil
}
