package engine

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
	"github.com/bucketq/bucketq/internal/redisinfo"
	"github.com/gomodule/redigo/redis"
)

// Reaper returns the tasks of dead workers and of runs whose lease ran
// out, and trims old dead letters. Any number of reapers may run at once:
// every return is an optimistic transaction over the worker's pending set
// and the task records, so each task is returned once.
//
// A worker is dead when its heartbeat key is gone; the server expires it,
// so no clocks are compared. A server restarted less than HeartbeatTTL
// ago is not believed: its heartbeat keys may have expired while it was
// down, and a live worker beats again within the TTL. Leases are compared on the reaper's clock
// with HeartbeatTTL of slack, a backstop for a worker that is alive but
// no longer looks after its own leases.
type reaper struct {
	pool  *redis.Pool
	cfg   Config
	store *buckets.Store
	log   *slog.Logger
}

// NewReaper returns a Reaper over pool.
func newReaper(pool *redis.Pool, cfg Config) (*reaper, error) {
	if pool == nil {
		return nil, fmt.Errorf("engine: NewReaper: nil pool: %w", ErrInvalid)
	}
	cfg, st, err := cfg.prepare(pool)
	if err != nil {
		return nil, err
	}
	return &reaper{pool: pool, cfg: cfg, store: st, log: cfg.Logger.With(keyComponent, "reaper")}, nil
}

// ReapResult counts what one pass did.
type reapResult struct {
	DeadWorkers   int // workers found dead and cleaned up
	Recovered     int // tasks returned to their queues
	Buried        int // tasks sent to the dead letters (too many recoveries, bad records)
	ExpiredLeases int // of Recovered, runs whose lease ran out
	TrimmedDead   int // dead letters past DeadRetention, deleted
}

// trimPasses is how many passes of Run at most go by between two trims of
// the dead letters: they are kept for days, and an empty trim is still a
// command.
const trimPasses = 10

// trimEvery is how often Run trims the dead letters: every trimPasses
// ReapIntervals, or every DeadRetention when that is shorter. A dead
// letter lives at most that much past DeadRetention.
func (r *reaper) trimEvery() time.Duration {
	return min(trimPasses*r.cfg.Advanced.ReapInterval, r.cfg.DeadRetention)
}

// Run reaps every ReapInterval (with jitter) until ctx ends; every
// trimEvery a pass also trims the dead letters.
func (r *reaper) Run(ctx context.Context) error {
	r.log.Info("reaper started", "interval", r.cfg.Advanced.ReapInterval)
	defer r.log.Info("reaper stopped")
	var bo rconn.Backoff
	var trimmed time.Time // when a pass last trimmed (monotonic)
	for {
		trim := trimmed.IsZero() || time.Since(trimmed) >= r.trimEvery()
		at := time.Now()
		placeAgain(ctx, r.pool, r.store, r.log)
		res, err := r.reap(ctx, trim)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !bo.Wait(ctx, r.log, "reap", err) {
				return nil
			}
			continue
		}
		bo.Reset()
		if trim {
			trimmed = at
		}
		if res != (reapResult{}) {
			r.log.Info("reaped", "dead_workers", res.DeadWorkers, "recovered", res.Recovered,
				"buried", res.Buried, "expired_leases", res.ExpiredLeases, "trimmed_dead", res.TrimmedDead)
		}
		jitter := time.Duration(rand.Int64N(int64(r.cfg.Advanced.ReapInterval)/5 + 1))
		if !rconn.Sleep(ctx, r.cfg.Advanced.ReapInterval+jitter) {
			return nil
		}
	}
}

// Reap makes one pass: dead workers, expired leases, and dead letters
// past DeadRetention.
func (r *reaper) Reap(ctx context.Context) (reapResult, error) { return r.reap(ctx, true) }

