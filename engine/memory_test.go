package engine

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// configSet sets Redis settings through e's admin connection.
func (e *env) configSet(t *testing.T, kv ...string) {
	t.Helper()
	c := e.admin(t)
	for i := 0; i+1 < len(kv); i += 2 {
		if _, err := c.Do("CONFIG", "SET", kv[i], kv[i+1]); err != nil {
			t.Fatalf("CONFIG SET %s %s: %v", kv[i], kv[i+1], err)
		}
	}
}

// TestEnqueueOnFullRedis: a producer on a full Redis, 7 or a real 2.4,
// gets ErrFull (not ErrUncertain: the server answered), and nothing of
// the task is written; once memory is freed the same call goes through.
func TestEnqueueOnFullRedis(t *testing.T) {
	t.Parallel()
	for name, start := range map[string]func(testing.TB, ...redistest.Option) *redistest.Server{
		"redis7": redistest.Start, "redis24": redistest.Start24,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, start(t, redistest.Private()))
			c := e.client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// A first enqueue makes the namespace's one-off keys.
			if _, err := c.Enqueue(ctx, "warm", nil); err != nil {
				t.Fatal(err)
			}
			before := e.keyCount(t)
			e.configSet(t, "maxmemory-policy", "noeviction", "maxmemory", "1")
			for _, delay := range []time.Duration{0, time.Hour} {
				_, err := c.Enqueue(ctx, "mail", []byte("x"), In(delay), TaskID("full-"+delay.String()))
				if !errors.Is(err, ErrFull) || errors.Is(err, ErrUncertain) {
					t.Fatalf("Enqueue (in %v) on a full Redis: %v; want ErrFull and not ErrUncertain", delay, err)
				}
			}
			if n := e.keyCount(t); n != before {
				t.Fatalf("the namespace has %d keys after the refused enqueues, %d before: something was written", n, before)
			}
			e.configSet(t, "maxmemory", "0")
			if _, err := c.Enqueue(ctx, "mail", []byte("x"), TaskID("full-0s")); err != nil {
				t.Fatalf("Enqueue once memory was freed: %v", err)
			}
		})
	}
}

func (e *env) keyCount(t *testing.T) int {
	t.Helper()
	keys, err := redis.Strings(e.admin(t).Do("KEYS", "{"+e.ns+"}:*"))
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

// TestRunChecksMemoryPolicy: Server.Run refuses a Redis that evicts any
// key when full unless Config.AllowEviction; the start-up look warns
// once about what a volatile policy evicts, and goes on where CONFIG is
// not to be had.
func TestRunChecksMemoryPolicy(t *testing.T) {
	t.Parallel()
	look := func(t *testing.T, e *env, allow bool) (string, error) {
		logs := &lockedBuffer{}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := checkMemoryPolicy(ctx, e.pool, allow, slog.New(slog.NewTextHandler(logs, nil)))
		return logs.String(), err
	}
	t.Run("allkeys", func(t *testing.T) {
		t.Parallel()
		e := privateEnv(t)
		e.configSet(t, "maxmemory", "1000000000", "maxmemory-policy", "allkeys-lru")
		s, err := newLaneServer(e.pool, e.cfg, NewMux(), AllRoles)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Run(context.Background()); !errors.Is(err, ErrEviction) || !strings.Contains(err.Error(), "allkeys-lru") {
			t.Fatalf("Run on allkeys-lru: %v; want ErrEviction naming the policy", err)
		}
		logs, err := look(t, e, true)
		if err != nil || !strings.Contains(logs, "AllowEviction") {
			t.Fatalf("allkeys-lru with AllowEviction: %v, logs %q; want a start with a warning", err, logs)
		}
	})
	t.Run("volatile", func(t *testing.T) {
		t.Parallel()
		e := privateEnv(t)
		e.configSet(t, "maxmemory", "1000000000", "maxmemory-policy", "volatile-lru")
		logs, err := look(t, e, false)
		if err != nil || strings.Count(logs, "heartbeat") != 1 || strings.Count(logs, "\n") != 1 {
			t.Fatalf("volatile-lru: %v, logs %q; want one warning naming the heartbeat", err, logs)
		}
	})
	t.Run("noeviction", func(t *testing.T) {
		t.Parallel()
		e := privateEnv(t)
		e.configSet(t, "maxmemory", "1000000000", "maxmemory-policy", "noeviction")
		logs, err := look(t, e, false)
		if err != nil || logs != "" {
			t.Fatalf("noeviction: %v, logs %q; want a silent start", err, logs)
		}
		m, err := inspectorOf(t, e).MemoryPolicy(context.Background())
		if err != nil || m.MaxMemory != 1000000000 || m.Policy != "noeviction" || m.Evicts() {
			t.Fatalf("MemoryPolicy: %+v, %v", m, err)
		}
	})
	t.Run("unknown", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, redistest.Mini(t)) // miniredis has no CONFIG
		logs, err := look(t, e, false)
		if err != nil || !strings.Contains(logs, "memory policy is unknown") {
			t.Fatalf("CONFIG refused: %v, logs %q; want a start and one note", err, logs)
		}
	})
}

// inspectorOf is an Inspector over e's pool and config.
func inspectorOf(t *testing.T, e *env) *laneInspector {
	t.Helper()
	in, err := newLaneInspector(e.pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return in
}
