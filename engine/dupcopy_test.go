package engine

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// execLostConn fails the sending of EXEC: the claim built its writes (and
// remembered the run number it wrote) but they never reach the server.
type execLostConn struct{ redis.Conn }

func (c execLostConn) Send(name string, args ...interface{}) error {
	if strings.EqualFold(name, "EXEC") {
		return errInjected
	}
	return c.Conn.Send(name, args...)
}

func (c execLostConn) Do(name string, args ...interface{}) (interface{}, error) {
	return c.DoContext(context.Background(), name, args...)
}

func (c execLostConn) DoContext(ctx context.Context, name string, args ...interface{}) (interface{}, error) {
	if strings.EqualFold(name, "EXEC") {
		return nil, errInjected
	}
	return redis.DoContext(c.Conn, ctx, name, args...)
}

func (c execLostConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(c.Conn, ctx)
}

// dupClaimStore loses the first claim's EXEC, and makes that claim's
// error arrive only after the second claim of the id returned, or after a
// second when none does meanwhile (it waits for the first, as it should).
type dupClaimStore struct {
	workerStore
	mu     sync.Mutex
	claims int
	other  chan struct{}
	once   sync.Once
}

func (d *dupClaimStore) otherDone() { d.once.Do(func() { close(d.other) }) }

func (d *dupClaimStore) Claim(ctx context.Context, conn redis.Conn, w, q, id string, now int64, deadline func(*buckets.Record) int64, hold bool, cs *buckets.ClaimState) (*buckets.Record, buckets.ClaimResult, error) {
	d.mu.Lock()
	d.claims++
	n := d.claims
	d.mu.Unlock()
	if n == 1 {
		rec, res, err := d.workerStore.Claim(ctx, execLostConn{conn}, w, q, id, now, deadline, hold, cs)
		select {
		case <-d.other:
		case <-time.After(time.Second):
		}
		return rec, res, err
	}
	rec, res, err := d.workerStore.Claim(ctx, conn, w, q, id, now, deadline, hold, cs)
	if n == 2 {
		d.otherDone()
	}
	return rec, res, err
}

// An id pushed twice into a ready list (a settle or a recovery may do
// that) and popped by two slots of one process runs once, even when the
// first slot's claim is lost and retried: the slot holding the second copy
// claims only after the first claim is over, since two claims of one id
// by one process at once could each take the other's committed claim for
// its own.
func TestDuplicateCopyInOneProcessRunsOnce(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	admin := e.admin(t)
	id, err := idOf(e.client(t).Enqueue(context.Background(), "t", nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Do("LPUSH", e.key("q:default"), id); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	rec := newRecorder(func(ctx context.Context, _ *Task) error {
		<-release
		return nil
	})
	e.cfg.Concurrency = 2
	w, err := newWorker(e.pool, e.cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	ds := &dupClaimStore{workerStore: w.store, other: make(chan struct{})}
	w.store = ds
	stop := runBackground(t, w.Run)
	waitFor(t, outcomeWait, "both copies taken", func() bool {
		n, _ := redis.Int(admin.Do("LLEN", e.key("q:default")))
		return n == 0
	})
	waitFor(t, outcomeWait, "the task to start", func() bool { return rec.count(id) >= 1 })
	close(release)
	waitFor(t, outcomeWait, "done", func() bool { return e.state(t, id) == StateDone })
	stop()
	if n := rec.count(id); n != 1 {
		t.Fatalf("the task ran %d times; want once", n)
	}
	if n, _ := redis.Int(admin.Do("LLEN", e.key("f:"+w.id))); n != 0 {
		t.Fatalf("%d copies left in the in-flight list", n)
	}
}
