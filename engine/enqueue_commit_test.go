package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// execGate is shared by the connections of one pool: it numbers the round
// trips that carry an EXEC (1, 2, ...), calls before(n) just before the
// n-th is sent and, when lose(n), drops its reply (the server ran it; the
// connection closes).
type execGate struct {
	n      atomic.Int32
	before func(n int32)
	lose   func(n int32) bool
}

type gateConn struct {
	redis.Conn
	g       *execGate
	pending bool // an EXEC was sent and not yet flushed
	dead    bool
}

func (c *gateConn) Send(name string, args ...interface{}) error {
	if c.dead {
		return errInjected
	}
	if name == "EXEC" {
		c.pending = true
	}
	return c.Conn.Send(name, args...)
}

func (c *gateConn) Do(name string, args ...interface{}) (interface{}, error) {
	return c.DoContext(context.Background(), name, args...)
}

func (c *gateConn) DoContext(ctx context.Context, name string, args ...interface{}) (interface{}, error) {
	if c.dead {
		return nil, errInjected
	}
	var n int32
	if c.pending {
		c.pending = false
		n = c.g.n.Add(1)
		if c.g.before != nil {
			c.g.before(n)
		}
	}
	rep, err := redis.DoContext(c.Conn, ctx, name, args...)
	if n > 0 && c.g.lose != nil && c.g.lose(n) {
		c.dead = true
		c.Conn.Close()
		return nil, errInjected
	}
	return rep, err
}

func (c *gateConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	if c.dead {
		return nil, errInjected
	}
	return redis.ReceiveContext(c.Conn, ctx)
}

func (c *gateConn) Err() error {
	if c.dead {
		return errInjected
	}
	return c.Conn.Err()
}

// gatedClient is a Client whose connections go through g (each Get dials
// anew: the pool keeps none idle); wrap, when set, wraps the i-th dialled
// connection (from 1) below the gate. queued receives one value per
// enqueue that joins the group's queue. It keeps one enqueue in flight
// (EnqueueGroupLanes 1), so that holding one EXEC queues the rest;
// gatedClientLanes sets another number.
func gatedClient(t *testing.T, e *env, g *execGate, wrap func(i int, c redis.Conn) redis.Conn) (c *laneClient, queued chan struct{}) {
	t.Helper()
	return gatedClientLanes(t, e, g, wrap, 1)
}

