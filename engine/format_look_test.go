package engine

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// lookCutConn cuts its connection at the WATCH that opens a look at the
// namespace's format mark, while armed: the look's own bound
// (buckets.FormatLookTimeout) cutting a read short, on a slow machine,
// leaves the connection as unusable as this.
type lookCutConn struct {
	redis.Conn
	armed *atomic.Bool
	dead  bool
}

func (c *lookCutConn) cut(name string, args []interface{}) bool {
	if c.dead {
		return true
	}
	if strings.EqualFold(name, "WATCH") && len(args) > 0 {
		if k, _ := args[0].(string); strings.HasSuffix(k, "}:format") && c.armed.CompareAndSwap(true, false) {
			c.dead = true
			c.Conn.Close()
		}
	}
	return c.dead
}

func (c *lookCutConn) Send(name string, args ...interface{}) error {
	if c.cut(name, args) {
		return context.DeadlineExceeded
	}
	return c.Conn.Send(name, args...)
}

func (c *lookCutConn) Do(name string, args ...interface{}) (interface{}, error) {
	return c.DoContext(context.Background(), name, args...)
}

func (c *lookCutConn) DoContext(ctx context.Context, name string, args ...interface{}) (interface{}, error) {
	if c.cut(name, args) {
		return nil, context.DeadlineExceeded
	}
	return redis.DoContext(c.Conn, ctx, name, args...)
}

func (c *lookCutConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	if c.dead {
		return nil, context.DeadlineExceeded
	}
	return redis.ReceiveContext(c.Conn, ctx)
}

func (c *lookCutConn) Err() error {
	if c.dead {
		return context.DeadlineExceeded
	}
	return c.Conn.Err()
}

// lookCutPool is e's pool with the first look at the format mark cut.
func lookCutPool(e *env) (*redis.Pool, *atomic.Bool) {
	armed := &atomic.Bool{}
	armed.Store(true)
	return &redis.Pool{MaxIdle: 4, Dial: func() (redis.Conn, error) {
		c, err := e.pool.Dial()
		if err != nil {
			return nil, err
		}
		return &lookCutConn{Conn: c, armed: armed}, nil
	}}, armed
}

// A look at the format mark that fails costs the storage every release
// reads, never the enqueue it comes before: when the look's failure left
// its connection unusable, the enqueue (its context has no deadline) goes
// on a fresh one instead of failing with the look's "context deadline
// exceeded".
func TestFormatLookFailureSparesEnqueue(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		for name, enqueue := range map[string]func(c *Client) error{
			"batch": func(c *Client) error {
				_, err := c.EnqueueBatch(context.Background(), []NewTask{{Type: "a"}, {Type: "b"}})
				return err
			},
			"one": func(c *Client) error {
				_, err := c.Enqueue(context.Background(), "a", nil)
				return err
			},
		} {
			pool, armed := lookCutPool(e)
			defer pool.Close()
			e.cfg.Namespace = e.ns + name
			c, err := NewClient(pool, e.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := enqueue(c); err != nil {
				t.Errorf("%s: enqueue after a format look that broke its connection: %v", name, err)
			}
			if armed.Load() {
				t.Errorf("%s: the format look was not cut: the test did not exercise it", name)
			}
		}
	})
}

// The same for a worker's first heartbeat: the worker registers at once,
// not after a failed beat and a backoff.
func TestFormatLookFailureSparesHeartbeat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	pool, armed := lookCutPool(e)
	defer pool.Close()
	w, err := NewWorker(pool, e.cfg, NewMux())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.hb.beat(ctx); err != nil {
		t.Errorf("first heartbeat after a format look that broke its connection: %v", err)
	}
	if armed.Load() {
		t.Errorf("the format look was not cut: the test did not exercise it")
	}
}
