package compat_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// cmd is one command as a connection sent it.
type cmd struct {
	Name string
	Args []interface{}
}

func (c cmd) is(name string) bool { return strings.EqualFold(c.Name, name) }

func (c cmd) String() string {
	parts := []string{strings.ToUpper(c.Name)}
	for _, a := range c.Args {
		parts = append(parts, argString(a))
	}
	return strings.Join(parts, " ")
}

// argString formats an argument the way redigo sends it (near enough for
// strings, byte slices and numbers, which is all the engine sends).
func argString(a interface{}) string {
	switch a := a.(type) {
	case string:
		return a
	case []byte:
		return string(a)
	case nil:
		return ""
	default:
		return fmt.Sprint(a)
	}
}

// txnView is what a fault hook sees of one transaction about to be sent:
// the keys WATCHed on the connection since its last EXEC, UNWATCH or
// DISCARD, and the commands queued between MULTI and EXEC.
type txnView struct {
	Watched []string
	Queued  []cmd
}

// watches reports whether one of the watched keys ends with suffix.
func (v txnView) watches(suffix string) bool {
	for _, k := range v.Watched {
		if strings.HasSuffix(k, suffix) {
			return true
		}
	}
	return false
}

// queues reports whether a command named name is queued.
func (v txnView) queues(name string) bool {
	for _, c := range v.Queued {
		if c.is(name) {
			return true
		}
	}
	return false
}

// faults is the fault-injection seam of one pool. Its hooks see every
// transaction the pool's connections send (MULTI, the queued commands and
// EXEC travel in one flush, after the WATCHed reads) and every command with
// its reply. The zero value injects nothing and only watches.
type faults struct {
	mu sync.Mutex
	// beforeExec runs just before a MULTI...EXEC is flushed: between the
	// transaction's WATCHed reads and its EXEC.
	beforeExec func(v txnView)
	// failExec, when it returns an error, drops the transaction unsent and
	// breaks the connection with that error, as a lost connection would.
	failExec func(v txnView) error
	// replayNilExec simulates a server that would not have aborted the
	// transaction: when EXEC answers nil and it returns true, the queued
	// commands are sent again in a MULTI/EXEC without WATCH, and that reply
	// stands in for the nil one. That is what Redis 2.4 does where Redis 7
	// aborts (an expired watched key; RPOPLPUSH creating the destination).
	replayNilExec func(v txnView) bool
	// beforeDo runs before a command is sent with Do (not Send); afterDo
	// after it got its reply.
	beforeDo func(c cmd)
	afterDo  func(c cmd, reply interface{})

	args *argCensus // where argument forms are recorded; may be nil

	execs    atomic.Int64 // transactions flushed
	nilExecs atomic.Int64 // EXEC answered nil (a watched key changed)
	replays  atomic.Int64 // nil EXECs replayed by replayNilExec
}

func (f *faults) hooks() (before func(txnView), fail func(txnView) error, replay func(txnView) bool, after func(cmd, interface{})) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.beforeExec, f.failExec, f.replayNilExec, f.afterDo
}

func (f *faults) doHook() func(cmd) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.beforeDo
}

// set changes the hooks under the lock; set(nil) clears them all.
func (f *faults) set(change func(f *faults)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if change == nil {
		f.beforeExec, f.failExec, f.replayNilExec, f.beforeDo, f.afterDo = nil, nil, nil, nil, nil
		return
	}
	change(f)
}

// wrap puts the seam in front of inner (a redis24-guarded connection).
func (f *faults) wrap(inner redis.Conn) redis.Conn { return &spyConn{inner: inner, f: f} }

// spyConn tracks the transaction state of one connection for the hooks.
// Commands may be pipelined: a flush can carry several transactions (the
// dispatcher sends one EXEC with the next transaction's WATCH and reads),
// so each EXEC's position among the pending replies is remembered. Like any
// redigo connection it is used by one goroutine at a time.
type spyConn struct {
	inner   redis.Conn
	f       *faults
	watched []string
	inMulti bool
	queued  []cmd
	pending int       // replies owed for commands sent since the last flush
	txns    []pendTxn // transactions among them
	broken  error
}

// pendTxn is a transaction sent but not yet flushed; exec is the position
// of its EXEC's reply among the pending replies.
type pendTxn struct {
	view txnView
	exec int
}

var (
	_ redis.ConnWithTimeout = (*spyConn)(nil)
	_ redis.ConnWithContext = (*spyConn)(nil)
)

