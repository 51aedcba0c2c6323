package route_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/bucketq/bucketq/internal/route"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// world is a toy cluster of one slot: the node at owner serves it, the
// others answer MOVED; data is shared (the slot's keys move with it).
type world struct {
	mu      sync.Mutex
	owner   string
	data    map[string]int
	tryLeft int              // TRYAGAIN answers still to give
	after   func(cmd string) // runs after each command a node ran
	ran     map[string]int   // commands run per node
}

func newWorld(owner string) *world {
	return &world{owner: owner, data: map[string]int{}, ran: map[string]int{}}
}

// node is one connection to the node at addr.
type node struct {
	w       *world
	addr    string
	pending [][]interface{}
	multi   bool
	queued  [][]interface{}
	abort   bool
	watched map[string]int
	closed  bool
}

func (n *node) Close() error                                        { n.closed = true; return nil }
func (n *node) Err() error                                          { return nil }
func (n *node) Flush() error                                        { return nil }
func (n *node) Receive() (interface{}, error)                       { return nil, errors.New("not used") }
func (n *node) ReceiveContext(context.Context) (interface{}, error) { return n.Receive() }
func (n *node) Send(name string, args ...interface{}) error {
	n.pending = append(n.pending, append([]interface{}{name}, args...))
	return nil
}
func (n *node) Do(name string, args ...interface{}) (interface{}, error) {
	return n.DoContext(context.Background(), name, args...)
}
func (n *node) DoContext(_ context.Context, name string, args ...interface{}) (interface{}, error) {
	if name != "" {
		_ = n.Send(name, args...)
	}
	var reps []interface{}
	for _, c := range n.pending {
		reps = append(reps, n.run(c))
	}
	n.pending = nil
	if name == "" {
		return reps, nil
	}
	for _, r := range reps {
		if e, ok := r.(redis.Error); ok {
			return reps[len(reps)-1], e
		}
	}
	return reps[len(reps)-1], nil
}

func (n *node) run(c []interface{}) interface{} {
	w := n.w
	w.mu.Lock()
	name := strings.ToUpper(c[0].(string))
	rep := n.exec(name, c[1:])
	after := w.after
	w.mu.Unlock()
	if after != nil {
		after(n.addr + " " + name)
	}
	return rep
}

// exec runs one command with w.mu held.
func (n *node) exec(name string, args []interface{}) interface{} {
	w := n.w
	keyed := name != "MULTI" && name != "EXEC" && name != "DISCARD" && name != "UNWATCH" && name != "PING"
	if keyed && w.owner != n.addr {
		if n.multi {
			n.abort = true
		}
		return redis.Error("MOVED 1 " + w.owner)
	}
	if keyed && w.tryLeft > 0 {
		w.tryLeft--
		if n.multi {
			n.abort = true
		}
		return redis.Error("TRYAGAIN Multiple keys request during rehashing of slot")
	}
	if n.multi && name != "EXEC" && name != "DISCARD" {
		n.queued = append(n.queued, append([]interface{}{name}, args...))
		return "QUEUED"
	}
	w.ran[n.addr]++
	switch name {
	case "WATCH":
		if n.watched == nil {
			n.watched = map[string]int{}
		}
		for _, k := range args {
			n.watched[k.(string)] = w.data[k.(string)]
		}
		return "OK"
	case "UNWATCH":
		n.watched = nil
		return "OK"
	case "MULTI":
		n.multi, n.queued, n.abort = true, nil, false
		return "OK"
	case "EXEC":
		n.multi = false
		watched := n.watched
		n.watched = nil
		if n.abort {
			return redis.Error("EXECABORT Transaction discarded because of previous errors.")
		}
		if w.owner != n.addr {
			return redis.Error("MOVED 1 " + w.owner)
		}
		for k, v := range watched {
			if w.data[k] != v {
				return nil
			}
		}
		var out []interface{}
		for _, q := range n.queued {
			out = append(out, n.exec(strings.ToUpper(q[0].(string)), q[1:]))
		}
		return out
	case "GET":
		return int64(w.data[args[0].(string)])
	case "INCR":
		w.data[args[0].(string)]++
		return int64(w.data[args[0].(string)])
	case "SET":
		v := 0
		fmt.Sscan(fmt.Sprint(args[1]), &v)
		w.data[args[0].(string)] = v
		return "OK"
	case "PING":
		return "PONG"
	}
	return redis.Error("ERR unknown command " + name)
}

