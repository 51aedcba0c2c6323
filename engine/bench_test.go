package engine

import (
	"context"
	"fmt"
	"github.com/bucketq/bucketq/internal/clocktest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/gomodule/redigo/redis"
	"testing"
	"time"
)

// benchDispatch seeds n due tasks and times one dispatcher moving them
// all. spread 0 puts them in one bucket; otherwise over that span at 1 ms
// resolution, so most buckets hold one task.
func benchDispatch(b *testing.B, n int, spread time.Duration, dispatchers int) {
	e := privateEnv(b) // it flushes the server and resets its statistics
	e.cfg.Advanced.Resolution = time.Millisecond
	// Time the engine, not the test guard: raw connections.
	e.pool = &redis.Pool{MaxIdle: 16, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", e.srv.Addr) }}
	var cpu cpuTimes
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e.ns = e.ns[:9] + string(rune('a'+i%26))
		e.cfg.Namespace = e.ns
		base := time.Now().Add(time.Hour)
		scheduleMany(b, e, n, base, spread)
		e.cfg.Advanced.Clock = clocktest.Offset(2 * time.Hour)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		// The dispatchers say what they moved; the last move closes allMoved.
		var moved atomic.Int64
		var once sync.Once
		allMoved := make(chan struct{})
		e.cfg.Observer = ObserverFunc(func(ev Event) {
			if ev.Kind == EventDispatched && moved.Add(int64(ev.Moved)) >= int64(n) {
				once.Do(func() { close(allMoved) })
			}
		})
		e.admin(b).Do("CONFIG", "RESETSTAT")
		cpu0 := cpuNow(b, e)
		b.StartTimer()
		for j := 0; j < dispatchers; j++ {
			d, _ := newDispatcher(e.pool, e.cfg)
			go func() { _ = d.Run(ctx); done <- struct{}{} }()
		}
		<-allMoved
		b.StopTimer()
		cpu.add(cpuNow(b, e).sub(cpu0))
		if os.Getenv("BENCH_STATS") != "" {
			info, _ := redis.String(e.admin(b).Do("INFO", "commandstats"))
			b.Log(info)
		}
		cancel()
		for j := 0; j < dispatchers; j++ {
			<-done
		}
		e.admin(b).Do("FLUSHALL")
		e.cfg.Advanced.Clock = nil
		b.StartTimer()
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tasks/s")
	cpu.report(b, n*b.N)
}

// cpuTimes is CPU time spent by this process (the client) and by the
// server, to tell which side a benchmark is bound by.
type cpuTimes struct{ client, server time.Duration }

// cpuNow reads this process's CPU time (getrusage) and the server's
// (INFO's used_cpu_user + used_cpu_sys).
func cpuNow(b *testing.B, e *env) cpuTimes {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	t := cpuTimes{client: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
	info, err := redis.String(e.admin(b).Do("INFO"))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			t.server += time.Duration(f * float64(time.Second))
		}
	}
	return t
}

func (t cpuTimes) sub(o cpuTimes) cpuTimes { return cpuTimes{t.client - o.client, t.server - o.server} }
func (t *cpuTimes) add(o cpuTimes)         { t.client += o.client; t.server += o.server }

// report reports the CPU time per task on each side, in microseconds.
func (t cpuTimes) report(b *testing.B, tasks int) {
	b.ReportMetric(float64(t.client.Microseconds())/float64(tasks), "client-µs/task")
	b.ReportMetric(float64(t.server.Microseconds())/float64(tasks), "server-µs/task")
}

func BenchmarkDispatchBurst100k(b *testing.B)  { benchDispatch(b, 100_000, 0, 1) }
func BenchmarkDispatchSpread100k(b *testing.B) { benchDispatch(b, 100_000, time.Hour, 1) }
func BenchmarkDispatchSpread100k4(b *testing.B) {
	benchDispatch(b, 100_000, time.Hour, 4)
}

