package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// lostExecConn runs hook just before the first MULTI is sent, and loses
// the reply of the round trip that carries the first EXEC: the server ran
// it, then the connection closes.
type lostExecConn struct {
	redis.Conn
	hook     func()
	execSent bool
	dead     bool
}

func (c *lostExecConn) Send(name string, args ...interface{}) error {
	if c.dead {
		return errInjected
	}
	if name == "MULTI" && c.hook != nil {
		c.hook()
		c.hook = nil
	}
	if name == "EXEC" {
		c.execSent = true
	}
	return c.Conn.Send(name, args...)
}

func (c *lostExecConn) Do(name string, args ...interface{}) (interface{}, error) {
	return c.DoContext(context.Background(), name, args...)
}

func (c *lostExecConn) DoContext(ctx context.Context, name string, args ...interface{}) (interface{}, error) {
	if c.dead {
		return nil, errInjected
	}
	rep, err := redis.DoContext(c.Conn, ctx, name, args...)
	if c.execSent {
		c.dead = true
		c.Conn.Close()
		return nil, errInjected
	}
	return rep, err
}

func (c *lostExecConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	if c.dead {
		return nil, errInjected
	}
	return redis.ReceiveContext(c.Conn, ctx)
}

// lostExecMover is the store, whose first move runs on a lostExecConn
// that makes the ready list a string just before the MULTI.
type lostExecMover struct {
	*buckets.Store
	once  sync.Once
	fired chan struct{}
	hook  func()
}

func (m *lostExecMover) MoveDue(ctx context.Context, conns []redis.Conn, o buckets.MoveOpts) (buckets.MoveResult, error) {
	first := false
	m.once.Do(func() { first = true })
	if first {
		lc := &lostExecConn{Conn: conns[0], hook: m.hook}
		conns = append([]redis.Conn{lc}, conns[1:]...)
		defer func() {
			if lc.dead {
				close(m.fired)
			}
		}()
	}
	return m.Store.MoveDue(ctx, conns, o)
}

// A move whose push failed on a ready list made a string between its read
// and its EXEC, and whose EXEC reply was lost, removed its bucket: the
// dispatcher settles it on a fresh connection, setting the string aside
// and placing the tasks again.
func TestDispatcherSettlesMoveWithLostExecReply(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	const q = "settle"
	want := scheduleMany(t, e, 20, time.Now().Add(-time.Minute), 0, q)
	d, err := newDispatcher(e.pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	admin := e.admin(t)
	ready := d.store.Keys.Ready(q)
	m := &lostExecMover{Store: d.store, fired: make(chan struct{}), hook: func() {
		if _, err := admin.Do("SET", ready, "not a list"); err != nil {
			t.Error(err)
		}
	}}
	d.moves = m
	stop := runBackground(t, d.Run)
	select {
	case <-m.fired:
	case <-time.After(outcomeWait):
		t.Fatal("the move with the lost reply did not run")
	}
	waitFor(t, outcomeWait, "the tasks in the ready list", func() bool {
		n, _ := redis.Int(admin.Do("LLEN", ready))
		return n >= len(want)
	})
	stop()
	exactlyOnce(t, e.readyIDs(t, q), want)
	if v, err := redis.String(admin.Do("GET", d.store.Keys.Quarantine(ready))); err != nil || v != "not a list" {
		t.Fatalf("quarantine = %q (%v); want the string set aside", v, err)
	}
}

// An enqueue whose push fails on a ready list made a string just before
// its MULTI, and whose EXEC reply is lost, wrote its records and placed
// none of them: the Client reports ErrUncertain and, on a fresh connection
// within the caller's deadline, sets the string aside and places the
// written tasks, so the batch runs whole.
func TestEnqueueSettlesLostExecReply(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	const q = "settle-enqueue"
	admin := e.admin(t)
	keys, err := buckets.NewKeys(e.cfg.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	ready := keys.Ready(q)
	var first sync.Once
	pool := &redis.Pool{Dial: func() (redis.Conn, error) {
		c := e.pool.Get()
		var lc redis.Conn = c
		first.Do(func() {
			lc = &lostExecConn{Conn: c, hook: func() {
				if _, err := admin.Do("SET", ready, "not a list"); err != nil {
					t.Error(err)
				}
			}}
		})
		return lc, nil
	}}
	t.Cleanup(func() { pool.Close() })
	c, err := newLaneClient(pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	batch := []NewTask{{Type: "t", Options: []Option{Queue(q)}}, {Type: "t", Options: []Option{Queue(q)}}, {Type: "t", Options: []Option{Queue(q)}}}
	ids := map[string]bool{}
	for i := range batch {
		id := fmt.Sprintf("settle-%d", i)
		ids[id] = true
		batch[i].Options = append(batch[i].Options, TaskID(id))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.EnqueueBatch(ctx, batch); !errors.Is(err, ErrUncertain) {
		t.Fatalf("EnqueueBatch over a lost EXEC reply = %v, want ErrUncertain", err)
	}
	exactlyOnce(t, e.readyIDs(t, q), ids)
	if v, err := redis.String(admin.Do("GET", keys.Quarantine(ready))); err != nil || v != "not a list" {
		t.Fatalf("quarantine = %q (%v); want the string set aside", v, err)
	}
}
