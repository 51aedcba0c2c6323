package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// openEngine opens the engine implementation on the test server in a
// fresh namespace, and deletes its keys at the end.
func openEngine(tb testing.TB) *engineImpl {
	tb.Helper()
	e := &engineImpl{name: "engine"}
	env := Env{Addr: testRedis.Addr, Namespace: fmt.Sprintf("bqb-test-%d", time.Now().UnixNano()), Logf: tb.Logf}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Open(ctx, env); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		a := NewAdmin(testRedis.Addr)
		defer a.Close()
		if _, err := a.DeleteMatching(e.KeyPatterns()); err != nil {
			tb.Error(err)
		}
		e.Close()
	})
	return e
}

// TestEngineConsumeMaxRunning: Consume with MaxRunning gives the consumed
// queue that limit in Redis, and its tasks are claimed under it (each
// takes a slot); without MaxRunning the queue has no limit.
func TestEngineConsumeMaxRunning(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{0, e2eLimitMaxRunning} {
		e := openEngine(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		tr := newTracker(1)
		stop, err := e.Consume(ctx, ConsumeConfig{Workers: 2, Dispatchers: 1, MaxRunning: limit}, tr.handle)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Enqueue(ctx, Task{ID: "0", Payload: []byte("p")}); err != nil {
			t.Fatal(err)
		}
		err = tr.wait(ctx, 20*time.Second, time.Time{})
		if serr := stop(); err == nil {
			err = serr
		}
		if err != nil {
			t.Fatal(err)
		}
		c, err := redis.DialContext(ctx, "tcp", testRedis.Addr)
		if err != nil {
			t.Fatal(err)
		}
		got, err := redis.Int(c.Do("HGET", e.keys.Limit("default"), "max_running"))
		if limit == 0 {
			if err != redis.ErrNil {
				t.Errorf("no MaxRunning: limit %d (%v), want none", got, err)
			}
		} else if err != nil || got != limit {
			t.Errorf("MaxRunning %d: the queue's limit is %d (%v)", limit, got, err)
		}
		slots, err := redis.Int(c.Do("EXISTS", e.keys.Slots("default")))
		if err != nil || (slots == 1) != (limit > 0) {
			t.Errorf("MaxRunning %d: slot counter exists=%d (%v): tasks must take a slot exactly when limited", limit, slots, err)
		}
		c.Close()
		cancel()
	}
}
