package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// cutConn cuts a connection at the round trip that carries EXEC: with
// afterExec it lets the round trip complete at the server and drops the
// reply (the write happened, the client never heard); otherwise it fails
// the round trip without sending it (nothing happened). Either way the
// caller sees a broken connection after EXEC was handed to it. Sends are
// held back until the flush, so a cut round trip never reaches the server.
type cutConn struct {
	redis.Conn
	afterExec bool

	mu      sync.Mutex
	pending []redisCmd
	exec    bool // EXEC is among the pending sends
	cut     bool // the cut happened
	written bool // the cut round trip reached the server
}

type redisCmd struct {
	name string
	args []interface{}
}

func (c *cutConn) Send(cmd string, args ...interface{}) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return errInjected
	}
	if strings.EqualFold(cmd, "EXEC") {
		c.exec = true
	}
	c.pending = append(c.pending, redisCmd{cmd, args})
	return nil
}

func (c *cutConn) Do(cmd string, args ...interface{}) (interface{}, error) {
	return c.DoContext(context.Background(), cmd, args...)
}

// DoContext is Do bounded by ctx, which txn's round trips use.
func (c *cutConn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return nil, errInjected
	}
	pending, exec := c.pending, c.exec
	c.pending, c.exec = nil, false
	if exec && !c.afterExec {
		c.cut = true
		return nil, errInjected
	}
	for _, p := range pending {
		if err := c.Conn.Send(p.name, p.args...); err != nil {
			return nil, err
		}
	}
	rep, err := redis.DoContext(c.Conn, ctx, cmd, args...)
	if exec {
		c.cut = true
		c.written = err == nil
		return nil, errInjected
	}
	return rep, err
}

func (c *cutConn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return errInjected
	}
	return c.Conn.Err()
}

// cutPool is a pool whose connections are cutConns over e's pool.
func (e *env) cutPool(t *testing.T, afterExec bool, conns *[]*cutConn) *redis.Pool {
	p := &redis.Pool{Dial: func() (redis.Conn, error) {
		c := &cutConn{Conn: e.pool.Get(), afterExec: afterExec}
		*conns = append(*conns, c)
		return c, nil
	}}
	t.Cleanup(func() { p.Close() })
	return p
}

// count is how many times id appears in q's ready list.
func (e *env) count(t testing.TB, q, id string) int {
	n := 0
	for _, x := range e.readyIDs(t, q) {
		if x == id {
			n++
		}
	}
	return n
}

// The acceptance test of retry-safe enqueue: the connection dies right
// after EXEC is sent (once after the server ran it, once before it got
// there); the error is recognisably uncertain; a retry with the same id
// leaves exactly one task either way.
func TestTaskIDRetryAfterLostExec(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		retry := e.client(t)
		for _, after := range []bool{true, false} {
			var conns []*cutConn
			cut, err := newLaneClient(e.cutPool(t, after, &conns), e.cfg)
			if err != nil {
				t.Fatal(err)
			}
			id := fmt.Sprintf("order-%v", after)
			_, err = cut.Enqueue(ctx, "t", []byte("p"), TaskID(id))
			if !errors.Is(err, ErrUncertain) {
				t.Fatalf("after=%v: Enqueue over a cut connection = %v, want ErrUncertain", after, err)
			}
			// conns[0] carried the enqueue; a second one may have checked
			// the lost EXEC's ready list (Client.settleEnqueue).
			if len(conns) == 0 || conns[0].written != after {
				t.Fatalf("after=%v: the cut did not happen as planned (%d conns)", after, len(conns))
			}
			_, err = retry.Enqueue(ctx, "t", []byte("p"), TaskID(id))
			switch {
			case after && !errors.Is(err, ErrTaskExists):
				t.Fatalf("retry after a written EXEC = %v, want ErrTaskExists", err)
			case !after && err != nil:
				t.Fatalf("retry after an EXEC that never arrived = %v, want nil", err)
			}
			if n := e.count(t, "default", id); n != 1 {
				t.Fatalf("after=%v: %s is %d times in the ready list, want once", after, id, n)
			}
			if info, err := retry.Lookup(ctx, id); err != nil || info.State != StateReady {
				t.Fatalf("after=%v: Lookup = %+v, %v", after, info, err)
			}
		}
	})
}

