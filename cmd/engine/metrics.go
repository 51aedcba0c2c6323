package main

import (
	"net/http"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/metrics/prometheus"
)

// metricsHandler returns the handler of /metrics for a process that runs
// with cfg, reading the queue gauges and the workers through in (every
// lane of the namespace), and adds its collector to cfg.Observer (keeping
// any observer already set). Call it before engine.NewServer so the
// server's parts report to it. The handler reads the queue gauges from
// Redis at most once per five seconds, whatever the number of scrapes.
func metricsHandler(in *engine.Inspector, cfg *engine.Config) http.Handler {
	col := prometheus.New(prometheus.Options{Inspector: in})
	if prev := cfg.Observer; prev != nil {
		cfg.Observer = engine.ObserverFunc(func(e engine.Event) { prev.Observe(e); col.Observe(e) })
	} else {
		cfg.Observer = col
	}
	return col.Handler()
}
