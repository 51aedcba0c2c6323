package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
	"github.com/bucketq/bucketq/internal/enginehook"
	"github.com/gomodule/redigo/redis"
)

// A dispatcher and a worker stepped on the caller's goroutine, for
// package enginetest's Drain (internal/enginehook).
func init() {
	enginehook.NewStepper = func(ctx context.Context, pool *redis.Pool, cfg, h any) (enginehook.Stepper, error) {
		c, hd, err := hookArgs(cfg, h)
		if err != nil {
			return nil, err
		}
		if hd == nil {
			return nil, fmt.Errorf("engine: stepper: nil handler: %w", ErrInvalid)
		}
		return newStepper(ctx, pool, c, hd)
	}
	enginehook.UniqueKey = func(ctx context.Context, pool *redis.Pool, cfg any, id string) (string, error) {
		c, _, err := hookArgs(cfg, nil)
		if err != nil {
			return "", err
		}
		return uniqueKeyOf(ctx, pool, c, id)
	}
}

// stepper is a dispatcher and a worker run one step at a time on the
// caller's goroutine, on the Config's clock. A step is the parts a Server
// runs, called in turn: the dispatcher's round, the fetcher's pop and
// claim, the runner and the finisher.
type stepper struct {
	d     *dispatcher
	w     *worker
	lanes []*rconn.Holder // the dispatcher's connections
	l     *lane           // the worker's
	// stop is an ended context: given to the finisher as the fetching
	// context, so that a result takes no next task with it.
	stop context.Context
}

// maxStepRounds bounds the dispatcher rounds of one step while more is
// due at once.
const maxStepRounds = 10000

func newStepper(ctx context.Context, pool *redis.Pool, cfg Config, h Handler) (*stepper, error) {
	// No listTypes: the worker takes every type, and the handler's
	// answer for a type it lacks (a Mux's ErrNoHandler) is a failure.
	w, err := newWorker(pool, cfg, h)
	if err != nil {
		return nil, err
	}
	d, err := newDispatcher(pool, cfg)
	if err != nil {
		return nil, err
	}
	if err := w.hb.beat(ctx); err != nil {
		return nil, fmt.Errorf("engine: stepper: register the worker: %w", err)
	}
	if err := w.control.reread(ctx); err != nil {
		_ = w.unregister()
		return nil, fmt.Errorf("engine: stepper: read the paused queues: %w", err)
	}
	stop, cancel := context.WithCancel(context.Background())
	cancel()
	s := &stepper{d: d, w: w, lanes: make([]*rconn.Holder, d.cfg.Advanced.DispatchLanes), stop: stop}
	for i := range s.lanes {
		s.lanes[i] = &rconn.Holder{Pool: pool}
	}
	s.l = w.lane()
	return s, nil
}

// Step makes ready what is due by the clock's now (dispatcher rounds),
// then takes at most one ready task, runs its handler and records its
// result. It reports whether it took a task, and when the earliest
// scheduled task is due (zero: none), as read before taking.
func (s *stepper) Step(ctx context.Context) (bool, time.Time, error) {
	next, err := s.dispatch(ctx)
	if err != nil {
		return false, time.Time{}, err
	}
	w := s.w
	if w.inflight.dirty.Load() {
		// A claim gave an id back: return it to its queue, as the
		// worker's recoverer does.
		if err := w.recoverer.once(ctx, s.l); err != nil {
			return false, next, fmt.Errorf("engine: step: in-flight list: %w", err)
		}
	}
	var q string
	ids, err := w.inflight.popMany(func() ([]string, bool, error) {
		var ids []string
		var err error
		ids, q, err = w.fetcher.popAny(ctx, 1)
		return ids, err != nil && !buckets.IsServerError(err), err
	})
	if err != nil && len(ids) == 0 {
		return false, next, fmt.Errorf("engine: step: pop: %w", err)
	}
	if len(ids) == 0 {
		return false, next, nil
	}
	rec, held, waited := w.fetcher.claim(ctx, s.l, q, ids[0], nil, true)
	if rec == nil {
		return true, next, nil // not claimed; the claim put it where it belongs
	}
	w.observeStart(rec)
	var result []byte
	herr, ok := w.runs.run(ctx, rec, &result)
	if !ok {
		// Given back (its lease ran out): the connection may still hold
		// the claim's watch.
		s.l.close()
		return true, next, nil
	}
	w.finisher.finish(s.stop, ctx, claimed{rec: rec, l: s.l, held: held, waited: waited}, herr, result)
	w.progress.flush(ctx) // no writer goroutine here: the run's last report now
	return true, next, nil
}

// dispatch runs dispatcher rounds until nothing more is due now and
// returns when the earliest bucket is due (zero: none).
func (s *stepper) dispatch(ctx context.Context) (time.Time, error) {
	for range maxStepRounds {
		n, err := s.d.round(ctx, s.lanes)
		if err != nil {
			for _, h := range s.lanes {
				h.Drop()
			}
			return time.Time{}, fmt.Errorf("engine: step: dispatch: %w", err)
		}
		switch {
		case n == 0 || n == conflicted:
			continue
		case n == turnedAway:
			return time.Time{}, fmt.Errorf("engine: step: another dispatcher holds the dispatch turn: %w", ErrInvalid)
		case n < 0:
			return time.Time{}, nil
		}
		return time.UnixMilli(n), nil
	}
	return time.Time{}, fmt.Errorf("engine: step: still due after %d dispatch rounds", maxStepRounds)
}

// Close gives up the dispatch turn and unregisters the worker.
func (s *stepper) Close(ctx context.Context) error {
	s.d.endTurnOnExit(ctx)
	for _, h := range s.lanes {
		h.Close()
	}
	s.l.close()
	s.w.fetcher.l.close()
	return s.w.unregister()
}

// uniqueKeyOf returns the unique key task id holds: "k:<key>" for
// UniqueKey, "d:<digest>" for Unique, "" for none.
func uniqueKeyOf(ctx context.Context, pool *redis.Pool, cfg Config, id string) (string, error) {
	if pool == nil {
		return "", fmt.Errorf("engine: nil pool: %w", ErrInvalid)
	}
	if err := checkID(id); err != nil {
		return "", err
	}
	_, st, err := cfg.prepare(pool)
	if err != nil {
		return "", err
	}
	conn, err := pool.GetContext(ctx)
	if err != nil {
		return "", fmt.Errorf("engine: look up task %s: %w", id, err)
	}
	defer conn.Close()
	r, _, err := st.Lookup(ctx, conn, id)
	if errors.Is(err, buckets.ErrNotFound) {
		return "", refused(ErrNotFound, err, "task %s not found", id)
	}
	if err != nil {
		return "", failed("look up task "+id, err)
	}
	return r.Unique, nil
}