// target believes the slot is at known until a MOVED says otherwise.
type target struct {
	w     *world
	mu    sync.Mutex
	known string
	dials []string
}

func (t *target) Addr(context.Context) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.known, nil
}

func (t *target) Dial(_ context.Context, addr string) (redis.Conn, error) {
	t.mu.Lock()
	t.dials = append(t.dials, addr)
	t.mu.Unlock()
	return &node{w: t.w, addr: addr}, nil
}

func (t *target) Judge(_ context.Context, e redis.Error, _ string) route.Verdict {
	f := strings.Fields(string(e))
	switch f[0] {
	case "MOVED":
		t.mu.Lock()
		t.known = f[2]
		t.mu.Unlock()
		return route.Follow
	case "TRYAGAIN":
		return route.Wait
	}
	return route.Keep
}

var fast = route.Options{MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}

func dial(t *testing.T, tg *target) *route.Conn {
	t.Helper()
	c, err := route.Dial(context.Background(), tg, fast)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A lone command answered MOVED is sent again to the new master, once.
func TestLoneCommandFollowsMoved(t *testing.T) {
	w := newWorld("b")
	tg := &target{w: w, known: "a"}
	c := dial(t, tg)
	n, err := redis.Int(c.Do("INCR", "k"))
	if err != nil || n != 1 {
		t.Fatalf("INCR = %d, %v; want 1, nil", n, err)
	}
	if c.Addr() != "b" || w.ran["a"] != 0 || w.data["k"] != 1 {
		t.Errorf("conn at %q, ran on a %d times, k=%d; want b, 0, 1", c.Addr(), w.ran["a"], w.data["k"])
	}
}

// TRYAGAIN waits and tries again.
func TestLoneCommandWaitsOnTryAgain(t *testing.T) {
	w := newWorld("a")
	w.tryLeft = 3
	c := dial(t, &target{w: w, known: "a"})
	if n, err := redis.Int(c.Do("INCR", "k")); err != nil || n != 1 {
		t.Fatalf("INCR = %d, %v; want 1, nil", n, err)
	}
}

// A transaction whose slot moves between its reads and its EXEC is aborted
// whole by the server, reported as not run, and run again whole on the
// new master by txn.Runner.Run: the increment happens once.
func TestTransactionRunAgainWholeAfterMoved(t *testing.T) {
	w := newWorld("a")
	tg := &target{w: w, known: "a"}
	c := dial(t, tg)
	moved := false
	w.after = func(cmd string) {
		if cmd == "a GET" && !moved {
			moved = true
			w.mu.Lock()
			w.owner = "b"
			w.mu.Unlock()
		}
	}
	attempts := 0
	var r txn.Runner
	_, err := r.Run(context.Background(), c, []string{"k"}, func(tx *txn.Tx) error {
		attempts++
		v, err := redis.Int(tx.Do("GET", "k"))
		if err != nil {
			return err
		}
		tx.Queue("SET", "k", v+1)
		return nil
	})
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	if attempts != 2 || w.data["k"] != 1 || c.Addr() != "b" {
		t.Errorf("attempts %d, k=%d, conn at %q; want 2 attempts, k=1, at b", attempts, w.data["k"], c.Addr())
	}
}

// A batch in which a write ran before a redirection is not reported as not
// run: its replies come back as they are, and nothing is sent again.
func TestBatchThatWroteIsNotRunAgain(t *testing.T) {
	w := newWorld("a")
	tg := &target{w: w, known: "a"}
	c := dial(t, tg)
	w.after = func(cmd string) {
		if cmd == "a INCR" {
			w.mu.Lock()
			w.owner = "b"
			w.mu.Unlock()
		}
	}
	_ = c.Send("INCR", "k")
	_ = c.Send("GET", "k")
	reps, err := redis.Values(c.Do(""))
	if err != nil || errors.Is(err, txn.ErrNotRun) {
		t.Fatalf("Do = %v, %v; want the replies", reps, err)
	}
	if _, ok := reps[1].(redis.Error); !ok || w.data["k"] != 1 {
		t.Errorf("replies %v, k=%d; want the MOVED in place and k=1", reps, w.data["k"])
	}
	// The next batch goes to the new master.
	w.after = nil
	if n, err := redis.Int(c.Do("GET", "k")); err != nil || n != 1 || c.Addr() != "b" {
		t.Errorf("GET = %d, %v at %q; want 1 at b", n, err, c.Addr())
	}
}

// A pipelined read batch that meets MOVED fails with ErrNotRun and drops a
// WATCH left open on the old node.
func TestReadBatchNotRun(t *testing.T) {
	w := newWorld("b")
	tg := &target{w: w, known: "a"}
	c := dial(t, tg)
	_ = c.Send("WATCH", "k")
	_, err := c.Do("GET", "k")
	var nr *route.NotRunError
	if !errors.Is(err, txn.ErrNotRun) || !errors.As(err, &nr) {
		t.Fatalf("Do = %v; want a *NotRunError matching txn.ErrNotRun", err)
	}
	var re redis.Error
	if !errors.As(err, &re) || !strings.HasPrefix(string(re), "MOVED") {
		t.Errorf("the error does not carry the server's reply: %v", err)
	}
	if n, err := redis.Int(c.Do("GET", "k")); err != nil || n != 0 || c.Addr() != "b" {
		t.Errorf("GET after = %d, %v at %q; want 0 at b", n, err, c.Addr())
	}
}

// Pipelined commands outside a transaction that meet MOVED before any of
// them ran are sent again, whole, to the new master.
func TestPipelineOutsideTransactionFollowsMoved(t *testing.T) {
	w := newWorld("b")
	c := dial(t, &target{w: w, known: "a"})
	_ = c.Send("INCR", "k")
	_ = c.Send("GET", "k")
	reps, err := redis.Values(c.Do(""))
	if err != nil || len(reps) != 2 {
		t.Fatalf("Do = %v, %v", reps, err)
	}
	if n, _ := redis.Int(reps[1], nil); n != 1 || w.data["k"] != 1 || w.ran["a"] != 0 {
		t.Errorf("GET = %v, k=%d, ran on a %d times; want 1, 1, 0", reps[1], w.data["k"], w.ran["a"])
	}
}

// mini routes to one miniredis.
type mini struct{ addr string }

func (m mini) Addr(context.Context) (string, error) { return m.addr, nil }
func (m mini) Dial(ctx context.Context, addr string) (redis.Conn, error) {
	return redis.DialContext(ctx, "tcp", addr)
}
func (mini) Judge(context.Context, redis.Error, string) route.Verdict { return route.Keep }

// Close from another goroutine ends a blocking wait, as the engine's
// blocking pops rely on (run with -race).
func TestCloseEndsABlockedCall(t *testing.T) {
	m := miniredis.RunT(t)
	c, err := route.Dial(context.Background(), mini{m.Addr()}, fast)
	if err != nil {
		t.Fatal(err)
	}
	sent := m.CommandCount()
	done := make(chan error, 1)
	go func() {
		_, err := redis.DoWithTimeout(c, 10*time.Second, "BLPOP", "q", 5)
		done <- err
	}()
	// Close once the server has the BLPOP (the test holds either way).
	testwait.Until(t, 5*time.Second, "the BLPOP to reach the server", func() bool { return m.CommandCount() > sent })
	c.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("BLPOP on a closed connection returned no error")
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Close did not end the blocked BLPOP")
	}
	if c.Err() == nil {
		t.Errorf("Err() = nil after Close")
	}
}
