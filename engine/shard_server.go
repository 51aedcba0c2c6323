package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// Server runs the parts of the engine in one process, as Roles says: a
// dispatcher (moves due buckets to the ready lists), a reaper (recovers
// the tasks of dead workers) and a worker (runs tasks), and the scheduler
// of the periodic entries added with AddPeriodic. Run several processes
// to scale out; every part is safe to run in many processes at once.
//
// Over several lanes (a pool per lane) it runs the parts of each lane,
// independently: a lane whose server cannot be reached backs off on its
// own while the other lanes keep running, and resumes when its server
// returns. Lanes given the same *redis.Pool live on the same server: their
// dispatchers and idle workers share one blocking wait (one BLPOP over
// their wake-up lists, on one connection). Lanes of different pools (or
// the slots of a Redis Cluster, whose BLPOP cannot span slots) wait on a
// connection each. Each lane's worker runs up to Config.Concurrency
// handlers, so a process runs up to lanes×Concurrency at once. Periodic
// entries are kept in lane 0, so that they fire once, not once per lane.
type Server struct {
	lanes      []*laneServer
	pools      []*redis.Pool
	mapVersion int64
	hubs       []*waitHub
	mu         sync.Mutex
	ran        bool          // guarded by mu: Run started, or Shutdown came first
	done       chan struct{} // closed when Run has returned (or will never run)
}

// NewServer builds the parts roles asks for, over one pool or one pool
// per lane (as NewClient). h may be nil when roles lacks RoleWorker.
// Roles outside AllRoles, and no role at all, are refused.
func NewServer(cfg Config, h Handler, roles Roles, pools ...*redis.Pool) (*Server, error) {
	if err := checkPools(pools); err != nil {
		return nil, err
	}
	base := cfg.withDefaults()
	if err := base.Validate(); err != nil {
		return nil, err
	}
	s := &Server{pools: pools, mapVersion: base.Advanced.MapVersion, done: make(chan struct{})}
	// Lanes given the same pool live on one server: their dispatchers
	// and idle workers share one blocking wait.
	byPool := map[*redis.Pool][]int{}
	for k, p := range pools {
		byPool[p] = append(byPool[p], k)
	}
	waiting := 0 // the parts of a lane that block: its dispatcher, its worker
	if roles.Has(RoleDispatcher) {
		waiting++
	}
	if roles.Has(RoleWorker) {
		waiting++
	}
	hubs := map[*redis.Pool]*waitHub{}
	for p, ks := range byPool {
		if len(ks)*waiting < 2 || len(pools) < 2 {
			continue
		}
		keys, err := buckets.NewLaneKeys(base.Namespace, ks[0])
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		h := newWaitHub(p, keys.Prefix(), base.Advanced.IdleWait, base.Logger.With(keyComponent, "shared-wait"))
		h.fix, err = hubFixer(base, p, ks)
		if err != nil {
			return nil, err
		}
		hubs[p] = h
		s.hubs = append(s.hubs, h)
	}
	for k, p := range pools {
		lc := laneConfig(cfg, k)
		lc.lane.hub = hubs[p]
		if len(pools) > 1 {
			lc.Logger = base.Logger.With("lane", k)
		}
		srv, err := newLaneServer(p, lc, h, roles)
		if err != nil {
			return nil, err
		}
		s.lanes = append(s.lanes, srv)
	}
	return s, nil
}

// hubFixer returns the shared wait's repair after a BLPOP failed on a key
// of the wrong type: each of the lanes ks (on pool) sets aside its own
// keys among those the BLPOP named.
func hubFixer(base Config, pool *redis.Pool, ks []int) (func(context.Context, []string), error) {
	type lane struct {
		st  *buckets.Store
		log *slog.Logger
	}
	var lanes []lane
	for _, k := range ks {
		_, st, err := laneConfig(base, k).prepare(pool)
		if err != nil {
			return nil, err
		}
		lanes = append(lanes, lane{st, base.Logger.With(keyComponent, "shared-wait", "lane", k)})
	}
	return func(ctx context.Context, keys []string) {
		for _, l := range lanes {
			var mine []string
			for _, key := range keys {
				if strings.HasPrefix(key, l.st.Keys.Prefix()) {
					mine = append(mine, key)
				}
			}
			if len(mine) > 0 {
				setAside(ctx, pool, l.st, l.st.Keys, l.log, "list", mine...)
			}
		}
	}, nil
}

// AddPeriodic declares a periodic entry (see Periodic),
// before Run: Run then also runs a scheduler, which keeps the entry's
// firings enqueued together with every other process declaring it.
func (s *Server) AddPeriodic(p Periodic) error { return s.lanes[0].AddPeriodic(p) }

