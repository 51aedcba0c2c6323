package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/bucketq/bucketq/engine/internal/rconn"
	"github.com/gomodule/redigo/redis"
)

// Roles picks the parts a Server runs: RoleDispatcher, RoleReaper and
// RoleWorker combined with |; AllRoles runs all three. There is no
// default: zero, no role at all, is refused, so that a role set computed
// from flags cannot turn into "everything" by mistake.
type Roles uint8

// The roles of a Server.
const (
	RoleDispatcher Roles = 1 << iota // move due buckets to the ready lists
	RoleReaper                       // recover the tasks of dead workers
	RoleWorker                       // run tasks

	AllRoles = RoleDispatcher | RoleReaper | RoleWorker
)

// Has reports whether r includes every role in role.
func (r Roles) Has(role Roles) bool { return r&role == role }

// Server runs a dispatcher, a reaper and a worker in one process, as
// Roles says. Run several processes to scale out; every part is safe to
// run in many processes at once.
type laneServer struct {
	Dispatcher *dispatcher // nil without RoleDispatcher
	Reaper     *reaper     // nil without RoleReaper
	Worker     *worker     // nil without RoleWorker
	// Scheduler keeps the periodic entries added with AddPeriodic
	// enqueued; nil until the first AddPeriodic. It runs whatever the
	// roles, since declaring an entry is what a user asks for.
	Scheduler *scheduler

	pool *redis.Pool
	cfg  Config

	mu      sync.Mutex
	started bool               // guarded by mu
	cancel  context.CancelFunc // guarded by mu; stops the dispatcher and reaper
	done    chan struct{}      // closed when Run has returned
	runErr  error              // guarded by mu; Run's result
}

// NewServer builds the parts roles asks for. h may be nil when roles
// lacks RoleWorker. Roles outside AllRoles are refused.
func newLaneServer(pool *redis.Pool, cfg Config, h Handler, roles Roles) (*laneServer, error) {
	if roles == 0 || roles&^AllRoles != 0 {
		return nil, fmt.Errorf("engine: NewServer: roles %#x: want some of RoleDispatcher, RoleReaper and RoleWorker combined with |, or AllRoles: %w", uint8(roles), ErrInvalid)
	}
	s := &laneServer{done: make(chan struct{}), pool: pool, cfg: cfg}
	var err error
	if roles.Has(RoleDispatcher) {
		if s.Dispatcher, err = newDispatcher(pool, cfg); err != nil {
			return nil, err
		}
	}
	if roles.Has(RoleReaper) {
		if s.Reaper, err = newReaper(pool, cfg); err != nil {
			return nil, err
		}
	}
	if roles.Has(RoleWorker) {
		if s.Worker, err = newWorker(pool, cfg, h); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// AddPeriodic is Server.AddPeriodic for one lane.
func (s *laneServer) AddPeriodic(p Periodic) error {
	if s.Scheduler == nil {
		sc, err := newScheduler(s.pool, s.cfg)
		if err != nil {
			return err
		}
		s.Scheduler = sc
	}
	return s.Scheduler.Add(p)
}

// Run is Server.Run for one lane.
func (s *laneServer) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return fmt.Errorf("engine: server already ran or was shut down: %w", ErrClosed)
	}
	s.started = true
	mctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.mu.Unlock()
	defer close(s.done)
	defer cancel()
	err := s.checkMemory(ctx)
	// Redis may be restarting or full as the process starts: the limits
	// are written as soon as it takes them, as every part waits for it.
	var bo rconn.Backoff
	for err == nil {
		err = s.writeLimits(ctx)
		if err == nil || errors.Is(err, ErrInvalid) || !bo.Wait(ctx, s.cfg.withDefaults().Logger, "write the queue limits", err) {
			break
		}
		err = nil // waited: try again
	}
	if err != nil {
		s.mu.Lock()
		s.runErr = err
		s.mu.Unlock()
		return err
	}

	var dErr, rErr, wErr error
	var makers sync.WaitGroup
	if s.Dispatcher != nil {
		makers.Go(func() { dErr = s.Dispatcher.Run(mctx) })
	}
	if s.Reaper != nil {
		makers.Go(func() { rErr = s.Reaper.Run(mctx) })
	}
	var pErr error
	if s.Scheduler != nil {
		makers.Go(func() { pErr = s.Scheduler.Run(mctx) })
	}
	var workers sync.WaitGroup
	if s.Worker != nil {
		// The worker stops through Shutdown, never through its context,
		// so that it can let running handlers finish.
		workers.Go(func() { wErr = s.Worker.Run(context.WithoutCancel(ctx)) })
	}
	viaShutdown := false
	select {
	case <-ctx.Done():
	case <-mctx.Done():
		viaShutdown = true
	}
	cancel()
	makers.Wait()
	if s.Worker != nil && !viaShutdown {
		grace, stop := context.WithTimeout(context.Background(), max(s.Worker.cfg.ShutdownTimeout, 0))
		_ = s.Worker.Shutdown(grace) // its error is Run's, below
		stop()
	}
	workers.Wait()
	err = errors.Join(dErr, rErr, pErr, wErr)
	s.mu.Lock()
	s.runErr = err
	s.mu.Unlock()
	return err
}