// Crash points of the transaction with caller ids: a connection that dies
// after any number of commands, with or without the last reply, leaves all
// of the batch or nothing, and a retry with the same ids on a good
// connection then leaves each task exactly once.
func TestTaskIDAtEachCrashPoint(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		st := e.store(t)
		ctx := context.Background()
		now := time.Now().UnixMilli()
		for limit := 1; limit <= 24; limit++ {
			for _, lose := range []bool{false, true} {
				var recs []*buckets.Record
				var ids []string
				for i := 0; i < 4; i++ {
					id := fmt.Sprintf("crash-%d-%v-%d", limit, lose, i)
					recs = append(recs, &buckets.Record{ID: id, Queue: "default", Type: "t", State: buckets.StateWaiting,
						MaxAttempts: 1, TimeoutMs: 1000, Created: now, Due: now + int64(i%2)*60_000})
					ids = append(ids, id)
				}
				conn := e.pool.Get()
				fc := &faultConn{Conn: conn, limit: limit, loseReply: lose}
				err := st.Enqueue(ctx, fc, now, recs, ids...)
				conn.Close()
				if err != nil && !fc.tripped() {
					t.Fatalf("limit %d: error without a fault: %v", limit, err)
				}
				good := e.pool.Get()
				err2 := st.Enqueue(ctx, good, now, recs, ids...)
				good.Close()
				var ex *buckets.ExistsError
				switch {
				case err == nil && !errors.As(err2, &ex):
					t.Fatalf("limit %d: retry after a success = %v, want ExistsError", limit, err2)
				case errors.As(err2, &ex) && len(ex.IDs) != len(ids):
					t.Fatalf("limit %d: retry found %v of %v: a partial write", limit, ex.IDs, ids)
				case err2 != nil && !errors.As(err2, &ex):
					t.Fatalf("limit %d: retry = %v", limit, err2)
				}
				ready := e.readyIDs(t, "default")
				admin := e.admin(t)
				for i, r := range recs {
					n := 0
					if i%2 == 0 {
						for _, x := range ready {
							if x == r.ID {
								n++
							}
						}
					} else {
						b, _ := redis.Strings(admin.Do("LRANGE", st.Keys.Bucket("default", buckets.BucketTime(r.Due, st.Resolution)), 0, -1))
						for _, x := range b {
							if x == r.ID {
								n++
							}
						}
					}
					if n != 1 {
						t.Fatalf("limit %d lose %v: task %s placed %d times, want once", limit, lose, r.ID, n)
					}
				}
			}
		}
	})
}

// An id that exists refuses the enqueue and writes nothing, whatever state
// its task is in; a batch with one existing id writes none of its tasks
// and names the ids that exist.
func TestTaskIDExists(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		c := e.client(t)
		if _, err := c.Enqueue(ctx, "t", []byte("first"), In(time.Hour), TaskID("a")); err != nil {
			t.Fatal(err)
		}
		_, err := c.Enqueue(ctx, "t", []byte("second"), TaskID("a"))
		var te *ExistsError
		if !errors.Is(err, ErrTaskExists) || !errors.As(err, &te) || len(te.IDs) != 1 || te.IDs[0] != "a" {
			t.Fatalf("second Enqueue of id a = %v, want a ExistsError naming a", err)
		}
		if info, err := c.Lookup(ctx, "a"); err != nil || string(info.Payload) != "first" || info.State != StateScheduled {
			t.Fatalf("Lookup(a) = %+v, %v: the refused enqueue changed the task", info, err)
		}

		before := len(e.keys(t))
		_, err = c.EnqueueBatch(ctx, []NewTask{
			{Type: "t", Options: []Option{TaskID("b")}},
			{Type: "t"},
			{Type: "t", Options: []Option{TaskID("a")}},
		})
		if !errors.As(err, &te) || len(te.IDs) != 1 || te.IDs[0] != "a" || !strings.Contains(err.Error(), `"a"`) {
			t.Fatalf("batch with existing id a = %v, want a ExistsError naming a", err)
		}
		if after := len(e.keys(t)); after != before {
			t.Fatalf("a refused batch wrote keys: %d before, %d after", before, after)
		}
		if _, err := c.Lookup(ctx, "b"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Lookup(b) after a refused batch = %v, want ErrNotFound", err)
		}

		// A cancelled task keeps its id until its record expires.
		if err := c.Cancel(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Enqueue(ctx, "t", nil, TaskID("a")); !errors.Is(err, ErrTaskExists) {
			t.Fatalf("Enqueue of a cancelled task's id = %v, want ErrTaskExists", err)
		}
		if e.srv.Mini != nil {
			e.srv.Mini.FastForward(2 * time.Hour) // past the cancelled record's retention
			if _, err := c.Enqueue(ctx, "t", nil, TaskID("a")); err != nil {
				t.Fatalf("Enqueue of an expired record's id = %v, want nil", err)
			}
		}
	})
}

