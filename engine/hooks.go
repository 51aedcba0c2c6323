package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/bucketq/bucketq/internal/enginehook"
	"github.com/gomodule/redigo/redis"
)

// The parts one at a time, for the project's own tests and fault harness
// (internal/enginehook); users run them through Server.
func init() {
	enginehook.NewWorker = func(pool *redis.Pool, cfg, h any) (enginehook.Worker, error) {
		c, hd, err := hookArgs(cfg, h)
		if err != nil {
			return nil, err
		}
		w, err := newWorker(pool, c, hd)
		if err != nil {
			return nil, err
		}
		return w, nil
	}
	enginehook.NewDispatcher = func(pool *redis.Pool, cfg any) (enginehook.Dispatcher, error) {
		c, _, err := hookArgs(cfg, nil)
		if err != nil {
			return nil, err
		}
		d, err := newDispatcher(pool, c)
		if err != nil {
			return nil, err
		}
		return d, nil
	}
	enginehook.NewReaper = func(pool *redis.Pool, cfg any) (enginehook.Reaper, error) {
		c, _, err := hookArgs(cfg, nil)
		if err != nil {
			return nil, err
		}
		r, err := newReaper(pool, c)
		if err != nil {
			return nil, err
		}
		return hookReaper{r}, nil
	}
	enginehook.NewScheduler = func(pool *redis.Pool, cfg any, horizon time.Duration, ps ...any) (enginehook.Scheduler, error) {
		c, _, err := hookArgs(cfg, nil)
		if err != nil {
			return nil, err
		}
		s, err := newScheduler(pool, c)
		if err != nil {
			return nil, err
		}
		if horizon > 0 {
			s.Horizon = horizon
		}
		for _, v := range ps {
			p, ok := v.(Periodic)
			if !ok {
				return nil, fmt.Errorf("engine: scheduler entry of type %T, want Periodic: %w", v, ErrInvalid)
			}
			if err := s.Add(p); err != nil {
				return nil, err
			}
		}
		return s, nil
	}
	enginehook.ServerWorkers = func(v any) []enginehook.Worker {
		s, _ := v.(*Server)
		if s == nil {
			return nil
		}
		var out []enginehook.Worker
		for _, l := range s.lanes {
			if l.Worker != nil {
				out = append(out, l.Worker)
			}
		}
		return out
	}
}

func hookArgs(cfg, h any) (Config, Handler, error) {
	c, ok := cfg.(Config)
	if !ok {
		return Config{}, nil, fmt.Errorf("engine: config of type %T, want Config: %w", cfg, ErrInvalid)
	}
	if h == nil {
		return c, nil, nil
	}
	hd, ok := h.(Handler)
	if !ok {
		return Config{}, nil, fmt.Errorf("engine: handler of type %T, want Handler: %w", h, ErrInvalid)
	}
	return c, hd, nil
}

type hookReaper struct{ *reaper }

func (r hookReaper) Reap(ctx context.Context) (enginehook.ReapResult, error) {
	res, err := r.reaper.Reap(ctx)
	return enginehook.ReapResult(res), err
}