func (c *spyConn) note(name string, args []interface{}) {
	if name == "" {
		return
	}
	cm := cmd{Name: name, Args: args}
	if c.f.args != nil {
		c.f.args.record(cm, c.inMulti)
		c.f.args.senders.record(name)
	}
	c.pending++
	switch strings.ToUpper(name) {
	case "WATCH":
		for _, a := range args {
			c.watched = append(c.watched, argString(a))
		}
	case "UNWATCH":
		c.watched = nil
	case "DISCARD":
		c.watched, c.inMulti, c.queued = nil, false, nil
	case "MULTI":
		c.inMulti, c.queued = true, nil
	case "EXEC":
		c.txns = append(c.txns, pendTxn{view: txnView{Watched: c.watched, Queued: c.queued}, exec: c.pending - 1})
		c.watched, c.inMulti, c.queued = nil, false, nil
	default:
		if c.inMulti {
			c.queued = append(c.queued, cm)
		}
	}
}

func (c *spyConn) Send(name string, args ...interface{}) error {
	if c.broken != nil {
		return c.broken
	}
	c.note(name, args)
	return c.inner.Send(name, args...)
}

// flush sends what is buffered and returns every pending reply, running the
// transaction hooks for each EXEC among them.
func (c *spyConn) flush() (interface{}, error) {
	if c.broken != nil {
		return nil, c.broken
	}
	txns := c.txns
	c.txns, c.pending = nil, 0
	if len(txns) == 0 {
		return c.inner.Do("")
	}
	before, fail, replay, _ := c.f.hooks()
	for _, tx := range txns {
		if fail != nil {
			if err := fail(tx.view); err != nil {
				c.broken = err
				c.inner.Close()
				return nil, err
			}
		}
		if before != nil {
			before(tx.view)
		}
	}
	c.f.execs.Add(int64(len(txns)))
	rep, err := c.inner.Do("")
	reps, ok := rep.([]interface{})
	if err != nil || !ok {
		return rep, err
	}
	for _, tx := range txns {
		if tx.exec >= len(reps) || reps[tx.exec] != nil {
			continue
		}
		c.f.nilExecs.Add(1)
		if replay == nil || !replay(tx.view) {
			continue
		}
		// What 2.4 would have done: run the queued commands anyway.
		again, err := c.replay(tx.view.Queued)
		if err != nil {
			return nil, err
		}
		c.f.replays.Add(1)
		reps[tx.exec] = again
	}
	return reps, nil
}

func (c *spyConn) replay(queued []cmd) (interface{}, error) {
	if err := c.inner.Send("MULTI"); err != nil {
		return nil, err
	}
	for _, q := range queued {
		if err := c.inner.Send(q.Name, q.Args...); err != nil {
			return nil, err
		}
	}
	if err := c.inner.Send("EXEC"); err != nil {
		return nil, err
	}
	all, err := redis.Values(c.inner.Do(""))
	if err != nil {
		return nil, err
	}
	return all[len(all)-1], nil
}

// doVia sends one command with do, through the flush when transactions are
// pending (so their hooks run), like redigo's Do: the last reply, and the
// first error reply as the error.
func (c *spyConn) doVia(name string, args []interface{}, do func() (interface{}, error)) (interface{}, error) {
	if c.broken != nil {
		return nil, c.broken
	}
	if name == "" {
		return c.flush()
	}
	if len(c.txns) > 0 || strings.EqualFold(name, "EXEC") {
		if err := c.Send(name, args...); err != nil {
			return nil, err
		}
		reps, err := redis.Values(c.flush())
		if err != nil {
			return nil, err
		}
		for _, r := range reps {
			if e, ok := r.(redis.Error); ok {
				return reps[len(reps)-1], e
			}
		}
		return reps[len(reps)-1], nil
	}
	c.note(name, args)
	c.pending = 0
	cm := cmd{Name: name, Args: args}
	if before := c.f.doHook(); before != nil {
		before(cm)
	}
	rep, err := do()
	if _, _, _, after := c.f.hooks(); after != nil {
		after(cm, rep)
	}
	return rep, err
}

func (c *spyConn) Do(name string, args ...interface{}) (interface{}, error) {
	return c.doVia(name, args, func() (interface{}, error) { return c.inner.Do(name, args...) })
}

func (c *spyConn) DoWithTimeout(d time.Duration, name string, args ...interface{}) (interface{}, error) {
	return c.doVia(name, args, func() (interface{}, error) { return redis.DoWithTimeout(c.inner, d, name, args...) })
}

func (c *spyConn) DoContext(ctx context.Context, name string, args ...interface{}) (interface{}, error) {
	if err := ctx.Err(); err != nil {
		// As redigo's DoContext: a call whose context has already ended
		// leaves the connection unusable. Returning early with commands
		// Sent before it still buffered would hand the next user their
		// replies with its own.
		if c.broken == nil {
			c.broken = err
			c.inner.Close()
		}
		return nil, err
	}
	return c.doVia(name, args, func() (interface{}, error) { return redis.DoContext(c.inner, ctx, name, args...) })
}