func gatedClientLanes(t *testing.T, e *env, g *execGate, wrap func(i int, c redis.Conn) redis.Conn, lanes int) (c *laneClient, queued chan struct{}) {
	t.Helper()
	var dials atomic.Int32
	pool := &redis.Pool{Dial: func() (redis.Conn, error) {
		var conn redis.Conn = e.pool.Get()
		if wrap != nil {
			conn = wrap(int(dials.Add(1)), conn)
		}
		return &gateConn{Conn: conn, g: g}, nil
	}}
	t.Cleanup(func() { pool.Close() })
	cfg := e.cfg
	cfg.Advanced.EnqueueGroupLanes = lanes
	c, err := newLaneClient(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	queued = make(chan struct{}, 100)
	c.group.queued = func() { queued <- struct{}{} }
	return c, queued
}

// holdExec returns a before hook that, at the n-th EXEC round trip,
// signals reached and waits for release.
func holdExec(n int32, reached chan<- struct{}, release <-chan struct{}) func(int32) {
	return func(i int32) {
		if i == n {
			reached <- struct{}{}
			<-release
		}
	}
}

type enqueued1 struct {
	info *TaskInfo
	err  error
}

// enqueueAsync runs one enqueue on its own goroutine: due now, or in an
// hour when later.
func enqueueAsync(ctx context.Context, c *laneClient, q string, later bool) <-chan enqueued1 {
	out := make(chan enqueued1, 1)
	go func() {
		opts := []Option{Queue(q)}
		if later {
			opts = append(opts, In(time.Hour))
		}
		info, err := c.Enqueue(ctx, "t", []byte("p"), opts...)
		out <- enqueued1{info, err}
	}()
	return out
}

// Enqueues that arrive while one is in flight share the next transaction:
// two EXECs for six enqueues, each caller answered with its own task,
// every task placed.
func TestEnqueueGroupShares(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	const q = "group-share"
	reached, release := make(chan struct{}), make(chan struct{})
	g := &execGate{before: holdExec(1, reached, release)}
	c, queued := gatedClient(t, e, g, nil)
	ctx := context.Background()
	first := enqueueAsync(ctx, c, q, false)
	<-reached
	var rest []<-chan enqueued1
	for i := 0; i < 5; i++ {
		rest = append(rest, enqueueAsync(ctx, c, q, i%2 == 1))
		<-queued
	}
	close(release)
	infos, ready := answers(t, append(rest, first))
	for _, info := range infos {
		got, err := c.Lookup(ctx, info.ID)
		if err != nil {
			t.Fatalf("Lookup %s: %v", info.ID, err)
		}
		if got.State != info.State {
			t.Fatalf("task %s: state %s, Enqueue said %s", info.ID, got.State, info.State)
		}
	}
	if len(ready) != 4 {
		t.Fatalf("%d tasks ready, want 4", len(ready))
	}
	if n := g.n.Load(); n != 2 {
		t.Fatalf("%d EXECs for one enqueue and five that arrived while it was in flight; want 2", n)
	}
	exactlyOnce(t, e.readyIDs(t, q), ready)
}

// The callers of a group who come straight back with their next enqueue
// share the next transaction: the group's writer holds the lane until
// they are queued (regroup), so none of them runs alone ahead of the
// others. One held enqueue, four queued behind it, then each of the four
// once more: three EXECs, where ending the busy spell between groups
// would send the first caller back alone and the other three after it.
func TestEnqueueGroupRegroups(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	const q, k = "group-regroup", 4
	reached, release := make(chan struct{}), make(chan struct{})
	g := &execGate{before: holdExec(1, reached, release)}
	c, queued := gatedClient(t, e, g, nil)
	// Yield for as long as it takes: the four come back whatever the
	// machine's load (a caller that does not come back costs the bound).
	c.group.yields = 1 << 20
	ctx := context.Background()
	first := enqueueAsync(ctx, c, q, false)
	<-reached
	again := make(chan enqueued1, 2*k)
	for i := 0; i < k; i++ {
		go func() {
			for range 2 {
				again <- <-enqueueAsync(ctx, c, q, false)
			}
		}()
		<-queued
	}
	close(release)
	chs := []<-chan enqueued1{first}
	for range 2 * k {
		chs = append(chs, again)
	}
	_, ready := answers(t, chs)
	if len(ready) != 2*k+1 {
		t.Fatalf("%d tasks ready, want %d", len(ready), 2*k+1)
	}
	if n := g.n.Load(); n != 3 {
		t.Fatalf("%d EXECs for one enqueue, %d queued behind it and their %d next ones; want 3", n, k, k)
	}
	exactlyOnce(t, e.readyIDs(t, q), ready)
}

// With two lanes, an enqueue that arrives while one is in flight runs at
// once in the second lane; one that arrives while both are in flight
// queues, and the next lot goes when either ends. Every caller is
// answered, every task placed once, and the lanes are free again after.
func TestEnqueueGroupLanes(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	const q = "group-lanes"
	reached := make(chan int32, 2)
	release := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	g := &execGate{before: func(n int32) {
		if n <= 2 {
			reached <- n
			<-release[n-1]
		}
	}}
	c, queued := gatedClientLanes(t, e, g, nil, 2)
	ctx := context.Background()
	held := []<-chan enqueued1{enqueueAsync(ctx, c, q, false)}
	<-reached
	held = append(held, enqueueAsync(ctx, c, q, true))
	<-reached // the second ran in its own lane, not queued
	var rest []<-chan enqueued1
	for i := 0; i < 4; i++ {
		rest = append(rest, enqueueAsync(ctx, c, q, i%2 == 1))
		<-queued
	}
	close(release[0])
	close(release[1])
	infos, ready := answers(t, append(held, rest...))
	if len(infos) != 6 || len(ready) != 3 {
		t.Fatalf("%d tasks, %d ready; want 6, 3", len(infos), len(ready))
	}
	// Two held EXECs, then the four queued in one lot or two.
	if n := g.n.Load(); n < 3 || n > 4 {
		t.Fatalf("%d EXECs for two held enqueues and four queued behind them; want 3 or 4", n)
	}
	exactlyOnce(t, e.readyIDs(t, q), ready)
	// The last lane frees itself just after answering its callers.
	waitFor(t, 2*time.Second, "no enqueue counted in flight 2 s after all were answered", func() bool {
		c.group.mu.Lock()
		defer c.group.mu.Unlock()
		return c.group.inflight == 0
	})
}

// answers waits for every enqueue of chs and fails the test on an error
// or an id given twice; it returns the tasks and the ids of those ready.
func answers(t *testing.T, chs []<-chan enqueued1) (infos []*TaskInfo, ready map[string]bool) {
	t.Helper()
	ids := map[string]bool{}
	ready = map[string]bool{}
	for _, ch := range chs {
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		if ids[r.info.ID] {
			t.Fatalf("id %s given twice", r.info.ID)
		}
		ids[r.info.ID] = true
		infos = append(infos, r.info)
		if r.info.State == StateReady {
			ready[r.info.ID] = true
		}
	}
	return infos, ready
}

// Many producers on one Client: every enqueue is answered, every task is
// written and placed once, and the counters match (run with -race).
func TestEnqueueGroupConcurrent(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	const q, producers, each = "group-many", 8, 60
	c := e.client(t)
	ctx := context.Background()
	var (
		mu       sync.Mutex
		ready    = map[string]bool{}
		later    = map[string]bool{}
		wg       sync.WaitGroup
		errsSeen []error
	)
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				r := <-enqueueAsync(ctx, c, q, (p+i)%3 == 0)
				mu.Lock()
				switch {
				case r.err != nil:
					errsSeen = append(errsSeen, r.err)
				case r.info.State == StateReady:
					ready[r.info.ID] = true
				default:
					later[r.info.ID] = true
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errsSeen) > 0 {
		t.Fatalf("%d enqueues failed, the first: %v", len(errsSeen), errsSeen[0])
	}
	if len(ready)+len(later) != producers*each {
		t.Fatalf("%d distinct tasks for %d enqueues", len(ready)+len(later), producers*each)
	}
	exactlyOnce(t, e.readyIDs(t, q), ready)
	n, err := redis.Int(e.admin(t).Do("HGET", e.key("st:"+q), "scheduled"))
	if err != nil || n != len(later) {
		t.Fatalf("scheduled gauge %d (%v), want %d", n, err, len(later))
	}
	for id := range later {
		info, err := c.Lookup(ctx, id)
		if err != nil || info.State != StateScheduled {
			t.Fatalf("delayed task %s: %v, %v", id, info, err)
		}
	}
}

// A caller whose context ends while its enqueue is queued returns at once
// with its context's error (not ErrUncertain), and its task is never
// written; the others of its group are.
func TestEnqueueGroupWithdrawn(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	const q = "group-withdrawn"
	reached, release := make(chan struct{}), make(chan struct{})
	g := &execGate{before: holdExec(1, reached, release)}
	c, queued := gatedClient(t, e, g, nil)
	ctx := context.Background()
	first := enqueueAsync(ctx, c, q, false)
	<-reached
	cctx, cancel := context.WithCancel(ctx)
	gone := enqueueAsync(cctx, c, q, false)
	<-queued
	kept := enqueueAsync(ctx, c, q, false)
	<-queued
	cancel()
	r := <-gone // while the first transaction is still held
	if !errors.Is(r.err, context.Canceled) || errors.Is(r.err, ErrUncertain) {
		t.Fatalf("withdrawn enqueue: %v; want context.Canceled, not ErrUncertain", r.err)
	}
	close(release)
	want := map[string]bool{}
	for _, ch := range []<-chan enqueued1{first, kept} {
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		want[r.info.ID] = true
	}
	exactlyOnce(t, e.readyIDs(t, q), want)
	if ks, _ := redis.Strings(e.admin(t).Do("KEYS", e.key("t:*"))); len(ks) != 2 {
		t.Fatalf("records %v; want those of the two kept enqueues only", ks)
	}
}

// A caller whose context ends once its enqueue was taken into a group
// transaction returns at once with ErrUncertain (and its context's
// error); the transaction goes on and writes its task.
func TestEnqueueGroupCancelledInFlight(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	const q = "group-inflight"
	reached, release := make(chan struct{}), make(chan struct{})
	reached2, release2 := make(chan struct{}), make(chan struct{})
	hold1, hold2 := holdExec(1, reached, release), holdExec(2, reached2, release2)
	g := &execGate{before: func(n int32) { hold1(n); hold2(n) }}
	c, queued := gatedClient(t, e, g, nil)
	ctx := context.Background()
	first := enqueueAsync(ctx, c, q, false)
	<-reached
	cctx, cancel := context.WithCancel(ctx)
	late := enqueueAsync(cctx, c, q, false)
	<-queued
	close(release)
	<-reached2 // the group transaction with late's task is on its way
	cancel()
	r := <-late
	if !errors.Is(r.err, ErrUncertain) || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("enqueue cancelled in flight: %v; want ErrUncertain and context.Canceled", r.err)
	}
	close(release2)
	if r := <-first; r.err != nil {
		t.Fatal(r.err)
	}
	// The group's transaction ran: both tasks are ready. Wait for it by
	// the drain's end (the next enqueue runs alone only once it ended).
	if r := <-enqueueAsync(ctx, c, "other", false); r.err != nil {
		t.Fatal(r.err)
	}
	if n, err := redis.Int(e.admin(t).Do("LLEN", e.key("q:"+q))); err != nil || n != 2 {
		t.Fatalf("ready list holds %d (%v); want 2: the cancelled caller's task was sent", n, err)
	}
}

