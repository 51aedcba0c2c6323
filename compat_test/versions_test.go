package compat_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/redis24"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// queueRefuser is a fault-injecting connection for difference (a) of
// docs/compat.md: the server refuses one command while it is being queued
// (as 2.4 does with an unknown command or a wrong arity), answering
// "-ERR unknown command". At 2.4 EXEC then runs the rest; at Redis 2.6.5
// and later (at24 false) EXEC answers EXECABORT and runs nothing.
type queueRefuser struct {
	inner   redis.Conn
	refuse  string // command to refuse while queueing
	at24    bool
	inMulti bool
	refused bool
	plan    []planned // one per command sent since the last flush
	sent    []string  // every command that reached the server
}

type planned struct {
	synthetic bool        // not sent: answer with reply
	replace   bool        // sent, but answer with reply
	reply     interface{} // the answer
}

func (q *queueRefuser) Send(name string, args ...interface{}) error {
	up := strings.ToUpper(name)
	switch {
	case up == "MULTI":
		q.inMulti, q.refused = true, false
	case q.inMulti && up == q.refuse:
		q.refused = true
		q.plan = append(q.plan, planned{synthetic: true, reply: redis.Error("ERR unknown command '" + strings.ToLower(name) + "'")})
		return nil
	case up == "INFO" && q.at24:
		// The version a 2.4 server gives: txn then reads the queued
		// replies before EXEC, whatever server stands behind.
		q.plan = append(q.plan, planned{replace: true, reply: "redis_version:2.4.18\r\n"})
		q.sent = append(q.sent, "PING")
		return q.inner.Send("PING")
	case up == "EXEC":
		q.inMulti = false
		if q.refused && !q.at24 {
			q.plan = append(q.plan, planned{replace: true, reply: redis.Error("EXECABORT Transaction discarded because of previous errors.")})
			q.sent = append(q.sent, "DISCARD")
			return q.inner.Send("DISCARD")
		}
	}
	q.plan = append(q.plan, planned{})
	q.sent = append(q.sent, up)
	return q.inner.Send(name, args...)
}

// DoContext is Do, after checking ctx: txn sends every round trip with a
// context.
func (q *queueRefuser) DoContext(ctx context.Context, name string, args ...interface{}) (interface{}, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return q.Do(name, args...)
}

// ReceiveContext completes redis.ConnWithContext; the tests do not use it.
func (q *queueRefuser) ReceiveContext(ctx context.Context) (interface{}, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return q.inner.Receive()
}

func (q *queueRefuser) Do(name string, args ...interface{}) (interface{}, error) {
	if name != "" {
		if err := q.Send(name, args...); err != nil {
			return nil, err
		}
		reps, err := redis.Values(q.Do(""))
		if err != nil {
			return nil, err
		}
		last := reps[len(reps)-1]
		if e, ok := last.(redis.Error); ok {
			return nil, e
		}
		return last, nil
	}
	real, err := redis.Values(q.inner.Do(""))
	if err != nil {
		return nil, err
	}
	out := make([]interface{}, 0, len(q.plan))
	for _, p := range q.plan {
		switch {
		case p.synthetic:
			out = append(out, p.reply)
		case p.replace:
			real = real[1:]
			out = append(out, p.reply)
		default:
			out = append(out, real[0])
			real = real[1:]
		}
	}
	q.plan = nil
	return out, nil
}

func (q *queueRefuser) Close() error                  { return q.inner.Close() }
func (q *queueRefuser) Err() error                    { return q.inner.Err() }
func (q *queueRefuser) Flush() error                  { return q.inner.Flush() }
func (q *queueRefuser) Receive() (interface{}, error) { return q.inner.Receive() }

// scratchServer is a server for a test outside the scenario list, with a
// fresh namespace deleted (and checked) at the end: the ENGINE_TEST_REDIS
// server when set, else a miniredis.
func scratchServer(t *testing.T) (*redistest.Server, func(string) string) {
	var srv *redistest.Server
	if os.Getenv(redistest.EnvAddr) != "" {
		srv = redistest.Start(t)
	} else {
		srv = redistest.Mini(t)
	}
	ns := redistest.Namespace(t)
	t.Cleanup(func() { checkNoKeys(t, srv, ns) })
	t.Cleanup(func() { cleanupNamespace(t, srv, ns) })
	return srv, func(s string) string { return "{" + ns + "}:" + s }
}

