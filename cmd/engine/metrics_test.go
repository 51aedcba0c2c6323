package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/redistest"
)

// TestMetricsHandler: the handler the daemon mounts at /metrics counts
// what the parts built with the config it returns do, and reads the
// queue gauges from Redis.
func TestMetricsHandler(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pool := srv.Pool(t)
	ns := redistest.Namespace(t)
	t.Cleanup(func() { srv.Cleanup(t, ns) })
	cfg := engine.Config{Namespace: ns}
	in, err := engine.NewInspector(cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	h := metricsHandler(in, &cfg)
	if cfg.Observer == nil {
		t.Fatal("metricsHandler left no observer in the config")
	}
	client, err := engine.NewClient(cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Enqueue(t.Context(), "mail", nil); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	defer hs.Close()
	resp, err := http.Get(hs.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range []string{
		`bucketq_tasks_enqueued_total{queue="default",type="mail"} 1`,
		`bucketq_queue_tasks{queue="default",state="ready"} 1`,
		`bucketq_redis_stats_up 1`,
	} {
		if !strings.Contains(string(b), line+"\n") {
			t.Errorf("/metrics lacks %q:\n%s", line, b)
		}
	}
}
