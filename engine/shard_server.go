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

// ShardedServer serves every lane of Shards: one Server per lane (a
// dispatcher, a reaper and a worker, as roles says), all in this process.
// The lanes run independently: a lane whose server cannot be reached
// backs off on its own (each part retries with a backoff that doubles up
// to a few seconds) while the other lanes keep running, and resumes when
// its server returns.
//
// Each lane's worker runs up to Config.Concurrency handlers, so a process
// runs up to Lanes×Concurrency at once; each takes its queues by the
// configured weights or strict priority within its lane (docs/scaling.md
// says how that holds across lanes). Periodic entries (AddPeriodic) are
// kept in lane 0, so that they fire once, not once per lane.
type ShardedServer struct {
	// Lanes holds each lane's Server, in lane order.
	Lanes []*Server

	sh   Shards
	cfg  Config
	mu   sync.Mutex
	ran  bool
	done chan struct{}
}

// NewShardedServer builds one Server per lane of sh (see NewServer).
func NewShardedServer(sh Shards, cfg Config, h Handler, roles Roles) (*ShardedServer, error) {
	if err := sh.check(); err != nil {
		return nil, err
	}
	s := &ShardedServer{sh: sh, done: make(chan struct{})}
	base := cfg.withDefaults()
	for k, p := range sh.Pools {
		lc := sh.laneConfig(cfg, k)
		if len(sh.Pools) > 1 {
			lc.Logger = base.Logger.With("lane", k)
		}
		srv, err := NewServer(p, lc, h, roles)
		if err != nil {
			return nil, err
		}
		s.Lanes = append(s.Lanes, srv)
	}
	s.cfg = s.Lanes[0].cfg
	return s, nil
}

// AddPeriodic declares a periodic entry in lane 0 (see Server.AddPeriodic).
func (s *ShardedServer) AddPeriodic(p Periodic) error { return s.Lanes[0].AddPeriodic(p) }

// Run runs every lane's Server until ctx ends or Shutdown is called (see
// Server.Run), and returns their errors joined. With Shards.MapVersion
// set, it also writes the version to each lane's map key where none is
// yet (SETNX), retrying a lane that cannot be reached until it can.
func (s *ShardedServer) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.ran {
		s.mu.Unlock()
		return fmt.Errorf("engine: sharded server already ran or was shut down: %w", ErrClosed)
	}
	s.ran = true
	s.mu.Unlock()
	defer close(s.done)
	errs := make([]error, len(s.Lanes))
	var wg sync.WaitGroup
	mctx, stop := context.WithCancel(ctx)
	defer stop()
	if s.sh.MapVersion != "" {
		for k, p := range s.sh.Pools {
			wg.Go(func() { initMapVersion(mctx, p, s.Lanes[k].cfg, s.sh.MapVersion) })
		}
	}
	var lanes sync.WaitGroup
	for k, srv := range s.Lanes {
		lanes.Go(func() {
			if err := srv.Run(ctx); err != nil {
				errs[k] = fmt.Errorf("lane %d: %w", k, err)
			}
		})
	}
	lanes.Wait()
	stop()
	wg.Wait()
	return errors.Join(errs...)
}

// Shutdown shuts every lane's Server down (see Server.Shutdown) at once
// and returns their errors joined.
func (s *ShardedServer) Shutdown(ctx context.Context) error {
	errs := make([]error, len(s.Lanes))
	var wg sync.WaitGroup
	for k, srv := range s.Lanes {
		wg.Go(func() {
			if err := srv.Shutdown(ctx); err != nil {
				errs[k] = fmt.Errorf("lane %d: %w", k, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// initMapVersion writes version to the lane's map key unless it has one,
// retrying with backoff until it succeeds or ctx ends.
func initMapVersion(ctx context.Context, pool *redis.Pool, cfg Config, version string) {
	_, st, err := cfg.prepare()
	if err != nil {
		return
	}
	var bo rconn.Backoff
	for ctx.Err() == nil {
		err := func() error {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			conn, err := pool.GetContext(cctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = redis.DoContext(conn, cctx, "SETNX", st.Keys.ShardMap(), version)
			return err
		}()
		if err == nil {
			return
		}
		if !bo.Wait(ctx, cfg.Logger, "write the shard-map version", err) {
			return
		}
	}
}