// Producers racing with one id get one task: the check and the write are
// one transaction.
func TestTaskIDRace(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		c := e.client(t)
		const producers = 8
		errs := make(chan error, producers)
		var wg sync.WaitGroup
		for i := 0; i < producers; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := c.Enqueue(ctx, "t", nil, TaskID("race"))
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		ok := 0
		for err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, ErrTaskExists):
				t.Fatalf("racing Enqueue = %v", err)
			}
		}
		if ok != 1 || e.count(t, "default", "race") != 1 {
			t.Fatalf("%d producers succeeded, %d in the ready list; want 1 and 1", ok, e.count(t, "default", "race"))
		}
	})
}

func TestTaskIDValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	ctx := context.Background()
	c := e.client(t)
	for _, id := range []string{"", "has space", "tab\there", "nl\n", "del\x7f", "é", strings.Repeat("x", maxIDLen+1)} {
		_, err := c.Enqueue(ctx, "t", nil, TaskID(id))
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("TaskID(%q): %v, want ErrInvalid", id, err)
		}
		if _, err := c.Lookup(ctx, id); !errors.Is(err, ErrInvalid) || !errors.Is(err, ErrNotFound) {
			t.Errorf("Lookup(%q): %v, want ErrInvalid and ErrNotFound", id, err)
		}
	}
	for _, id := range []string{"x", "order-42", "a:b/c{d}", strings.Repeat("y", maxIDLen)} {
		if _, err := c.Enqueue(ctx, "t", nil, TaskID(id)); err != nil {
			t.Errorf("TaskID(%q): %v", id, err)
		}
	}
	_, err := c.EnqueueBatch(ctx, []NewTask{{Type: "t", Options: []Option{TaskID("dup")}}, {Type: "t", Options: []Option{TaskID("dup")}}})
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("batch with one id twice: %v, want ErrInvalid", err)
	}
	if len(e.keys(t)) == 0 {
		t.Fatal("no keys: the valid ids were not enqueued")
	}
}

// ReceiveContext completes redis.ConnWithContext; nothing here receives.
func (c *cutConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(c.Conn, ctx)
}

// TestTaskIDReserved: the ids the engine makes for its own tasks (a
// periodic firing's, a group's callback, a reply task, the steps of a
// workflow that exists) cannot be taken by a producer: a firing or a step
// would otherwise run the producer's type and payload. Looking such an id
// up stays allowed.
func TestTaskIDReserved(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	ctx := context.Background()
	c := e.client(t)
	reserved := []string{
		"p:tick@20261128T150100Z",
		"p:tick@20261128T150100.5Z",
		"p:we_rd~0123456789abcdef@20261128T150100Z",
		"g~cb",
		"order-1~r1.1764342060000",
		"0AbCdEfGhIjKlMnOpQrStU~3~r2.1764342060000",
	}
	for _, id := range reserved {
		_, err := c.Enqueue(ctx, "esc", []byte("EVIL"), TaskID(id))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("TaskID(%q): %v, want a refusal matching ErrInvalid naming the id reserved", id, err)
		}
		_, err = c.EnqueueBatch(ctx, []NewTask{{Type: "esc", Options: []Option{TaskID(id)}}})
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("EnqueueBatch with TaskID(%q): %v, want ErrInvalid", id, err)
		}
		if _, err := c.Lookup(ctx, id); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalid) {
			t.Errorf("Lookup(%q): %v, want ErrNotFound only (the id is valid, just not the caller's to take)", id, err)
		}
	}
	// Ids that look close but are no firing's or callback's are free.
	for _, id := range []string{"p:no-at-sign", "tick@20261128T150100Z", "x~cbx", "x~r1", "lane~1"} {
		if _, err := c.Enqueue(ctx, "t", nil, TaskID(id)); err != nil {
			t.Errorf("TaskID(%q): %v, want it accepted", id, err)
		}
	}

	// The steps of a chain that exists are its own, also those not
	// written yet.
	if _, err := c.EnqueueChain(ctx, "c", Step{Type: "a"}, Step{Type: "b"}, Step{Type: "c"}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"c~1", "c~2"} {
		if _, err := c.Enqueue(ctx, "esc", []byte("EVIL"), TaskID(id)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "workflow") {
			t.Errorf("TaskID(%q) while chain c exists: %v, want ErrInvalid naming the workflow", id, err)
		}
	}
	if _, err := c.EnqueueBatch(ctx, []NewTask{{Type: "esc", Options: []Option{TaskID("c~2")}}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("EnqueueBatch with TaskID(c~2) while chain c exists: %v, want ErrInvalid", err)
	}
	// A chain whose later step's id a task holds already is refused.
	if _, err := c.Enqueue(ctx, "t", nil, TaskID("d~2")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.EnqueueChain(ctx, "d", Step{Type: "a"}, Step{Type: "b"}, Step{Type: "c"}); !errors.Is(err, ErrTaskExists) {
		t.Errorf("EnqueueChain(d) while task d~2 exists: %v, want ErrTaskExists", err)
	}
}
