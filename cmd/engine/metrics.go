package main

import (
	"net/http"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/metrics/prometheus"
	"github.com/gomodule/redigo/redis"
)

// metricsHandler returns the handler of /metrics for a process that runs
// with cfg over pool, and adds its collector to cfg.Observer (keeping any
// observer already set). Call it before engine.NewServer so the server's
// parts report to it. The handler reads the queue gauges from Redis at
// most once per five seconds, whatever the number of scrapes.
// shardedMetrics is metricsHandler over every lane of sc.
func shardedMetrics(sc *engine.ShardedClient, cfg *engine.Config) http.Handler {
	col := prometheus.New(prometheus.Options{Client: sc})
	cfg.Observer = engine.Observers(cfg.Observer, col)
	return col.Handler()
}

func metricsHandler(pool *redis.Pool, cfg *engine.Config) (http.Handler, error) {
	client, err := engine.NewClient(pool, *cfg)
	if err != nil {
		return nil, err
	}
	col := prometheus.New(prometheus.Options{Client: client})
	cfg.Observer = engine.Observers(cfg.Observer, col)
	return col.Handler(), nil
}
