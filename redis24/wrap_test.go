package redis24_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/bucketq/bucketq/redis24"
	"github.com/gomodule/redigo/redis"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dialWrapped dials m and wraps the connection, collecting violations.
func dialWrapped(t *testing.T, m *miniredis.Miniredis, census *redis24.Census) (redis.Conn, func() []*redis24.Violation) {
	t.Helper()
	raw, err := redis.Dial("tcp", m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []*redis24.Violation
	c := redis24.Wrap(raw, redis24.WithCensus(census), redis24.OnViolation(func(v *redis24.Violation) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, v)
	}))
	t.Cleanup(func() { c.Close() })
	return c, func() []*redis24.Violation {
		mu.Lock()
		defer mu.Unlock()
		return append([]*redis24.Violation(nil), seen...)
	}
}

func TestWrapRefusesWithoutSending(t *testing.T) {
	m := miniredis.RunT(t)
	census := redis24.NewCensus()
	c, seen := dialWrapped(t, m, census)

	_, err := c.Do("SET", "k", "v", "EX", 10)
	var v *redis24.Violation
	if !errors.As(err, &v) || !errors.Is(err, redis24.ErrNot24) {
		t.Fatalf("Do(SET k v EX 10) = %v, want a *Violation", err)
	}
	if !strings.HasPrefix(v.Caller, "redis24/wrap_test.go:") {
		t.Errorf("Caller = %q, want redis24/wrap_test.go:N", v.Caller)
	}
	if m.Exists("k") {
		t.Error("key k exists: the refused SET reached the server")
	}
	if n := m.CommandCount(); n != 0 {
		t.Errorf("server saw %d commands, want 0", n)
	}
	if got := seen(); len(got) != 1 || got[0] != v {
		t.Errorf("OnViolation saw %v, want exactly the returned violation", got)
	}
	if err := c.Send("EVAL", "return 1", 0); !errors.Is(err, redis24.ErrNot24) {
		t.Errorf("Send(EVAL) = %v, want a violation", err)
	}

	if _, err := c.Do("SET", "k", "v"); err != nil {
		t.Fatalf("Do(SET k v) = %v", err)
	}
	if got, _ := m.Get("k"); got != "v" {
		t.Errorf("k = %q, want v", got)
	}
	if got := census.Commands(); strings.Join(got, ",") != "eval,set" {
		t.Errorf("census commands = %v, want [eval set]", got)
	}
	if got := census.Outside24(); len(got) != 1 || got[0] != "eval" {
		t.Errorf("census Outside24 = %v, want [eval]", got)
	}
	if n := len(census.Violations()); n != 2 {
		t.Errorf("census has %d violations, want 2", n)
	}
	if n := census.Count("SET"); n != 2 {
		t.Errorf("census counted SET %d times, want 2", n)
	}
}

func TestWrapRefusesInsideMulti(t *testing.T) {
	m := miniredis.RunT(t)
	c, _ := dialWrapped(t, m, nil)

	if _, err := c.Do("MULTI"); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Do("SET", "a", "1"); err != nil || r != "QUEUED" {
		t.Fatalf("SET a 1 in MULTI = %v, %v", r, err)
	}
	if _, err := c.Do("SET", "b", "2", "EX", 10); !errors.Is(err, redis24.ErrNot24) {
		t.Fatalf("SET b 2 EX 10 in MULTI = %v, want a violation", err)
	}
	if err := c.Send("LPOP", "q", 2); !errors.Is(err, redis24.ErrNot24) {
		t.Fatalf("Send(LPOP q 2) in MULTI = %v, want a violation", err)
	}
	r, err := redis.Values(c.Do("EXEC"))
	if err != nil || len(r) != 1 {
		t.Fatalf("EXEC = %v, %v; want one reply", r, err)
	}
	if m.Exists("b") || !m.Exists("a") {
		t.Errorf("after EXEC: a exists %v (want true), b exists %v (want false)", m.Exists("a"), m.Exists("b"))
	}
}

func TestWrapThroughPoolWithTimeoutAndContext(t *testing.T) {
	m := miniredis.RunT(t)
	census := redis24.NewCensus()
	pool := &redis.Pool{
		MaxIdle: 4,
		Dial: func() (redis.Conn, error) {
			c, err := redis.Dial("tcp", m.Addr(), redis.DialReadTimeout(2*time.Second))
			if err != nil {
				return nil, err
			}
			return redis24.Wrap(c, redis24.WithCensus(census)), nil
		},
	}
	defer pool.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pool.GetContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	if _, err := redis.DoWithTimeout(conn, time.Second, "RPUSH", "q", "x"); err != nil {
		t.Fatalf("DoWithTimeout(RPUSH) = %v", err)
	}
	got, err := redis.Strings(redis.DoWithTimeout(conn, 3*time.Second, "BLPOP", "q", 1))
	if err != nil || len(got) != 2 || got[1] != "x" {
		t.Fatalf("DoWithTimeout(BLPOP q 1) = %v, %v", got, err)
	}
	if _, err := redis.DoWithTimeout(conn, time.Second, "BLPOP", "q", 0.5); !errors.Is(err, redis24.ErrNot24) {
		t.Errorf("DoWithTimeout(BLPOP q 0.5) = %v, want a violation", err)
	}
	if _, err := redis.DoContext(conn, ctx, "SET", "k", "v"); err != nil {
		t.Fatalf("DoContext(SET) = %v", err)
	}
	if s, err := redis.String(redis.DoContext(conn, ctx, "GET", "k")); err != nil || s != "v" {
		t.Errorf("DoContext(GET) = %q, %v", s, err)
	}
	if _, err := redis.DoContext(conn, ctx, "GETDEL", "k"); !errors.Is(err, redis24.ErrNot24) {
		t.Errorf("DoContext(GETDEL) = %v, want a violation", err)
	}
	if _, err := redis.ReceiveWithTimeout(conn, time.Millisecond); err == nil {
		t.Error("ReceiveWithTimeout with nothing pending succeeded")
	}
	if v := census.Violations(); len(v) != 2 {
		t.Errorf("census has %v, want 2 violations", v)
	}
}

