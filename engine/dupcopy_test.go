package engine

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
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

// dupClaimStore loses the first claim's EXEC (it runs on a lane of lossy,
// whose connections are execLostConns), and makes that claim's error
// arrive only after the second claim of the id returned, or after a
// second when none does meanwhile (it waits for the first, as it should).
type dupClaimStore struct {
	store
	lossy  *redis.Pool
	mu     sync.Mutex
	claims int
	other  chan struct{}
	once   sync.Once
}

func (d *dupClaimStore) otherDone() { d.once.Do(func() { close(d.other) }) }

func (d *dupClaimStore) Claim(ctx context.Context, l *lane, p string, ids []string, cs []buckets.ClaimState, hold bool) ([]*buckets.Record, []buckets.ClaimResult, error) {
	d.mu.Lock()
	d.claims++
	n := d.claims
	d.mu.Unlock()
	if n == 1 {
		ll := &lane{h: rconn.Holder{Pool: d.lossy}}
		defer ll.close()
		recs, res, err := d.store.Claim(ctx, ll, p, ids, cs, hold)
		select {
		case <-d.other:
		case <-time.After(time.Second): // real time: a bound, when no second claim comes (it should wait for this one)
		}
		return recs, res, err
	}
	recs, res, err := d.store.Claim(ctx, l, p, ids, cs, hold)
	if n == 2 {
		d.otherDone()
	}
	return recs, res, err
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
	lossy := &redis.Pool{Dial: func() (redis.Conn, error) {
		c, err := e.pool.Dial()
		if err != nil {
			return nil, err
		}
		return execLostConn{c}, nil
	}}
	defer lossy.Close()
	ds := &dupClaimStore{store: w.store, lossy: lossy, other: make(chan struct{})}
	w.setStore(ds)
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