// reap makes one pass; trim: the dead letters too.
func (r *reaper) reap(ctx context.Context, trim bool) (reapResult, error) {
	var res reapResult
	conn, err := r.pool.GetContext(ctx)
	if err != nil {
		return res, fmt.Errorf("engine: reap: %w", err)
	}
	defer conn.Close()
	workers, alive, err := r.store.Workers(ctx, conn)
	if err != nil {
		return res, fmt.Errorf("engine: reap: %w", err)
	}
	now := r.cfg.Advanced.Clock.Now()
	restarted := false
	if slices.Contains(alive, false) {
		restarted = r.restartedWithinTTL(ctx, conn)
	}
	for i, w := range workers {
		if !alive[i] && restarted {
			continue // judged once the server has been up a TTL
		}
		if alive[i] {
			cutoff := ms(now.Add(-r.cfg.Advanced.HeartbeatTTL))
			n, b, _, err := r.requeueAll(ctx, conn, w, cutoff, buckets.LeaseExpired)
			res.Recovered += n
			res.ExpiredLeases += n
			res.Buried += b
			if err != nil {
				return res, err
			}
			continue
		}
		n, b, back, err := r.reapDead(ctx, conn, w)
		res.Recovered += n
		res.Buried += b
		if err != nil {
			return res, err
		}
		if !back {
			res.DeadWorkers++
		}
	}
	for trim {
		ids, err := r.store.DeadBefore(ctx, conn, ms(now.Add(-r.cfg.DeadRetention)), 200)
		if err != nil || len(ids) == 0 {
			return res, wrapReap(err)
		}
		n, err := r.store.Purge(ctx, conn, ids)
		res.TrimmedDead += n
		if err != nil || n == 0 {
			return res, wrapReap(err)
		}
	}
	return res, nil
}

// restartedWithinTTL reports whether the server has been up for less than
// a heartbeat TTL (INFO's uptime_in_seconds, whole seconds). A server
// that does not say (INFO refused or renamed) is taken as up long since.
func (r *reaper) restartedWithinTTL(ctx context.Context, conn redis.Conn) bool {
	info, err := redis.String(redis.DoContext(conn, ctx, "INFO"))
	if err != nil {
		return false
	}
	up, ok := redisinfo.Int(info, "uptime_in_seconds")
	return ok && time.Duration(up)*time.Second < r.cfg.Advanced.HeartbeatTTL
}

func wrapReap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("engine: reap: %w", err)
}

// reapDead returns everything a dead worker held and forgets it. The
// worker was found dead by an earlier read: each transaction checks it
// again, and a worker whose heartbeat is back (it beat again once a
// restarted server had expired its key) keeps everything.
func (r *reaper) reapDead(ctx context.Context, conn redis.Conn, w string) (recovered, buried int, alive bool, err error) {
	log := r.log.With(keyWorker, w)
	res, err := r.store.RecoverAllInflight(ctx, conn, w, ms(r.cfg.Advanced.Clock.Now()), true)
	recovered, buried, alive = res.Requeued, res.Buried, res.Alive
	if err != nil || alive {
		return recovered, buried, alive, wrapReap(err)
	}
	n, b, alive, err := r.requeueAll(ctx, conn, w, math.MaxInt64, buckets.WorkerDied)
	recovered += n
	buried += b
	if err != nil || alive {
		return recovered, buried, alive, err
	}
	if _, err := r.store.Forget(ctx, conn, w, true); err != nil {
		return recovered, buried, false, wrapReap(err)
	}
	if recovered+buried > 0 {
		log.Warn("worker died; its tasks were returned", "recovered", recovered, "buried", buried)
	}
	return recovered, buried, false, nil
}

// requeueAll returns worker w's pending tasks whose lease deadline is at
// or before cutoff; alive: w was taken for dead (WorkerDied) but its
// heartbeat was back.
func (r *reaper) requeueAll(ctx context.Context, conn redis.Conn, w string, cutoff int64, why buckets.Reason) (recovered, buried int, alive bool, err error) {
	for {
		ids, err := r.store.PendingIDs(ctx, conn, w, cutoff, 100)
		if err != nil || len(ids) == 0 {
			return recovered, buried, false, wrapReap(err)
		}
		res, err := r.store.Requeue(ctx, conn, w, ids, ms(r.cfg.Advanced.Clock.Now()), why, r.cfg.maxRecoveries())
		if err != nil {
			return recovered, buried, false, wrapReap(err)
		}
		r.cfg.observeRecovered(res, why)
		recovered += res.Requeued
		buried += res.Buried
		if res.Alive || res.Requeued+res.Buried == 0 {
			return recovered, buried, res.Alive, nil
		}
	}
}