// plainConn hides the timeout and context methods of a redigo conn.
type plainConn struct{ redis.Conn }

func TestWrapFallsBackWithoutTimeoutSupport(t *testing.T) {
	m := miniredis.RunT(t)
	raw, err := redis.Dial("tcp", m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c := redis24.Wrap(plainConn{raw})
	defer c.Close()
	if _, err := redis.DoWithTimeout(c, time.Second, "SET", "k", "v"); err != nil {
		t.Errorf("DoWithTimeout fallback = %v", err)
	}
	if s, err := redis.String(redis.DoContext(c, context.Background(), "GET", "k")); err != nil || s != "v" {
		t.Errorf("DoContext fallback = %q, %v", s, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := redis.DoContext(c, ctx, "GET", "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("DoContext with cancelled ctx = %v, want context.Canceled", err)
	}
}

func TestCensusConcurrent(t *testing.T) {
	census := redis24.NewCensus()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				census.Record("GET")
				census.Record("set")
				census.RecordViolation(&redis24.Violation{Command: "EVAL"})
				_ = census.Commands()
				_ = census.Violations()
			}
		}()
	}
	wg.Wait()
	if got := census.Commands(); strings.Join(got, ",") != "get,set" {
		t.Errorf("Commands = %v", got)
	}
	if n := census.Count("get"); n != 800 {
		t.Errorf("Count(get) = %d, want 800", n)
	}
	if n := len(census.Violations()); n != 800 {
		t.Errorf("%d violations, want 800", n)
	}
	var zero redis24.Census
	zero.Record("")
	if len(zero.Commands()) != 0 || len(zero.Outside24()) != 0 {
		t.Error("zero Census is not empty")
	}
}

// TestWrapAuthUser: AUTH user password is the 6.0 form, refused unless
// AllowAuthUser was asked for; with it, only that form is let through.
func TestWrapAuthUser(t *testing.T) {
	m := miniredis.RunT(t)
	m.RequireUserAuth("app", "pw")
	for _, allow := range []bool{false, true} {
		raw, err := redis.Dial("tcp", m.Addr())
		if err != nil {
			t.Fatal(err)
		}
		var opts []redis24.Option
		if allow {
			opts = append(opts, redis24.AllowAuthUser())
		}
		c := redis24.Wrap(raw, opts...)
		_, err = c.Do("AUTH", "app", "pw")
		var v *redis24.Violation
		if refused := errors.As(err, &v); refused == allow {
			t.Errorf("AllowAuthUser %v: AUTH app pw = %v", allow, err)
		}
		if _, err := c.Do("AUTH", "a", "b", "c"); !errors.As(err, &v) {
			t.Errorf("AllowAuthUser %v: AUTH with three arguments = %v, want a *Violation", allow, err)
		}
		if _, err := c.Do("SET", "k", "v", "EX", 10); !errors.As(err, &v) {
			t.Errorf("AllowAuthUser %v: SET EX = %v, want a *Violation", allow, err)
		}
		c.Close()
	}
}

// okConn answers every command with OK.
type okConn struct{ redis.Conn }

func (okConn) Do(string, ...interface{}) (interface{}, error) { return "OK", nil }

func TestWrapForModeLetsOnlyThatModesForms(t *testing.T) {
	cases := []struct {
		mode redis24.Mode
		cmd  string
		args []interface{}
		ok   bool
	}{
		{redis24.ModeCluster, "CLUSTER", []interface{}{"SLOTS"}, true},
		{redis24.ModeCluster, "CLUSTER", []interface{}{"RESET"}, false},
		{redis24.ModeCluster, "ROLE", nil, false},
		{redis24.ModeSentinel, "ROLE", nil, true},
		{redis24.ModeSentinel, "INFO", []interface{}{"replication"}, true},
		{redis24.ModeSentinel, "SENTINEL", []interface{}{"get-master-addr-by-name", "m"}, true},
		{redis24.ModeSentinel, "SENTINEL", []interface{}{"failover", "m"}, false},
		{redis24.ModeSentinel, "CLUSTER", []interface{}{"SLOTS"}, false},
		{"", "CLUSTER", []interface{}{"SLOTS"}, false},
		{"", "ROLE", nil, false},
		{redis24.ModeCluster, "GET", []interface{}{"k"}, true},
	}
	for _, c := range cases {
		var opts []redis24.Option
		if c.mode != "" {
			opts = append(opts, redis24.ForMode(c.mode))
		}
		w := redis24.Wrap(plainConn{okConn{}}, opts...)
		_, err := w.Do(c.cmd, c.args...)
		if got := err == nil; got != c.ok {
			t.Errorf("mode %q: %s %v: allowed %v, want %v (err %v)", c.mode, c.cmd, c.args, got, c.ok, err)
		}
		if !c.ok && !errors.Is(err, redis24.ErrNot24) {
			t.Errorf("mode %q: %s refused with %v, want a redis24 violation", c.mode, c.cmd, err)
		}
	}
}