// A lost EXEC reply of a group transaction is ErrUncertain for exactly
// the callers of that group; the transaction ran, so their tasks are
// placed (the lost-reply settle finds nothing to redo).
func TestEnqueueGroupLostReply(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	const q = "group-lost"
	reached, release := make(chan struct{}), make(chan struct{})
	g := &execGate{before: holdExec(1, reached, release), lose: func(n int32) bool { return n == 2 }}
	c, queued := gatedClient(t, e, g, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := enqueueAsync(ctx, c, q, false)
	<-reached
	a := enqueueAsync(ctx, c, q, false)
	<-queued
	b := enqueueAsync(ctx, c, q, true)
	<-queued
	close(release)
	r := <-first
	if r.err != nil {
		t.Fatalf("the enqueue in flight before the group: %v", r.err)
	}
	for _, ch := range []<-chan enqueued1{a, b} {
		if r := <-ch; !errors.Is(r.err, ErrUncertain) {
			t.Fatalf("enqueue of a group whose reply was lost: %v; want ErrUncertain", r.err)
		}
	}
	if n, err := redis.Int(e.admin(t).Do("LLEN", e.key("q:"+q))); err != nil || n != 2 {
		t.Fatalf("ready list holds %d (%v); want 2", n, err)
	}
	if n, err := redis.Int(e.admin(t).Do("HGET", e.key("st:"+q), "scheduled")); err != nil || n != 1 {
		t.Fatalf("scheduled gauge %d (%v); want 1", n, err)
	}
}

// Crash points: the group transaction's connection dies after any number
// of commands (its reply lost or not). The group is written whole or not
// at all, every task of it placed, and a caller told nil has its task.
func TestEnqueueGroupCrashPoints(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	for limit := 1; limit <= 14; limit++ {
		for _, lose := range []bool{false, true} {
			q := fmt.Sprintf("group-crash-%d-%v", limit, lose)
			reached, release := make(chan struct{}), make(chan struct{})
			g := &execGate{before: holdExec(1, reached, release)}
			var fc *faultConn
			c, queued := gatedClient(t, e, g, func(i int, conn redis.Conn) redis.Conn {
				if i != 2 { // the first is the lone enqueue's, the second the group's
					return conn
				}
				fc = &faultConn{Conn: conn, limit: limit, loseReply: lose}
				return fc
			})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			first := enqueueAsync(ctx, c, q, false)
			<-reached
			var group []<-chan enqueued1
			for i := 0; i < 3; i++ {
				group = append(group, enqueueAsync(ctx, c, q, i == 1))
				<-queued
			}
			close(release)
			if r := <-first; r.err != nil {
				t.Fatal(r.err)
			}
			var told []string
			failed := 0
			for _, ch := range group {
				r := <-ch
				if r.err != nil {
					failed++
					continue
				}
				told = append(told, r.info.ID)
			}
			cancel()
			if failed != 0 && failed != 3 {
				t.Fatalf("limit %d lose %v: %d of 3 callers of one group failed", limit, lose, failed)
			}
			if failed > 0 && !fc.tripped() {
				t.Fatalf("limit %d lose %v: errors without a fault", limit, lose)
			}
			ready, err := redis.Int(e.admin(t).Do("LLEN", e.key("q:"+q)))
			if err != nil {
				t.Fatal(err)
			}
			sched, _ := redis.Int(e.admin(t).Do("HGET", e.key("st:"+q), "scheduled"))
			// The lone enqueue's task, plus the group's three or none.
			switch {
			case ready == 1 && sched == 0 && len(told) == 0:
			case ready == 3 && sched == 1:
			default:
				t.Fatalf("limit %d lose %v: %d ready and %d scheduled, %d callers told nil; want the group whole or not at all", limit, lose, ready, sched, len(told))
			}
		}
	}
}

// errNoMaster stands for a routing layer's "nothing was sent: no master".
var errNoMaster = errors.New("no server says role:master (injected)")

// refusingConn answers every round trip with an error wrapping
// txn.ErrNotRun, sending nothing, while refuse holds.
type refusingConn struct {
	redis.Conn
	refuse  func() bool
	refused chan<- struct{} // one value per refusal, if room
	buf     []cmdArgs
}

type cmdArgs struct {
	name string
	args []interface{}
}

func (c *refusingConn) Send(name string, args ...interface{}) error {
	c.buf = append(c.buf, cmdArgs{name, args})
	return nil
}

func (c *refusingConn) Do(name string, args ...interface{}) (interface{}, error) {
	return c.DoContext(context.Background(), name, args...)
}

func (c *refusingConn) DoContext(ctx context.Context, name string, args ...interface{}) (interface{}, error) {
	if c.refuse() {
		c.buf = c.buf[:0]
		select {
		case c.refused <- struct{}{}:
		default:
		}
		return nil, fmt.Errorf("route: nothing was sent: %w: %w", txn.ErrNotRun, errNoMaster)
	}
	for _, b := range c.buf {
		if err := c.Conn.Send(b.name, b.args...); err != nil {
			return nil, err
		}
	}
	c.buf = c.buf[:0]
	return redis.DoContext(c.Conn, ctx, name, args...)
}

func (c *refusingConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(c.Conn, ctx)
}

// A caller that gives up while queued behind a transaction that is being
// tried again because no server ran it (no master to write to) is told
// so: its error wraps the reason, as a lone enqueue's does, besides its
// context's error. Its task is never written; the one in flight is, once
// a master answers.
func TestEnqueueGroupWithdrawnSaysWhy(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	const q = "group-why"
	var refuse atomic.Bool
	refuse.Store(true)
	refused := make(chan struct{}, 1)
	c, queued := gatedClient(t, e, &execGate{}, func(_ int, conn redis.Conn) redis.Conn {
		return &refusingConn{Conn: conn, refuse: refuse.Load, refused: refused}
	})
	ctx := context.Background()
	first := enqueueAsync(ctx, c, q, false)
	<-refused // the first is in flight, being tried again
	cctx, cancel := context.WithCancel(ctx)
	gone := enqueueAsync(cctx, c, q, false)
	<-queued
	<-refused // a retry noted after it queued
	cancel()
	r := <-gone
	if !errors.Is(r.err, context.Canceled) || !errors.Is(r.err, errNoMaster) || !errors.Is(r.err, txn.ErrNotRun) ||
		errors.Is(r.err, ErrUncertain) || !strings.Contains(r.err.Error(), "no server says role:master") {
		t.Fatalf("withdrawn enqueue: %v; want context.Canceled and the in-flight transaction's reason, not ErrUncertain", r.err)
	}
	refuse.Store(false)
	f := <-first
	if f.err != nil {
		t.Fatalf("the enqueue in flight, once a master answers: %v", f.err)
	}
	exactlyOnce(t, e.readyIDs(t, q), map[string]bool{f.info.ID: true})
	if ks, _ := redis.Strings(e.admin(t).Do("KEYS", e.key("t:*"))); len(ks) != 1 {
		t.Fatalf("records %v; want the first enqueue's only", ks)
	}
}

// A caller taken into a group transaction whose deadline is its own gets
// that transaction's answer when the deadline comes, not ErrUncertain:
// here no attempt was run by any server (no master), so nothing was
// written and the error says why.
func TestEnqueueGroupTakenAtItsDeadlineGetsTheAnswer(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	const q = "group-taken-deadline"
	ctx := context.Background()
	// The second enqueue must join while the first's transaction is in
	// flight (100 ms): on a busy machine it may come too late, and start
	// a transaction of its own; then the scenario is run again, on a
	// client of its own.
	for attempt := 1; ; attempt++ {
		refused := make(chan struct{}, 1)
		c, queued := gatedClient(t, e, &execGate{}, func(_ int, conn redis.Conn) redis.Conn {
			return &refusingConn{Conn: conn, refuse: func() bool { return true }, refused: refused}
		})
		fctx, fcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		first := enqueueAsync(fctx, c, q, false)
		<-refused
		sctx, scancel := context.WithTimeout(ctx, 350*time.Millisecond)
		second := enqueueAsync(sctx, c, q, false)
		var early *enqueued1
		select {
		case <-queued:
		case r := <-second:
			early = &r
		}
		r1 := <-first
		fcancel()
		if early != nil {
			scancel()
			if attempt == 5 {
				t.Fatalf("in %d attempts the second enqueue never joined the first's transaction (last: %v)", attempt, early.err)
			}
			t.Logf("attempt %d: the second enqueue did not join the first's transaction (%v); again", attempt, early.err)
			continue
		}
		if r1.err == nil || !errors.Is(r1.err, errNoMaster) {
			t.Fatalf("the first enqueue: %v; want the refusal", r1.err)
		}
		// Taken into the next transaction, which ends with it (its 32
		// attempts, jittered up to 50 ms apart, take longer than 250 ms).
		r := <-second
		scancel()
		if r.err == nil || errors.Is(r.err, ErrUncertain) || !errors.Is(r.err, context.DeadlineExceeded) || !errors.Is(r.err, errNoMaster) {
			t.Fatalf("enqueue taken into a transaction that ended with its deadline: %v; want the transaction's answer "+
				"(deadline, after no master), not ErrUncertain", r.err)
		}
		break
	}
	if ks, _ := redis.Strings(e.admin(t).Do("KEYS", e.key("t:*"))); len(ks) != 0 {
		t.Fatalf("records %v; want none", ks)
	}
}
