package buckets

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// hookConn runs hook once, just before the first MULTI is sent: the place
// where another process's write would void the repair's watch, or where a
// crash would leave the repair unsent.
type hookConn struct {
	redis.Conn
	hook  func() error
	fired bool
}

func (c *hookConn) Send(name string, args ...interface{}) error {
	if err := c.fire(name); err != nil {
		return err
	}
	return c.Conn.Send(name, args...)
}

// fire runs the hook before the first MULTI.
func (c *hookConn) fire(name string) error {
	if name == "MULTI" && !c.fired {
		c.fired = true
		return c.hook()
	}
	return nil
}

// DoContext and ReceiveContext pass through: txn's round trips need a
// redis.ConnWithContext.
func (c *hookConn) DoContext(ctx context.Context, name string, args ...interface{}) (interface{}, error) {
	return redis.DoContext(c.Conn, ctx, name, args...)
}

func (c *hookConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(c.Conn, ctx)
}

// orphan enqueues three tasks into one bucket and removes its index
// member: the bucket is an orphan.
func orphan(t *testing.T, st *Store, conn, admin redis.Conn) Finding {
	t.Helper()
	now := time.Now().UnixMilli()
	due := now + 3_600_000
	var recs []*Record
	for _, id := range []string{"a", "b", "c"} {
		recs = append(recs, &Record{ID: id, Queue: "q", Type: "t", State: StateWaiting, MaxAttempts: 1, TimeoutMs: 1000, Created: now, Due: due})
	}
	if err := st.Enqueue(testCtx(t), conn, now, recs); err != nil {
		t.Fatal(err)
	}
	ts := BucketTime(due, st.Resolution)
	if _, err := admin.Do("ZREM", st.Keys.Schedule(), Member("q", ts)); err != nil {
		t.Fatal(err)
	}
	rep, err := st.CheckNamespace(testCtx(t), conn, CheckOptions{ListKeys: true})
	if err != nil || len(rep.Findings) != 1 || rep.Findings[0].Kind != FindOrphanBucket {
		t.Fatalf("check = %+v, %v; want one orphan bucket", rep, err)
	}
	return rep.Findings[0]
}

// A dispatcher-like write to the bucket between the repair's read and its
// EXEC voids the watch; the repair reads again and finds nothing to do.
func TestRepairOrphanRacingAMove(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	conn := pool.Get()
	defer conn.Close()
	f := orphan(t, st, conn, admin)
	hc := &hookConn{Conn: conn, hook: func() error {
		_, err := admin.Do("DEL", f.Key) // taken away meanwhile
		return err
	}}
	wrote, err := st.Repair(testCtx(t), hc, CheckOptions{}, f, time.Now().UnixMilli())
	if err != nil || wrote {
		t.Fatalf("Repair = %v, %v; want nothing written", wrote, err)
	}
	if n, err := redis.Int(admin.Do("ZCARD", st.Keys.Schedule())); err != nil || n != 0 {
		t.Fatalf("index holds %d members (%v); want none for a bucket that is gone", n, err)
	}
}

// A crash (here: the connection failing) before MULTI leaves nothing
// written; a later repair completes the job.
func TestRepairCrashBeforeExec(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	conn := pool.Get()
	defer conn.Close()
	f := orphan(t, st, conn, admin)
	broken := errors.New("connection lost")
	hc := &hookConn{Conn: conn, hook: func() error { return broken }}
	if _, err := st.Repair(testCtx(t), hc, CheckOptions{}, f, time.Now().UnixMilli()); !errors.Is(err, broken) {
		t.Fatalf("Repair error = %v; want the connection's", err)
	}
	if n, err := redis.Int(admin.Do("ZCARD", st.Keys.Schedule())); err != nil || n != 0 {
		t.Fatalf("index holds %d members (%v) after a failed repair; want none", n, err)
	}
	conn2 := pool.Get()
	defer conn2.Close()
	if wrote, err := st.Repair(testCtx(t), conn2, CheckOptions{}, f, time.Now().UnixMilli()); err != nil || !wrote {
		t.Fatalf("second Repair = %v, %v; want written", wrote, err)
	}
	checkClean(t, st, conn2, "after repair")
}