// TestExecAfterQueueingError is difference (a): a command refused while
// queueing is dropped and EXEC runs the rest at 2.4, while 2.6.5 and later
// abort with EXECABORT. txn.Run reports the refused command as an
// *txn.ExecError either way, and nothing is written either way: on a
// server older than 2.6.5 (or one that does not say its version, as
// miniredis) txn reads the replies to the queued commands before EXEC and
// DISCARDs. And because txn checks every command against the 2.4 rules
// before MULTI, the engine never queues one a 2.4 server would refuse for
// its form (the census of TestConformance shows it never tried); what it
// cannot foresee is a refusal for memory (txn.TestFullRedisAllOrNothing
// drives that on a real 2.4).
func TestExecAfterQueueingError(t *testing.T) {
	for _, at24 := range []bool{true, false} {
		name := map[bool]string{true: "2.4", false: "7"}[at24]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv, k := scratchServer(t)
			raw, err := dialServer(srv.Addr, serverPassword(srv))
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			q := &queueRefuser{inner: raw, refuse: "SADD", at24: at24}
			replies, err := txn.Run(context.Background(), q, nil, func(tx *txn.Tx) error {
				tx.Queue("SET", k("a"), "1")
				tx.Queue("SADD", k("s"), "x")
				tx.Queue("SET", k("b"), "2")
				return nil
			})
			var ee *txn.ExecError
			if !errors.As(err, &ee) || !ee.Queued || ee.Index != 1 || ee.Command != "SADD" {
				t.Fatalf("txn.Run = %v; want an *txn.ExecError for command 1 (SADD), refused while queueing", err)
			}
			check := srv.Admin(t)
			a, _ := redis.String(check.Do("GET", k("a")))
			b, _ := redis.String(check.Do("GET", k("b")))
			s, _ := redis.Int(check.Do("EXISTS", k("s")))
			if a != "" || b != "" || s != 0 || replies != nil {
				t.Errorf("a refused command wrote part of its transaction (2.4 behaviour simulated: %v): a=%q b=%q s exists=%d, replies %v; want nothing",
					at24, a, b, s, replies)
			}
		})
	}

	// A command 2.4 would refuse is never queued: txn refuses it before
	// MULTI, so the server sees no transaction at all.
	for _, bad := range []cmd{
		{"SET", []interface{}{"k", "v", "EX", 10}},
		{"EVAL", []interface{}{"return 1", 0}},
		{"HSET", []interface{}{"h", "a", "1", "b", "2"}},
		{"BLPOP", []interface{}{"k", "0.5"}},
	} {
		t.Run("refused-before-multi/"+bad.Name, func(t *testing.T) {
			t.Parallel()
			srv, k := scratchServer(t)
			raw, err := dialServer(srv.Addr, serverPassword(srv))
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			q := &queueRefuser{inner: raw, at24: true}
			_, err = txn.Run(context.Background(), q, nil, func(tx *txn.Tx) error {
				tx.Queue("SET", k("a"), "1")
				tx.Queue(bad.Name, bad.Args...)
				return nil
			})
			if !errors.Is(err, redis24.ErrNot24) {
				t.Errorf("txn.Run with %s: %v, want a redis24 violation", bad, err)
			}
			for _, c := range q.sent {
				if c == "MULTI" || c == "EXEC" || c == bad.Name {
					t.Errorf("sent %s although the transaction holds %s: %v", c, bad, q.sent)
				}
			}
			if n, _ := redis.Int(srv.Admin(t).Do("EXISTS", k("a"))); n != 0 {
				t.Errorf("a transaction refused before MULTI wrote something")
			}
		})
	}
}

