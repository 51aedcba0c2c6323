package engine

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// BenchmarkWorkerThroughput: tasks/s one worker process runs no-op
// handlers from a full ready list (enqueueing not timed).
func BenchmarkWorkerThroughput(b *testing.B) {
	for _, slots := range []int{8, 64} {
		b.Run(map[int]string{8: "slots8", 64: "slots64"}[slots], func(b *testing.B) {
			e := privateEnv(b) // it resets the server's statistics
			e.pool = &redis.Pool{MaxIdle: 128, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", e.srv.Addr) }}
			const n = 20000
			var done atomic.Int64
			mux := NewMux()
			mux.HandleFunc("t", func(ctx context.Context, t *Task) error { done.Add(1); return nil })
			e.cfg.Concurrency = slots
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				done.Store(0)
				c := e.client(b)
				batch := make([]NewTask, 1000)
				for j := range batch {
					batch[j] = NewTask{Type: "t"}
				}
				for j := 0; j < n/1000; j++ {
					if _, err := c.EnqueueBatch(context.Background(), batch); err != nil {
						b.Fatal(err)
					}
				}
				e.admin(b).Do("CONFIG", "RESETSTAT")
				w, _ := NewWorker(e.pool, e.cfg, mux)
				b.StartTimer()
				stop := runBackground(b, w.Run)
				for done.Load() < n {
					time.Sleep(time.Millisecond)
				}
				b.StopTimer()
				stop()
				if os.Getenv("BENCH_STATS") != "" {
					info, _ := redis.String(e.admin(b).Do("INFO", "commandstats"))
					b.Log(info)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tasks/s")
		})
	}
}
