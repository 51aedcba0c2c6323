package enginetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/enginehook"
)

// ErrMaxRuns is Drain's error when tasks are still waiting after it took
// Env.MaxRuns of them.
var ErrMaxRuns = errors.New("enginetest: Drain took MaxRuns tasks and more are waiting")

// defaultMaxRuns bounds a Drain when Env.MaxRuns is 0.
const defaultMaxRuns = 10000

// DrainResult is what a Drain ran.
type DrainResult struct {
	// Runs are the recorded results of the runs, in order: the
	// EventFinished events, each with the task, its attempt, the state
	// the run left it in and the handler's error.
	Runs []engine.Event
	// States counts the tasks that ran by the state their last run left
	// them in.
	States map[engine.State]int
}

// Drain runs the waiting tasks' handlers with h, one at a time on the
// caller's goroutine, until no task is ready, scheduled, retrying or
// running. Each step is the engine's own: a dispatcher round makes due
// tasks ready, a worker takes one, runs h and records the result (retry,
// snooze, a chain's next step, a group's callback, a reply) in the
// engine's transactions. When nothing is ready it moves the Env's clock
// to the next due time instead of waiting. It takes from the queues of
// Config.Queues in their order, then from the other queues by name; a
// paused queue's ready tasks stay. The worker takes every type: one h
// has no handler for fails, as a Mux says (engine.ErrNoHandler). Keyed
// tasks (engine.Key) are taken round-robin by key, as a Server takes
// them; the queues' flow-control limits (QueueConfig's MaxRunning, Rate,
// KeyMaxRunning, KeyRate) are not written and not applied: one task runs
// at a time, and the clock moves only to due times, so rates are tested
// against a Server.
//
// It takes Env.MaxRuns tasks at most, then returns an error matching
// ErrMaxRuns if more are waiting. ctx bounds every round trip and the
// handlers' contexts. The result holds what ran, also with an error.
func (e *Env) Drain(ctx context.Context, h engine.Handler) (*DrainResult, error) {
	if h == nil {
		return nil, fmt.Errorf("enginetest: Drain: nil handler: %w", engine.ErrInvalid)
	}
	rec := &recorder{}
	err := e.drain(ctx, h, rec)
	res := &DrainResult{Runs: rec.runs, States: map[engine.State]int{}}
	last := map[string]engine.State{}
	for _, ev := range rec.runs {
		last[ev.TaskID] = ev.State
	}
	for _, st := range last {
		res.States[st]++
	}
	return res, err
}

func (e *Env) drain(ctx context.Context, h engine.Handler, rec *recorder) error {
	limit := e.MaxRuns
	if limit <= 0 {
		limit = defaultMaxRuns
	}
	taken := 0
	var served []string
	for {
		// A queue first enqueued to by a run (a chain step's, a reply's)
		// is served by the next stepper.
		queues, err := e.queueNames(ctx)
		if err != nil {
			return err
		}
		if served != nil && len(queues) == len(served) {
			return nil
		}
		served = queues
		cfg := e.cfg
		cfg.Queues = make([]engine.QueueConfig, len(queues))
		for i, q := range queues {
			cfg.Queues[i] = engine.QueueConfig{Name: q, Weight: 1}
		}
		cfg.StrictPriority = true
		cfg.Observer = rec.tee(e.cfg.Observer)
		st, err := enginehook.NewStepper(ctx, e.pool, cfg, h)
		if err != nil {
			return fmt.Errorf("enginetest: Drain: %w", err)
		}
		err = e.steps(ctx, st, &taken, limit)
		if cerr := st.Close(ctx); cerr != nil && err == nil {
			err = fmt.Errorf("enginetest: Drain: %w", cerr)
		}
		if err != nil {
			return err
		}
	}
}

// steps steps st until nothing is ready or scheduled, moving the clock to
// each next due time.
func (e *Env) steps(ctx context.Context, st enginehook.Stepper, taken *int, limit int) error {
	for {
		if *taken >= limit {
			n, err := e.waiting(ctx)
			if err != nil {
				return err
			}
			if n == 0 {
				return nil
			}
			return fmt.Errorf("enginetest: Drain: %d tasks still waiting after %d were taken: %w", n, limit, ErrMaxRuns)
		}
		took, next, err := st.Step(ctx)
		if err != nil {
			return fmt.Errorf("enginetest: Drain: %w", err)
		}
		switch {
		case took:
			*taken++
		case next.IsZero():
			return nil
		case !next.After(e.clock.Now()):
			return fmt.Errorf("enginetest: Drain: a bucket due at %v was not moved at %v", next, e.clock.Now())
		default:
			e.clock.Advance(next.Sub(e.clock.Now()))
		}
	}
}

// queueNames lists the queues of the Config in order, then every other
// queue ever enqueued to, by name.
func (e *Env) queueNames(ctx context.Context) ([]string, error) {
	var names []string
	for _, q := range e.cfg.Queues {
		names = append(names, q.Name)
	}
	if len(names) == 0 {
		def := e.cfg.DefaultQueue
		if def == "" {
			def = "default"
		}
		names = append(names, def)
	}
	qs, err := e.in.Queues(ctx)
	if err != nil {
		return nil, fmt.Errorf("enginetest: Drain: list the queues: %w", err)
	}
	for _, q := range qs {
		if !slices.Contains(names, q.Queue) {
			names = append(names, q.Queue)
		}
	}
	return names, nil
}

// waiting counts the tasks of queues that are not paused that wait or run.
func (e *Env) waiting(ctx context.Context) (int64, error) {
	qs, err := e.in.Queues(ctx)
	if err != nil {
		return 0, fmt.Errorf("enginetest: Drain: list the queues: %w", err)
	}
	var n int64
	for _, q := range qs {
		if !q.Paused {
			n += q.Ready + q.KeysWaiting + q.Scheduled + q.Retrying + q.Running
		}
	}
	return n, nil
}

// recorder keeps the EventFinished events of a Drain.
type recorder struct {
	mu   sync.Mutex
	runs []engine.Event
}

// tee returns an Observer that records and passes every event on to next.
func (r *recorder) tee(next engine.Observer) engine.Observer {
	return engine.ObserverFunc(func(ev engine.Event) {
		if ev.Kind == engine.EventFinished {
			r.mu.Lock()
			r.runs = append(r.runs, ev)
			r.mu.Unlock()
		}
		if next != nil {
			next.Observe(ev)
		}
	})
}
