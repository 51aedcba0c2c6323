package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
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
			var allDone chan struct{} // closed by the n-th run of an iteration
			mux := NewMux()
			mux.HandleFunc("t", func(ctx context.Context, t *Task) error {
				if done.Add(1) == n {
					close(allDone)
				}
				return nil
			})
			e.cfg.Concurrency = slots
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				done.Store(0)
				allDone = make(chan struct{})
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
				w, _ := newWorker(e.pool, e.cfg, mux)
				b.StartTimer()
				stop := runBackground(b, w.Run)
				<-allDone
				b.StopTimer()
				stop()
				if os.Getenv("BENCH_STATS") != "" {
					info, _ := redis.String(e.admin(b).Do("INFO", "commandstats"))
					b.Log(commandsPerTask(info, n))
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tasks/s")
		})
	}
}

// BenchmarkGroupCommitLatency: the time from a handler's return to its
// result being recorded (the EventFinished the worker sends after the
// EXEC), with group commit at its 1 ms window and without it, for 16
// slots running handlers of 0–2 ms from a deep queue. Reported: the mean
// and the 99th percentile in µs, and tasks/s.
func BenchmarkGroupCommitLatency(b *testing.B) {
	for _, window := range []time.Duration{time.Millisecond, -1} {
		name := map[bool]string{true: "window1ms", false: "off"}[window > 0]
		b.Run(name, func(b *testing.B) {
			e := privateEnv(b)
			const n = 5000
			var mu sync.Mutex
			returned := map[string]time.Time{}
			var lats []time.Duration
			var done atomic.Int64
			var allDone chan struct{} // closed by the n-th result of an iteration
			e.cfg.Concurrency = 16
			e.cfg.Advanced.GroupCommitWindow = window
			e.cfg.Observer = ObserverFunc(func(ev Event) {
				if ev.Kind != EventFinished {
					return
				}
				now := time.Now()
				mu.Lock()
				if t, ok := returned[ev.TaskID]; ok {
					lats = append(lats, now.Sub(t))
				}
				mu.Unlock()
				if done.Add(1) == n {
					close(allDone)
				}
			})
			mux := NewMux()
			mux.HandleFunc("t", func(ctx context.Context, t *Task) error {
				// real time: handlers of 0–2 ms are the workload whose
				// result latency is measured.
				time.Sleep(time.Duration(rand.Int64N(int64(2 * time.Millisecond))))
				mu.Lock()
				returned[t.ID] = time.Now()
				mu.Unlock()
				return nil
			})
			var elapsed time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				done.Store(0)
				allDone = make(chan struct{})
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
				w, _ := newWorker(e.pool, e.cfg, mux)
				b.StartTimer()
				t0 := time.Now()
				stop := runBackground(b, w.Run)
				<-allDone
				elapsed += time.Since(t0)
				b.StopTimer()
				stop()
				b.StartTimer()
			}
			sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
			var sum time.Duration
			for _, l := range lats {
				sum += l
			}
			if len(lats) > 0 {
				b.ReportMetric(float64(sum.Microseconds())/float64(len(lats)), "mean-µs")
				b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds()), "p99-µs")
			}
			b.ReportMetric(float64(n*b.N)/elapsed.Seconds(), "tasks/s")
		})
	}
}

// commandsPerTask renders INFO commandstats as commands per task, in all
// and by command (those at 0.01 or more), leaving out the harness's own.
func commandsPerTask(info string, n int) string {
	type kv struct {
		k string
		v float64
	}
	var all []kv
	total := 0.0
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_")), ":calls=")
		if !ok || strings.Contains(name, "|") || name == "info" || name == "auth" || name == "hello" {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		c, err := strconv.Atoi(calls)
		if err != nil {
			continue
		}
		v := float64(c) / float64(n)
		total += v
		if v >= 0.01 {
			all = append(all, kv{name, v})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v })
	var sb strings.Builder
	fmt.Fprintf(&sb, "commands per task %.2f:", total)
	for _, x := range all {
		fmt.Fprintf(&sb, " %s %.2f", x.k, x.v)
	}
	return sb.String()
}