// A gauge repair racing a transition of its queue (an enqueue into a
// bucket, which moves the scheduled gauge) recounts after it, and leaves
// gauges that match the structures.
func TestRepairGaugeRacingEnqueue(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	conn := pool.Get()
	defer conn.Close()
	now := time.Now().UnixMilli()
	rec := func(id string) *Record {
		return &Record{ID: id, Queue: "q", Type: "t", State: StateWaiting, MaxAttempts: 1, TimeoutMs: 1000, Created: now, Due: now + 3_600_000}
	}
	if err := st.Enqueue(testCtx(t), conn, now, []*Record{rec("a")}); err != nil {
		t.Fatal(err)
	}
	// Both gauges wrong: a repair that wrote its first recount of
	// scheduled (1) after the racing enqueue would leave it wrong again.
	if _, err := admin.Do("HMSET", st.Keys.Stats("q"), StatRunning, 4, StatScheduled, 6); err != nil {
		t.Fatal(err)
	}
	rep, err := st.CheckNamespace(testCtx(t), conn, CheckOptions{ListKeys: true})
	if err != nil || len(rep.Findings) != 2 || rep.Findings[0].Kind != FindGauge {
		t.Fatalf("check = %+v, %v; want the running and scheduled gauges", rep, err)
	}
	other := pool.Get()
	defer other.Close()
	hc := &hookConn{Conn: conn, hook: func() error {
		return st.Enqueue(testCtx(t), other, now, []*Record{rec("b")})
	}}
	if wrote, err := st.Repair(testCtx(t), hc, CheckOptions{}, rep.Findings[0], now); err != nil || !wrote || !hc.fired {
		t.Fatalf("Repair = %v, %v (race injected: %v); want written", wrote, err, hc.fired)
	}
	m, err := redis.Int64Map(admin.Do("HGETALL", st.Keys.Stats("q")))
	if err != nil || m[StatRunning] != 0 || m[StatScheduled] != 2 {
		t.Fatalf("gauges = %v, %v; want running 0, scheduled 2 (the racing enqueue counted)", m, err)
	}
	checkClean(t, st, conn, "after repair")
}

// A worker holding a task but missing from the registry (forgotten by a
// reaper that misread its lists, say) is found, and registered again so
// that a reaper returns its task if it is dead.
func TestCheckFindsUnregisteredWorker(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	conn := pool.Get()
	defer conn.Close()
	now := time.Now().UnixMilli()
	r := &Record{ID: "a", Queue: "q", Type: "t", State: StateWaiting, MaxAttempts: 1, TimeoutMs: 1000, Created: now, Due: now}
	if err := st.Enqueue(testCtx(t), conn, now, []*Record{r}); err != nil {
		t.Fatal(err)
	}
	if id, err := st.Pop(testCtx(t), conn, "q", "w1"); err != nil || id != "a" {
		t.Fatalf("Pop = %q, %v", id, err)
	}
	rep, err := st.CheckNamespace(testCtx(t), conn, CheckOptions{ListKeys: true})
	if err != nil || len(rep.Findings) != 1 || rep.Findings[0].Kind != FindUnregistered || rep.Findings[0].Worker != "w1" {
		t.Fatalf("check = %+v, %v; want worker w1 unregistered", rep, err)
	}
	if wrote, err := st.Repair(testCtx(t), conn, CheckOptions{}, rep.Findings[0], now); err != nil || !wrote {
		t.Fatalf("Repair = %v, %v", wrote, err)
	}
	if in, err := redis.Bool(admin.Do("SISMEMBER", st.Keys.Workers(), "w1")); err != nil || !in {
		t.Fatalf("w1 registered = %v, %v", in, err)
	}
	checkClean(t, st, conn, "after repair")
}