func (c *spyConn) Receive() (interface{}, error) { return c.inner.Receive() }
func (c *spyConn) ReceiveWithTimeout(d time.Duration) (interface{}, error) {
	return redis.ReceiveWithTimeout(c.inner, d)
}
func (c *spyConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(c.inner, ctx)
}
func (c *spyConn) Flush() error { return c.inner.Flush() }
func (c *spyConn) Close() error { return c.inner.Close() }
func (c *spyConn) Err() error {
	if c.broken != nil {
		return c.broken
	}
	return c.inner.Err()
}

// errLostConnection is what failExec hooks return to drop a transaction.
var errLostConnection = errors.New("compat: simulated lost connection")

// argCensus records the argument forms that matter for the Redis 2.4
// differences the engine touches, across every pool of one server kind.
type argCensus struct {
	mu            sync.Mutex
	blockTimeouts map[string]int  // last argument of BLPOP/BRPOP/BRPOPLPUSH, as sent
	blockingKinds map[string]bool // kinds of keys clients block on
	watchedKinds  map[string]bool // kinds of keys WATCHed
	renameDests   map[string]bool // kinds of RENAME destinations
	blockInMulti  []string        // blocking commands queued inside MULTI
	ttlArgs       map[string]int  // TTL arguments of SETEX/EXPIRE
	senders       senders         // engine functions that sent each command
}

func newArgCensus() *argCensus {
	return &argCensus{
		blockTimeouts: map[string]int{}, blockingKinds: map[string]bool{},
		watchedKinds: map[string]bool{}, renameDests: map[string]bool{}, ttlArgs: map[string]int{},
	}
}

// keyKind is the schema part of an engine key: "{ns}:q:default" is "q".
func keyKind(k string) string {
	if i := strings.Index(k, "}:"); i >= 0 {
		k = k[i+2:]
	}
	if i := strings.IndexByte(k, ':'); i >= 0 {
		k = k[:i]
	}
	return k
}

func (a *argCensus) record(c cmd, inMulti bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch strings.ToUpper(c.Name) {
	case "BLPOP", "BRPOP":
		if inMulti {
			a.blockInMulti = append(a.blockInMulti, c.String())
		}
		if len(c.Args) > 0 {
			a.blockTimeouts[argString(c.Args[len(c.Args)-1])]++
			for _, k := range c.Args[:len(c.Args)-1] {
				a.blockingKinds[keyKind(argString(k))] = true
			}
		}
	case "BRPOPLPUSH":
		if inMulti {
			a.blockInMulti = append(a.blockInMulti, c.String())
		}
		if len(c.Args) == 3 {
			a.blockTimeouts[argString(c.Args[2])]++
			a.blockingKinds[keyKind(argString(c.Args[0]))] = true
		}
	case "WATCH":
		for _, k := range c.Args {
			a.watchedKinds[keyKind(argString(k))] = true
		}
	case "RENAME", "RENAMENX":
		if len(c.Args) == 2 {
			a.renameDests[keyKind(argString(c.Args[1]))] = true
		}
	case "SETEX", "EXPIRE":
		if len(c.Args) >= 2 {
			a.ttlArgs[argString(c.Args[1])]++
		}
	}
}

// The seam behaves as redigo's connection when a call's context has
// already ended: the connection is unusable after it, so commands Sent
// before that call cannot answer the next user of a pooled connection.
func TestSpyEndedContextBreaks(t *testing.T) {
	srv := redistest.Start(t)
	ns := redistest.Namespace(t) // the server may be the shared one
	t.Cleanup(func() { checkNoKeys(t, srv, ns) })
	t.Cleanup(func() { cleanupNamespace(t, srv, ns) })
	key := ns + ":spy"
	inner, err := dialServer(srv.Addr, serverPassword(srv))
	if err != nil {
		t.Fatal(err)
	}
	c := (&faults{}).wrap(inner)
	defer c.Close()
	if err := c.Send("SET", key, "v"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := redis.DoContext(c, ctx, "GET", key); !errors.Is(err, context.Canceled) {
		t.Fatalf("DoContext on an ended context: %v, want context.Canceled", err)
	}
	if c.Err() == nil {
		t.Fatal("the connection is still usable after a call whose context had ended")
	}
	if _, err := c.Do("PING"); err == nil {
		t.Fatal("a command went through the connection after a call whose context had ended")
	}
}