// checkMemory looks at Redis's memory policy once, at start (see
// MemoryPolicy): an evicting one is refused unless Config.AllowEviction.
func (s *laneServer) checkMemory(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return checkMemoryPolicy(cctx, s.pool, s.cfg.AllowEviction, s.cfg.withDefaults().Logger)
}

// writeLimits writes the configured queues' flow control
// (QueueConfig.MaxRunning, Rate, KeyMaxRunning, KeyRate) to lim:<q>, one
// MULTI each; a queue configured without any limit writes nothing (limits
// set at run time stay).
func (s *laneServer) writeLimits(ctx context.Context) error {
	cfg := s.cfg.withDefaults()
	var set []QueueConfig
	for _, q := range cfg.Queues {
		if lim, err := q.limits(); err != nil || lim.Limited() {
			set = append(set, q)
		}
	}
	if len(set) == 0 {
		return nil
	}
	_, st, err := cfg.prepare(s.pool)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := s.pool.GetContext(cctx)
	if err != nil {
		return fmt.Errorf("engine: queue limits: %w", err)
	}
	defer conn.Close()
	for _, q := range set {
		lim, err := q.limits()
		if err != nil {
			return err
		}
		if err := st.SetQueueLimits(cctx, conn, q.Name, lim); err != nil {
			return fmt.Errorf("engine: queue limits: %w", err)
		}
	}
	return nil
}

// Shutdown is Server.Shutdown for one lane.
func (s *laneServer) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if !s.started {
		s.started = true
		close(s.done)
		s.mu.Unlock()
		return nil
	}
	cancel := s.cancel
	s.mu.Unlock()
	timeout := s.cfg.ShutdownTimeout
	if timeout == 0 {
		timeout = DefaultConfig().ShutdownTimeout
	}
	ctx, stop := boundShutdown(ctx, timeout)
	defer stop()
	if cancel != nil {
		cancel()
	}
	if s.Worker != nil {
		// The worker's Shutdown waits with the same deadline and slack;
		// its errors are Run's.
		go func() { _ = s.Worker.Shutdown(ctx) }()
	}
	select {
	case <-s.done:
		if ctx.Err() == nil {
			return s.result()
		}
	case <-ctx.Done():
	}
	t := time.NewTimer(shutdownSlack)
	defer t.Stop()
	cerr := fmt.Errorf("engine: server shutdown: %w", context.Cause(ctx))
	select {
	case <-s.done:
		if err := s.result(); err != nil && !errors.Is(err, ctx.Err()) {
			return errors.Join(cerr, err)
		}
		return cerr
	case <-t.C:
		return cerr
	}
}

// result is Run's error once Run has returned (nil before Run ran).
func (s *laneServer) result() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runErr
}