// benchEnqueue times single enqueues by one producer over raw
// connections (the engine, not the test guard), each due at due(i); with
// BENCH_STATS set it logs the commands the server ran per enqueue.
func benchEnqueue(b *testing.B, due func(i int) time.Time) {
	e := privateEnv(b)
	e.pool = &redis.Pool{MaxIdle: 16, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", e.srv.Addr) }}
	c := e.client(b)
	// A deadline, as a caller sets one (the bench harness does).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	payload := make([]byte, 100)
	e.admin(b).Do("CONFIG", "RESETSTAT")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var err error
		if at := due(i); at.IsZero() {
			_, err = c.Enqueue(ctx, "t", payload)
		} else {
			_, err = c.Enqueue(ctx, "t", payload, At(at))
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportCommands(b, e, b.N)
}

// reportCommands reports the commands the server ran per task (n tasks
// since the last CONFIG RESETSTAT), from INFO commandstats.
func reportCommands(b *testing.B, e *env, n int) {
	info, err := redis.String(e.admin(b).Do("INFO", "commandstats"))
	if err != nil {
		b.Fatal(err)
	}
	total, execs := 0, 0
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_") || strings.HasPrefix(line, "cmdstat_info") || strings.HasPrefix(line, "cmdstat_config") {
			continue
		}
		f := strings.SplitN(line, "calls=", 2)
		if len(f) < 2 {
			continue
		}
		var calls int
		fmt.Sscanf(f[1], "%d", &calls)
		total += calls
		if strings.HasPrefix(line, "cmdstat_exec:") {
			execs = calls
		}
	}
	b.ReportMetric(float64(total)/float64(n), "cmds/op")
	if execs > 0 {
		b.ReportMetric(float64(n)/float64(execs), "tasks/exec")
	}
	if os.Getenv("BENCH_STATS") != "" {
		b.Log(info)
	}
}

// BenchmarkEnqueueDelayed: one delayed task per call, as a producer adds
// them (each due in a second of its own, an hour from now).
func BenchmarkEnqueueDelayed(b *testing.B) {
	base := time.Now().Add(time.Hour)
	benchEnqueue(b, func(i int) time.Time { return base.Add(time.Duration(i%3600) * time.Second) })
}

// BenchmarkEnqueueDelayedSame: one delayed task per call, all due at the
// same time (one bucket).
func BenchmarkEnqueueDelayedSame(b *testing.B) {
	at := time.Now().Add(time.Hour)
	benchEnqueue(b, func(int) time.Time { return at })
}

// BenchmarkEnqueueDelayed8: delayed single enqueues from 8 producers on
// one Client (group commit shares their transactions; cmds/op shows it).
// /alone turns group commit off (EnqueueGroupMax 1).
func BenchmarkEnqueueDelayed8(b *testing.B) {
	b.Run("group", func(b *testing.B) { benchEnqueue8(b, 0) })
	b.Run("alone", func(b *testing.B) { benchEnqueue8(b, 1) })
}

func benchEnqueue8(b *testing.B, groupMax int) {
	e := privateEnv(b)
	e.pool = &redis.Pool{MaxIdle: 16, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", e.srv.Addr) }}
	e.cfg.Advanced.EnqueueGroupMax = groupMax
	c := e.client(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	payload := make([]byte, 100)
	base := time.Now().Add(time.Hour)
	e.admin(b).Do("CONFIG", "RESETSTAT")
	b.ReportAllocs()
	b.SetParallelism(4) // 8 goroutines on 2 cores
	b.ResetTimer()
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			if _, err := c.Enqueue(ctx, "t", payload, At(base.Add(time.Duration(i%3600)*time.Second))); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	reportCommands(b, e, b.N)
}

// BenchmarkEnqueueDue: one task due now per call.
func BenchmarkEnqueueDue(b *testing.B) {
	benchEnqueue(b, func(int) time.Time { return time.Time{} })
}
