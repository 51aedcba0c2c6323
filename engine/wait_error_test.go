package engine

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// downConn answers every BLPOP with an error reply that is not about a
// key's type, as a Redis Cluster does while it is down, and counts the
// WATCH and TYPE commands on the keys blocked on (the first commands of a
// set-aside).
type downConn struct {
	redis.Conn
	refusedWake, refusedNotify, touched *atomic.Int32
}

func (c *downConn) look(name string, args []interface{}) {
	if !strings.EqualFold(name, "WATCH") && !strings.EqualFold(name, "TYPE") {
		return
	}
	for _, a := range args {
		if k, _ := a.(string); strings.HasSuffix(k, "}:wake") || strings.Contains(k, "}:n:") {
			c.touched.Add(1)
		}
	}
}

func (c *downConn) Send(name string, args ...interface{}) error {
	c.look(name, args)
	return c.Conn.Send(name, args...)
}

func (c *downConn) Do(name string, args ...interface{}) (interface{}, error) {
	return c.DoContext(context.Background(), name, args...)
}

func (c *downConn) DoContext(ctx context.Context, name string, args ...interface{}) (interface{}, error) {
	if strings.EqualFold(name, "BLPOP") {
		if k, _ := args[0].(string); strings.HasSuffix(k, "}:wake") {
			c.refusedWake.Add(1)
		} else {
			c.refusedNotify.Add(1)
		}
		return nil, redis.Error("CLUSTERDOWN The cluster is down")
	}
	c.look(name, args)
	return redis.DoContext(c.Conn, ctx, name, args...)
}

func (c *downConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(c.Conn, ctx)
}

// An idle wait that fails with an error reply other than a wrong type
// (CLUSTERDOWN, LOADING, a refused command) backs off and waits again: it
// does not take the wake-up list for a key of the wrong type, whose
// set-aside would WATCH a list that clients block on (which Redis 2.4
// does not invalidate on a push handed to a blocked client).
func TestIdleWaitServerErrorIsNotWrongType(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	var wake, notify, touched atomic.Int32
	pool := &redis.Pool{MaxIdle: 8, Dial: func() (redis.Conn, error) {
		c, err := e.pool.Dial()
		if err != nil {
			return nil, err
		}
		return &downConn{Conn: c, refusedWake: &wake, refusedNotify: &notify, touched: &touched}, nil
	}}
	t.Cleanup(func() { pool.Close() }) // after the worker and dispatcher stop
	w, err := newWorker(pool, e.cfg, NewMux())
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, w.Run)
	d, err := newDispatcher(pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, d.Run)
	waitFor(t, time.Minute, "refused idle waits of the worker and the dispatcher", func() bool {
		return wake.Load() >= 2 && notify.Load() >= 2
	})
	if n := touched.Load(); n != 0 {
		t.Errorf("%d WATCH or TYPE commands on the wake-up lists after CLUSTERDOWN replies to BLPOP: taken for keys of the wrong type", n)
	}
}