// A dead letter of no queue (an id found with no record where only the id
// is known) is counted in no queue's gauge: the checker finds nothing.
func TestCheckDeadLetterOfNoQueue(t *testing.T) {
	t.Parallel()
	st, pool, _ := realStore(t)
	conn := pool.Get()
	defer conn.Close()
	now := time.Now().UnixMilli()
	if _, err := redis.DoContext(conn, testCtx(t), "RPUSH", st.Keys.Inflight("w1"), "ghost"); err != nil {
		t.Fatal(err)
	}
	res, err := st.RecoverAllInflight(testCtx(t), conn, "w1", now, true)
	if err != nil || res.Buried != 1 {
		t.Fatalf("RecoverAllInflight = %+v, %v; want the ghost buried", res, err)
	}
	recs, _, err := st.Records(testCtx(t), conn, []string{"ghost"})
	if err != nil || len(recs) != 1 || recs[0] == nil || recs[0].State != StateDead || recs[0].Queue != "" {
		t.Fatalf("ghost record = %+v, %v; want a dead letter of no queue", recs, err)
	}
	rep, err := st.CheckNamespace(testCtx(t), conn, CheckOptions{ListKeys: true})
	if err != nil || len(rep.Findings) != 0 {
		t.Fatalf("check = %+v, %v; want no finding", rep, err)
	}
}

// headEater is a reader that, before every read of the index but the
// first, removes its lowest members, as a dispatcher moving the head of
// the index while the checker walks it would.
type headEater struct {
	connReader
	admin redis.Conn
	key   string
	eat   int
	reads int
}

func (r *headEater) do(name string, args ...interface{}) (interface{}, error) {
	if name == "ZRANGEBYSCORE" {
		if r.reads > 0 {
			if _, err := r.admin.Do("ZREMRANGEBYRANK", r.key, 0, r.eat-1); err != nil {
				return nil, err
			}
		}
		r.reads++
	}
	return r.connReader.do(name, args...)
}

// The checker's walk of a sorted set (the index here) pages by score, so that members removed
// from its head between two pages (already read) make it skip none of the
// rest, and a time holding more members than a page is read whole.
func TestWalkIndexUnderMoves(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	conn := pool.Get()
	defer conn.Close()
	key := st.Keys.Schedule()
	var want []string
	add := func(score int64, m string) {
		t.Helper()
		if _, err := admin.Do("ZADD", key, score, m); err != nil {
			t.Fatal(err)
		}
		want = append(want, m)
	}
	for i := range int64(20) {
		add(1000+i, fmt.Sprintf("q:%d", 1000+i))
	}
	for i := range 8 {
		add(2000, fmt.Sprintf("q%d:2000", i)) // one time, more than a page
	}
	add(3000, "q:3000")

	// Removing from the head, three members before each page of three:
	// every member is read before it is removed, once.
	r := &headEater{connReader: connReader{testCtx(t), conn}, admin: admin, key: key, eat: 3}
	got := map[string]int{}
	if err := walkByScore(r, key, 3, func(m string) { got[m]++ }); err != nil {
		t.Fatal(err)
	}
	for _, m := range want[:20] {
		if got[m] != 1 {
			t.Fatalf("member %s read %d times under moves; read %v", m, got[m], got)
		}
	}

	// Untouched: every member once, the eight at one time included.
	if _, err := admin.Do("DEL", key); err != nil {
		t.Fatal(err)
	}
	want = want[:0]
	for i := range int64(5) {
		add(1000+i, fmt.Sprintf("q:%d", 1000+i))
	}
	for i := range 8 {
		add(2000, fmt.Sprintf("q%d:2000", i))
	}
	add(3000, "q:3000")
	got = map[string]int{}
	if err := walkByScore(connReader{testCtx(t), conn}, key, 3, func(m string) { got[m]++ }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("read %d members, want %d: %v", len(got), len(want), got)
	}
	for _, m := range want {
		if got[m] != 1 {
			t.Fatalf("member %s read %d times; read %v", m, got[m], got)
		}
	}
}
