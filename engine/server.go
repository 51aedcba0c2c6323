package engine

import (
	"context"
	"fmt"
	"sync"

	"github.com/gomodule/redigo/redis"
)

// Roles picks the parts a Server runs. The zero value runs all of them.
type Roles struct {
	NoDispatcher bool // do not move due buckets
	NoReaper     bool // do not recover dead workers' tasks
	NoWorker     bool // do not run tasks
}

// Server runs a dispatcher, a reaper and a worker in one process, as
// Roles says. Run several processes to scale out; every part is safe to
// run in many processes at once.
type Server struct {
	Dispatcher *Dispatcher // nil when Roles.NoDispatcher
	Reaper     *Reaper     // nil when Roles.NoReaper
	Worker     *Worker     // nil when Roles.NoWorker

	mu         sync.Mutex
	running    bool
	cancel     context.CancelFunc
	stopCtx    context.Context // the Shutdown caller's deadline
	stopCancel context.CancelFunc
	done       chan struct{}
}

// NewServer builds the parts roles asks for. h may be nil when
// roles.NoWorker is set.
func NewServer(pool *redis.Pool, cfg Config, h Handler, roles Roles) (*Server, error) {
	s := &Server{done: make(chan struct{})}
	var err error
	if !roles.NoDispatcher {
		if s.Dispatcher, err = NewDispatcher(pool, cfg); err != nil {
			return nil, err
		}
	}
	if !roles.NoReaper {
		if s.Reaper, err = NewReaper(pool, cfg); err != nil {
			return nil, err
		}
	}
	if !roles.NoWorker {
		if s.Worker, err = NewWorker(pool, cfg, h); err != nil {
			return nil, err
		}
	}
	if s.Dispatcher == nil && s.Reaper == nil && s.Worker == nil {
		return nil, fmt.Errorf("engine: NewServer: every role is off: %w", ErrInvalidOption)
	}
	return s, nil
}

// Run runs the parts until ctx ends or Shutdown is called, then stops
// them: the dispatcher and reaper first (they make work), then the worker,
// which lets running handlers finish (Config.ShutdownTimeout) and returns
// the rest to their queues. Run returns when every goroutine has ended.
func (s *Server) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.running || s.cancel != nil {
		s.mu.Unlock()
		return fmt.Errorf("engine: server already ran: %w", ErrClosed)
	}
	s.running = true
	mctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.mu.Unlock()
	defer close(s.done)
	defer cancel()

	var makers group
	if s.Dispatcher != nil {
		makers.Go(func() { _ = s.Dispatcher.Run(mctx) })
	}
	if s.Reaper != nil {
		makers.Go(func() { _ = s.Reaper.Run(mctx) })
	}
	var workers group
	if s.Worker != nil {
		workers.Go(func() { _ = s.Worker.Run(context.WithoutCancel(ctx)) })
	}
	select {
	case <-ctx.Done():
	case <-mctx.Done():
	}
	cancel()
	makers.Wait()
	if s.Worker != nil {
		// Shutdown may have been called with its own deadline; otherwise
		// the worker gets its ShutdownTimeout.
		_ = s.Worker.Shutdown(s.shutdownCtx())
	}
	workers.Wait()
	s.mu.Lock()
	if s.stopCancel != nil {
		s.stopCancel()
	}
	s.mu.Unlock()
	return nil
}

func (s *Server) shutdownCtx() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopCtx != nil {
		return s.stopCtx
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.Worker.cfg.ShutdownTimeout)
	s.stopCancel = cancel
	return ctx
}

// Shutdown stops the server gracefully with ctx as the deadline for
// running handlers, and waits until Run has returned. It does nothing
// if the server is not running.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if !s.running {
		s.mu.Unlock()
		return nil
	}
	if s.stopCtx == nil {
		s.stopCtx = ctx
	}
	cancel := s.cancel
	s.mu.Unlock()
	cancel()
	<-s.done
	return nil
}
