package main

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"
)

// openNaive opens a naive implementation on the test server in a fresh namespace.
func openNaive(tb testing.TB) *naive {
	tb.Helper()
	n := &naive{}
	env := Env{Addr: testRedis.Addr, Namespace: fmt.Sprintf("bqb-test-%d", time.Now().UnixNano()),
		Logf: tb.Logf}
	if err := n.Open(context.Background(), env); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		a := NewAdmin(testRedis.Addr)
		defer a.Close()
		if _, err := a.DeleteMatching(n.KeyPatterns()); err != nil {
			tb.Error(err)
		}
		n.Close()
	})
	return n
}

// seedNaive puts k tasks, all due, in the delayed ZSET.
func seedNaive(tb testing.TB, n *naive, k int) {
	tb.Helper()
	c := n.pool.Get()
	defer c.Close()
	ts := make([]Task, k)
	due := time.Now().Add(-time.Minute)
	for i := range ts {
		ts[i] = Task{ID: strconv.Itoa(i), Payload: make([]byte, 100), Due: due}
	}
	if err := n.zaddAll(c, n.delayed, ts); err != nil {
		tb.Fatal(err)
	}
}

// TestNaiveMoveOne checks the poller step: claims the earliest due task
// once, never a task that is not due.
func TestNaiveMoveOne(t *testing.T) {
	n := openNaive(t)
	ctx := context.Background()
	now := time.Now()
	for i, d := range []time.Duration{-2 * time.Second, -time.Second, time.Hour} {
		if err := n.Schedule(ctx, Task{ID: strconv.Itoa(i), Payload: []byte("p"), Due: now.Add(d)}); err != nil {
			t.Fatal(err)
		}
	}
	c := n.pool.Get()
	defer c.Close()
	for want := 1; want <= 3; want++ {
		found, err := n.moveOne(c, naiveScore(now))
		if err != nil {
			t.Fatal(err)
		}
		if found != (want <= 2) {
			t.Fatalf("step %d: found=%v", want, found)
		}
	}
	got, err := n.ReadyCount(ctx)
	if err != nil || got != 2 {
		t.Fatalf("ready %d %v, want 2", got, err)
	}
}

// BenchmarkNaiveMoveOne measures one claim-and-move step of the naive
// poller (ZRANGEBYSCORE LIMIT 0 1, ZREM, RPUSH: three round trips) from a
// backlog of b.N due tasks.
func BenchmarkNaiveMoveOne(b *testing.B) {
	n := openNaive(b)
	seedNaive(b, n, b.N)
	c := n.pool.Get()
	defer c.Close()
	now := naiveScore(time.Now())
	b.ResetTimer()
	for range b.N {
		if found, err := n.moveOne(c, now); err != nil || !found {
			b.Fatalf("found=%v err=%v", found, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tasks/s")
}

// BenchmarkNaiveSchedule measures one ZADD through the pool.
func BenchmarkNaiveSchedule(b *testing.B) {
	n := openNaive(b)
	ctx := context.Background()
	due := time.Now().Add(time.Hour)
	payload := make([]byte, 100)
	b.ResetTimer()
	for i := range b.N {
		if err := n.Schedule(ctx, Task{ID: strconv.Itoa(i), Payload: payload, Due: due}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNaiveScheduleBatch100 measures a variadic ZADD of 100 tasks,
// reported per task.
func BenchmarkNaiveScheduleBatch100(b *testing.B) {
	n := openNaive(b)
	ctx := context.Background()
	due := time.Now().Add(time.Hour)
	ts := make([]Task, 100)
	for i := range ts {
		ts[i] = Task{Payload: make([]byte, 100), Due: due.Add(time.Duration(i) * time.Second)}
	}
	b.ResetTimer()
	for i := range b.N {
		for j := range ts {
			ts[j].ID = strconv.Itoa(i*100 + j)
		}
		if err := n.ScheduleBatch(ctx, ts); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*100)/b.Elapsed().Seconds(), "tasks/s")
}

// BenchmarkEncodeDecode measures the ID|payload framing used by the
// implementations that carry only a blob.
func BenchmarkEncodeDecode(b *testing.B) {
	t := Task{ID: "123456", Payload: make([]byte, 100)}
	for range b.N {
		if _, err := decodeTask(encodeTask(t)); err != nil {
			b.Fatal(err)
		}
	}
}
