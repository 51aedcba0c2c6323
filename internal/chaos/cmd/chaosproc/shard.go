package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/chaos/ledger"
	"github.com/bucketq/bucketq/internal/enginehook"
	"github.com/gomodule/redigo/redis"
)

// shardedClient adapts an *engine.Client over several lanes to the
// producer: a batch (all of one ShardKey, so one lane) is written or not
// as a whole.
type shardedClient struct{ c *engine.Client }

func (s shardedClient) Enqueue(ctx context.Context, typ string, payload []byte, opts ...engine.Option) (*engine.TaskInfo, error) {
	return s.c.Enqueue(ctx, typ, payload, opts...)
}

func (s shardedClient) EnqueueBatch(ctx context.Context, tasks []engine.NewTask) ([]*engine.TaskInfo, error) {
	res, err := s.c.EnqueueBatch(ctx, tasks)
	if err != nil {
		written := 0
		for _, ti := range res {
			if ti != nil {
				written++
			}
		}
		if written > 0 {
			// A batch of one ShardKey is one lane's transaction: never
			// partly written. Say so loudly if it ever is.
			return nil, fmt.Errorf("%d of %d tasks of one lane's batch written: %w", written, len(tasks), err)
		}
		return nil, err
	}
	return res, nil
}

// runSharded runs the process's role over every lane of pools: a producer
// (of tasks or of workflows) with a Client, the other roles as a Server of
// that role.
func runSharded(ctx context.Context, pools []*redis.Pool, cfg engine.Config, o options, log *slog.Logger) error {
	switch o.mode {
	case "producer":
		c, err := engine.NewClient(cfg, pools...)
		if err != nil {
			return err
		}
		err = produceWith(ctx, shardedClient{c}, o, log)
		log.Info("producer rerouted", "tasks", c.Rerouted())
		return err
	case "flow-producer":
		c, err := engine.NewClient(cfg, pools...)
		if err != nil {
			return err
		}
		return produceFlows(ctx, c, o, log)
	case "worker":
		if o.ledgerPath == "" {
			return fmt.Errorf("worker needs -ledger")
		}
		led, err := ledger.Create(o.ledgerPath)
		if err != nil {
			return err
		}
		defer led.Close()
		srv, err := engine.NewServer(cfg, workMux(led, o, log), engine.RoleWorker, pools...)
		if err != nil {
			return err
		}
		workers := enginehook.ServerWorkers(srv)
		var ids []string
		for _, w := range workers {
			ids = append(ids, w.ID())
		}
		if err := writeIDs(o.idFile, ids...); err != nil {
			return err
		}
		log.Info("worker ids", "workers", ids)
		chained := func() int64 {
			var n int64
			for _, w := range workers {
				n += w.Chained()
			}
			return n
		}
		ahead := func() int64 {
			var n int64
			for _, w := range workers {
				n += w.ClaimedAhead()
			}
			return n
		}
		return countChained(led, chained, ahead, log, func() error { return runUntil(ctx, srv, cfg.ShutdownTimeout) })
	case "scheduler":
		// Periodic entries live in lane 0 (Server.AddPeriodic
		// declares them there): the scheduler is lane 0's. It runs with a
		// skewed clock and is killed at random, so it is a scheduler
		// alone, as without shards, not a server of another role too.
		return schedule(ctx, pools[0], cfg, o, log)
	case "dispatcher", "reaper":
		role := engine.RoleDispatcher
		if o.mode == "reaper" {
			role = engine.RoleReaper
		}
		srv, err := engine.NewServer(cfg, nil, role, pools...)
		if err != nil {
			return err
		}
		return runUntil(ctx, srv, cfg.ShutdownTimeout)
	}
	return fmt.Errorf("-mode %q: not available with -addrs", o.mode)
}

// runUntil runs srv until ctx ends; it then stops as Server.Run does
// (running handlers get grace, then go back to their queues).
func runUntil(ctx context.Context, srv *engine.Server, _ time.Duration) error {
	return srv.Run(ctx)
}
