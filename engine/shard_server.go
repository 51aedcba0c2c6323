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

// ShardedServer serves every lane of Shards: one Server per lane (a
// dispatcher, a reaper and a worker, as roles says), all in this process.
// The lanes run independently: a lane whose server cannot be reached
// backs off on its own (each part retries with a backoff that doubles up
// to a few seconds) while the other lanes keep running, and resumes when
// its server returns.
//
// Lanes given the same *redis.Pool live on the same server: their
// dispatchers and idle workers share one blocking wait (one BLPOP over
// their wake-up lists, on one connection), so that the blocked
// connections of an idle process are one per server, not one per lane
// and part. Lanes of different pools (different servers, or the slots of
// a Redis Cluster, whose BLPOP cannot span slots) wait on a connection
// each, shared by the lane's dispatcher and worker.
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
	hubs []*waitHub
	mu   sync.Mutex
	ran  bool
}

// NewShardedServer builds one Server per lane of sh (see NewServer).
func NewShardedServer(sh Shards, cfg Config, h Handler, roles Roles) (*ShardedServer, error) {
	if err := sh.check(); err != nil {
		return nil, err
	}
	s := &ShardedServer{sh: sh}
	base := cfg.withDefaults()
	if err := base.Validate(); err != nil {
		return nil, err
	}
	// Lanes given the same pool live on one server: their dispatchers
	// and idle workers share one blocking wait.
	byPool := map[*redis.Pool][]int{}
	for k, p := range sh.Pools {
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
		if len(ks)*waiting < 2 || len(sh.Pools) < 2 {
			continue
		}
		keys, err := buckets.NewLaneKeys(base.Namespace, ks[0])
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		h := newWaitHub(p, keys.Prefix(), base.Advanced.IdleWait, base.Logger.With(keyComponent, "shared-wait"))
		h.fix, err = hubFixer(sh, base, p, ks)
		if err != nil {
			return nil, err
		}
		hubs[p] = h
		s.hubs = append(s.hubs, h)
	}
	for k, p := range sh.Pools {
		lc := sh.laneConfig(cfg, k)
		lc.lane.hub = hubs[p]
		if len(sh.Pools) > 1 {
			lc.Logger = base.Logger.With("lane", k)
		}
		srv, err := NewServer(p, lc, h, roles)
		if err != nil {
			return nil, err
		}
		s.Lanes = append(s.Lanes, srv)
	}
	return s, nil
}

// hubFixer returns the shared wait's repair after a BLPOP failed on a key
// of the wrong type: each of the lanes ks (on pool) sets aside its own
// keys among those the BLPOP named.
func hubFixer(sh Shards, base Config, pool *redis.Pool, ks []int) (func(context.Context, []string), error) {
	type lane struct {
		st  *buckets.Store
		log *slog.Logger
	}
	var lanes []lane
	for _, k := range ks {
		_, st, err := sh.laneConfig(base, k).prepare(pool)
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

// AddPeriodic declares a periodic entry in lane 0 (see Server.AddPeriodic).
func (s *ShardedServer) AddPeriodic(p Periodic) error { return s.Lanes[0].AddPeriodic(p) }

// Run runs every lane's Server until ctx ends or Shutdown is called (see
// Server.Run), and returns their errors joined. With Shards.MapVersion
// set, it also watches each lane's map key (see watchMap).
func (s *ShardedServer) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.ran {
		s.mu.Unlock()
		return fmt.Errorf("engine: sharded server already ran or was shut down: %w", ErrClosed)
	}
	s.ran = true
	s.mu.Unlock()
	errs := make([]error, len(s.Lanes))
	var wg sync.WaitGroup
	mctx, stop := context.WithCancel(ctx)
	defer stop()
	if s.sh.MapVersion > 0 {
		for k := range s.sh.Pools {
			wg.Go(func() { s.watchMap(mctx, k) })
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
	for _, h := range s.hubs {
		h.close()
	}
	return errors.Join(errs...)
}

// watchMap reads lane k's map key every HeartbeatInterval and, when it
// names a newer version than this process's, stops the lane's Server: an
// operator moved the lane, and this process runs with an old map. Its
// transactions are refused already (ErrShardMapVersion); stopping ends
// its pops too. What it took and could not give back is recovered by the
// reapers of processes with the current map once its heartbeat expires.
func (s *ShardedServer) watchMap(ctx context.Context, k int) {
	srv := s.Lanes[k]
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
			conn, err := s.sh.Pools[k].GetContext(cctx)
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
		if err != nil || v <= s.sh.MapVersion {
			continue
		}
		srv.cfg.Logger.Error("the lane moved in a newer shard map than this process's; no longer serving the lane (restart with the current shard map)",
			"lane_version", v, "version", s.sh.MapVersion)
		sctx, cancel := context.WithTimeout(context.Background(), max(srv.cfg.ShutdownTimeout, time.Second))
		_ = srv.Shutdown(sctx)
		cancel()
		return
	}
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