// TestExecRuntimeError: a command that fails inside EXEC (wrong type) is
// one error element and the others ran, at 2.4 as at 7; txn.Run reports
// it as an *txn.ExecError with the replies. Run on miniredis and on the
// real server.
func TestExecRuntimeError(t *testing.T) {
	servers := map[string]func(t *testing.T) *redistest.Server{
		"miniredis": func(t *testing.T) *redistest.Server { return redistest.Mini(t) },
		"redis":     func(t *testing.T) *redistest.Server { return redistest.Start(t) },
	}
	if os.Getenv(redistest.EnvAddr) != "" {
		servers = map[string]func(t *testing.T) *redistest.Server{
			"external": func(t *testing.T) *redistest.Server { return redistest.Start(t) },
		}
	}
	for name, start := range servers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := start(t)
			ns := redistest.Namespace(t)
			t.Cleanup(func() { checkNoKeys(t, srv, ns) })
			t.Cleanup(func() { cleanupNamespace(t, srv, ns) })
			census := redis24.NewCensus()
			pool := newPool(t, srv, census, &faults{})
			c := pool.Get()
			defer c.Close()
			k := func(s string) string { return "{" + ns + "}:" + s }
			if _, err := c.Do("SET", k("str"), "x"); err != nil {
				t.Fatal(err)
			}
			replies, err := txn.Run(context.Background(), c, []string{k("str")}, func(tx *txn.Tx) error {
				tx.Queue("SET", k("a"), "1")
				tx.Queue("LPUSH", k("str"), "y")
				tx.Queue("SET", k("b"), "2")
				return nil
			})
			var ee *txn.ExecError
			if !errors.As(err, &ee) || ee.Queued || ee.Index != 1 || ee.Command != "LPUSH" || len(replies) != 3 {
				t.Fatalf("txn.Run = %d replies, %v; want an *txn.ExecError for command 1 (LPUSH) inside EXEC, 3 replies", len(replies), err)
			}
			a, _ := redis.String(c.Do("GET", k("a")))
			b, _ := redis.String(c.Do("GET", k("b")))
			if a != "1" || b != "2" {
				t.Errorf("the other commands did not run: a=%q b=%q", a, b)
			}
			if vs := census.Violations(); len(vs) > 0 {
				t.Errorf("violations: %v", vs)
			}
		})
	}
}

// fakeConn records what reaches it and answers OK.
type fakeConn struct{ got []string }

func (f *fakeConn) Do(name string, args ...interface{}) (interface{}, error) {
	if name != "" {
		f.got = append(f.got, name)
	}
	return "OK", nil
}
func (f *fakeConn) Send(name string, args ...interface{}) error {
	f.got = append(f.got, name)
	return nil
}
func (f *fakeConn) Close() error                  { return nil }
func (f *fakeConn) Err() error                    { return nil }
func (f *fakeConn) Flush() error                  { return nil }
func (f *fakeConn) Receive() (interface{}, error) { return "OK", nil }

// TestBlockingTimeoutsWholeSeconds is difference (d): 2.4 takes blocking
// timeouts in whole seconds and refuses "0.5". The guard refuses the float
// form before it is sent, and the engine's configuration only accepts
// whole-second idle waits and heartbeat TTLs; TestConformance checks that
// every BLPOP the engine sent had a whole-second timeout of at least 1.
func TestBlockingTimeoutsWholeSeconds(t *testing.T) {
	for _, args := range [][]interface{}{{"k", "0.5"}, {"k", 0.5}, {"k", "1.0"}} {
		if err := redis24.Check("BLPOP", args...); !errors.Is(err, redis24.ErrNot24) {
			t.Errorf("Check(BLPOP %v) = %v, want a violation", args, err)
		}
	}
	if err := redis24.Check("BLPOP", "k1", "k2", 1); err != nil {
		t.Errorf("Check(BLPOP k1 k2 1) = %v", err)
	}
	fake := &fakeConn{}
	census := redis24.NewCensus()
	c := redis24.Wrap(fake, redis24.WithCensus(census))
	if _, err := c.Do("BLPOP", "k", "0.5"); !errors.Is(err, redis24.ErrNot24) {
		t.Errorf("guarded BLPOP k 0.5: %v, want refused", err)
	}
	if len(fake.got) != 0 || len(census.Violations()) != 1 {
		t.Errorf("refused command reached the connection (%v) or was not recorded (%d violations)", fake.got, len(census.Violations()))
	}
	for _, cfg := range []engine.Config{
		{Advanced: engine.AdvancedConfig{IdleWait: 1500 * time.Millisecond}},
		{Advanced: engine.AdvancedConfig{IdleWait: 500 * time.Millisecond}},
		{Advanced: engine.AdvancedConfig{HeartbeatTTL: 1500 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond}},
	} {
		if err := cfg.Validate(); !errors.Is(err, engine.ErrInvalid) {
			t.Errorf("Config{IdleWait: %v, HeartbeatTTL: %v}.Validate() = %v, want ErrInvalid", cfg.Advanced.IdleWait, cfg.Advanced.HeartbeatTTL, err)
		}
	}
}
