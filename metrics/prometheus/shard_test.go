package prometheus_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/metrics/prometheus"
	"github.com/gomodule/redigo/redis"
)

// TestShardGauges: with an Inspector over several lanes as its source, the
// queue gauges span every lane; a nil Inspector means no Redis gauges.
func TestShardGauges(t *testing.T) {
	sa := redistest.Start(t, redistest.Private())
	sb := redistest.Start(t, redistest.Private())
	cfg := baseConfig(t, sa)
	pools := []*redis.Pool{sa.Pool(t), sb.Pool(t), sa.Pool(t)}
	sc, err := engine.NewClient(cfg, pools...)
	if err != nil {
		t.Fatal(err)
	}
	in, err := engine.NewInspector(cfg, pools...)
	if err != nil {
		t.Fatal(err)
	}
	lanes := map[int]bool{}
	for i := range 12 {
		var opts []engine.Option
		if i%3 == 0 {
			opts = append(opts, engine.In(time.Hour))
		}
		ti, err := sc.Enqueue(t.Context(), "t", nil, opts...)
		if err != nil {
			t.Fatal(err)
		}
		lanes[sc.LaneOf(ti.ID)] = true
	}
	if len(lanes) != 3 {
		t.Fatalf("tasks in lanes %v, want three", lanes)
	}
	col := prometheus.New(prometheus.Options{Inspector: in})
	srv := httptest.NewServer(col.Handler())
	defer srv.Close()
	fams := scrape(t, srv.URL)
	if got := value(fams, "bucketq_queue_tasks", "queue", "default", "state", "ready"); got != 8 {
		t.Errorf("ready over the lanes: %v, want 8", got)
	}
	if got := value(fams, "bucketq_queue_tasks", "queue", "default", "state", "scheduled"); got != 4 {
		t.Errorf("scheduled over the lanes: %v, want 4", got)
	}
	var nilIn *engine.Inspector
	for _, src := range []prometheus.Source{nilIn} {
		none := httptest.NewServer(prometheus.New(prometheus.Options{Inspector: src}).Handler())
		if _, ok := scrape(t, none.URL)["bucketq_queue_tasks"]; ok {
			t.Errorf("a nil %T reads gauges", src)
		}
		none.Close()
	}
}