// Run runs the parts until ctx ends or Shutdown is called, then stops
// them: the dispatcher and reaper first (they make work), then the worker,
// which lets running handlers finish (for Config.ShutdownTimeout, or until
// Shutdown's deadline, see Shutdown) and returns the rest to their queues. Run
// returns when every goroutine has ended.
//
// It returns ErrClosed if the server already ran or was shut down, and
// otherwise the errors of its parts' Run methods joined with errors.Join
// (nil when every part stopped cleanly).
func (s *Server) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.ran {
		s.mu.Unlock()
		return fmt.Errorf("engine: server already ran or was shut down: %w", ErrClosed)
	}
	s.ran = true
	s.mu.Unlock()
	defer close(s.done)
	errs := make([]error, len(s.lanes))
	var wg sync.WaitGroup
	mctx, stop := context.WithCancel(ctx)
	defer stop()
	if s.mapVersion > 0 {
		for k := range s.pools {
			wg.Go(func() { s.watchMap(mctx, k) })
		}
	}
	var lanes sync.WaitGroup
	for k, srv := range s.lanes {
		lanes.Go(func() { errs[k] = s.laneErr(k, srv.Run(ctx)) })
	}
	lanes.Wait()
	stop()
	wg.Wait()
	for _, h := range s.hubs {
		h.close()
	}
	return errors.Join(errs...)
}

// laneErr names lane k in err when there are several lanes.
func (s *Server) laneErr(k int, err error) error {
	if err == nil || len(s.lanes) == 1 {
		return err
	}
	return fmt.Errorf("lane %d: %w", k, err)
}

// watchMap reads lane k's map key every HeartbeatInterval and, when it
// names a newer version than this process's, stops the lane's Server: an
// operator moved the lane, and this process runs with an old map. Its
// transactions are refused already (ErrShardMapVersion); stopping ends
// its pops too. What it took and could not give back is recovered by the
// reapers of processes with the current map once its heartbeat expires.
func (s *Server) watchMap(ctx context.Context, k int) {
	srv := s.lanes[k]
	_, st, err := srv.cfg.prepare(srv.pool)
	if err != nil {
		return
	}
	t := time.NewTicker(srv.cfg.Advanced.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		v, err := func() (int64, error) {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			conn, err := s.pools[k].GetContext(cctx)
			if err != nil {
				return 0, err
			}
			defer conn.Close()
			v, err := redis.Int64(redis.DoContext(conn, cctx, "GET", st.Keys.ShardMap()))
			if errors.Is(err, redis.ErrNil) {
				return 0, nil
			}
			return v, err
		}()
		if err != nil || v <= s.mapVersion {
			continue
		}
		srv.cfg.Logger.Error("the lane moved in a newer shard map than this process's; no longer serving the lane (restart with the current shard map)",
			"lane_version", v, "version", s.mapVersion)
		sctx, cancel := context.WithTimeout(context.Background(), max(srv.cfg.ShutdownTimeout, time.Second))
		_ = srv.Shutdown(sctx)
		cancel()
		return
	}
}

// Shutdown stops the server gracefully: running handlers may finish
// until the earlier of ctx's deadline and Config.ShutdownTimeout from the
// call (negative: at once); then their contexts are cancelled and their
// tasks go back to their queues. It waits until Run has returned, or
// until that deadline plus a slack of 250 ms, whichever comes first. A
// second call with an earlier deadline (an already-cancelled context,
// say) returns running tasks to their queues at once. Before Run, it
// closes the server: Run then returns ErrClosed.
//
// It returns nil when Run stopped cleanly in time, Run's error when it
// returned one, and an error matching ctx.Err(), or
// context.DeadlineExceeded when ShutdownTimeout passed (errors.Is), when
// the deadline came first (joined with Run's error if Run returned within
// the slack).
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	first := !s.ran
	s.ran = true
	s.mu.Unlock()
	errs := make([]error, len(s.lanes))
	var wg sync.WaitGroup
	for k, srv := range s.lanes {
		wg.Go(func() { errs[k] = s.laneErr(k, srv.Shutdown(ctx)) })
	}
	wg.Wait()
	if first {
		// Run never started and now never will.
		close(s.done)
		return errors.Join(errs...)
	}
	if err := errors.Join(errs...); err != nil {
		// A lane's Run did not stop in time: the bound is the lanes'.
		return err
	}
	// Every lane's Run returned: Run itself ends at once.
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
