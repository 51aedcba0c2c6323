package engine

import (
	"context"
	"github.com/bucketq/bucketq/internal/clocktest"
	"os"

	"github.com/gomodule/redigo/redis"
	"testing"
	"time"
)

// benchDispatch seeds n due tasks and times one dispatcher moving them
// all. spread 0 puts them in one bucket; otherwise over that span at 1 ms
// resolution, so most buckets hold one task.
func benchDispatch(b *testing.B, n int, spread time.Duration, dispatchers int) {
	e := privateEnv(b) // it flushes the server and resets its statistics
	e.cfg.Resolution = time.Millisecond
	// Time the engine, not the test guard: raw connections.
	e.pool = &redis.Pool{MaxIdle: 16, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", e.srv.Addr) }}
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e.ns = e.ns[:9] + string(rune('a'+i%26))
		e.cfg.Namespace = e.ns
		base := time.Now().Add(time.Hour)
		scheduleMany(b, e, n, base, spread)
		e.cfg.Clock = clocktest.Offset(2 * time.Hour)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		e.admin(b).Do("CONFIG", "RESETSTAT")
		b.StartTimer()
		for j := 0; j < dispatchers; j++ {
			d, _ := NewDispatcher(e.pool, e.cfg)
			go func() { _ = d.Run(ctx); done <- struct{}{} }()
		}
		for e.zcard(b, "sched") > 0 {
			time.Sleep(time.Millisecond)
		}
		b.StopTimer()
		if os.Getenv("BENCH_STATS") != "" {
			info, _ := redis.String(e.admin(b).Do("INFO", "commandstats"))
			b.Log(info)
		}
		cancel()
		for j := 0; j < dispatchers; j++ {
			<-done
		}
		e.admin(b).Do("FLUSHALL")
		e.cfg.Clock = nil
		b.StartTimer()
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tasks/s")
}

func BenchmarkDispatchBurst100k(b *testing.B)  { benchDispatch(b, 100_000, 0, 1) }
func BenchmarkDispatchSpread100k(b *testing.B) { benchDispatch(b, 100_000, time.Hour, 1) }
func BenchmarkDispatchSpread100k4(b *testing.B) {
	benchDispatch(b, 100_000, time.Hour, 4)
}

// BenchmarkEnqueueDelayed: one delayed task per call, as a producer adds
// them (each due in a second of its own, an hour from now).
func BenchmarkEnqueueDelayed(b *testing.B) {
	e := privateEnv(b)
	c := e.client(b)
	ctx := context.Background()
	base := time.Now().Add(time.Hour)
	payload := make([]byte, 100)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.EnqueueAt(ctx, base.Add(time.Duration(i%3600)*time.Second), "t", payload); err != nil {
			b.Fatal(err)
		}
	}
}
