package redistest

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/bucketq/bucketq/internal/minihook"
	"github.com/bucketq/bucketq/internal/redisinfo"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/bucketq/bucketq/redis24"
	"github.com/gomodule/redigo/redis"
)

// Dial timeouts of Pool and Admin connections. Blocking commands should be
// sent with redis.DoWithTimeout; the read timeout covers everything else.
const (
	ConnectTimeout = 5 * time.Second
	ReadTimeout    = 10 * time.Second
	WriteTimeout   = 10 * time.Second
)

// adminCommand is the command an Admin connection sends to a miniredis so that
// the 2.4 hook lets everything from that connection through.
const adminCommand = "REDISTEST-ADMIN"

// reporter reports violations to t, but never after t has finished: a
// violation seen by a goroutine that outlives the test is dropped.
type reporter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func newReporter(t testing.TB) *reporter {
	r := &reporter{t: t}
	// Registered first so that it runs last, after the other cleanups.
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.done = true
	})
	return r
}

// fail reports err to t, unless t has finished.
func (r *reporter) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.done {
		r.t.Errorf("%v", err)
	}
}

func (r *reporter) violation(v *redis24.Violation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.done {
		r.t.Errorf("redistest: command not valid for Redis 2.4: %v (command: %s %s)", v, v.Command, strings.Join(v.Args, " "))
	}
}

// Mini returns a miniredis for t (stopped in t.Cleanup) whose pre-hook
// refuses every command or argument form that redis24.Check refuses, records
// it in the census and fails t. Connections from [Server.Admin] are exempt.
// Remember that miniredis is not Redis 2.4 (see the redis24 notes); use it
// for fast tests of retry loops and single-consumer pops.
func Mini(t testing.TB) *Server {
	t.Helper()
	rep := newReporter(t)
	m := miniredis.RunT(t)
	s := &Server{Addr: m.Addr(), Kind: KindMiniredis, Mini: m, Census: redis24.NewCensus(), adminToken: randomHex(8)}
	check := minihook.Hook(func(v *redis24.Violation) {
		s.Census.RecordViolation(v)
		rep.violation(v)
	})
	var admins sync.Map // *server.Peer -> struct{}
	m.Server().SetPreHook(func(p *server.Peer, cmd string, args ...string) bool {
		if cmd == adminCommand && len(args) == 1 && args[0] == s.adminToken {
			admins.Store(p, struct{}{})
			p.OnDisconnect(func() { admins.Delete(p) })
			p.WriteOK()
			return true
		}
		if _, ok := admins.Load(p); ok {
			return false
		}
		return check(p, cmd, args...)
	})
	return s
}

func (s *Server) dial() (redis.Conn, error) {
	c, err := redis.Dial("tcp", s.Addr,
		redis.DialConnectTimeout(ConnectTimeout),
		redis.DialReadTimeout(ReadTimeout),
		redis.DialWriteTimeout(WriteTimeout),
		redis.DialPassword(s.password))
	if err != nil {
		return nil, fmt.Errorf("dial %s redis at %s: %w", s.Kind, s.Addr, err)
	}
	return c, nil
}

// Pool returns a redigo pool (closed in t.Cleanup) whose connections are
// wrapped by redis24.Wrap: a command Redis 2.4 would not accept is not sent,
// is recorded in s.Census and fails t. On the shared server of
// ENGINE_TEST_REDIS a command that acts on the whole server (FLUSHALL,
// CONFIG SET, CLIENT KILL, SLAVEOF, SHUTDOWN...) is not sent either and
// fails t: a test that needs one starts its own server with [Private].
func (s *Server) Pool(t testing.TB) *redis.Pool {
	t.Helper()
	rep := newReporter(t)
	p := &redis.Pool{
		MaxIdle:     16,
		MaxActive:   0,
		IdleTimeout: time.Minute,
		Wait:        false,
		Dial: func() (redis.Conn, error) {
			c, err := s.dial()
			if err != nil {
				return nil, err
			}
			return s.guardShared(redis24.Wrap(c, redis24.OnViolation(rep.violation), redis24.WithCensus(s.Census)), rep), nil
		},
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// dialAdmin dials an unguarded connection with full rights.
func (s *Server) dialAdmin() (redis.Conn, error) {
	c, err := s.dial()
	if err != nil {
		return nil, err
	}
	switch {
	case s.v24:
		// 2.4 has no ACL: every connection has full rights.
	case s.Kind == KindReal:
		// AUTH user password is the one post-2.4 form allowed: test setup only.
		_, err = c.Do("AUTH", "admin", s.adminPassword)
	case s.Kind == KindMiniredis:
		_, err = c.Do(adminCommand, s.adminToken)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("authenticate admin connection to %s: %w", s.Addr, err)
	}
	return c, nil
}

// Admin returns an unguarded connection for test setup and inspection,
// closed in t.Cleanup. On a real server it is the "admin" ACL user (all
// commands); on miniredis it bypasses the 2.4 hook; on an external server it
// is a plain connection (with the ENGINE_TEST_REDIS_PASSWORD, if any) that
// refuses, as Pool's do, the commands acting on the whole server.
// Commands sent on it are not checked for 2.4 and not counted in the census.
func (s *Server) Admin(t testing.TB) redis.Conn {
	t.Helper()
	rep := newReporter(t)
	c, err := s.dialAdmin()
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	c = s.guardShared(c, rep)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Namespace returns a fresh random key prefix like "t1a2b3c4d".
func Namespace(t testing.TB) string {
	t.Helper()
	return "t" + randomHex(4)
}

// Cleanup deletes the keys of namespace ns (keys starting with ns or with
// "{ns", which covers "{ns}" and the "{ns:k}" of shard lanes) from an
// external server, which other tests or programs may share. Real and
// miniredis servers belong to one test and die with it, so nothing is
// done for them. Call it at the end of a test, e.g. from t.Cleanup.
func (s *Server) Cleanup(t testing.TB, ns string) {
	t.Helper()
	if s.Kind != KindExternal {
		return
	}
	if ns == "" || strings.ContainsAny(ns, "*?[]\\") {
		t.Fatalf("redistest: refusing to clean up namespace %q", ns)
	}
	c, err := s.dialAdmin()
	if err != nil {
		t.Errorf("redistest: cleanup of %q: %v", ns, err)
		return
	}
	defer c.Close()
	for _, pattern := range []string{ns + "*", "{" + ns + "*"} {
		// KEYS exists at every version (SCAN only from 2.8); fine for tests.
		keys, err := redis.Strings(c.Do("KEYS", pattern))
		if err != nil {
			t.Errorf("redistest: cleanup: KEYS %s: %v", pattern, err)
			return
		}
		for len(keys) > 0 {
			n := min(len(keys), 500)
			if _, err := c.Do("DEL", redis.Args{}.AddFlat(keys[:n])...); err != nil {
				t.Errorf("redistest: cleanup: DEL: %v", err)
				return
			}
			keys = keys[n:]
		}
	}
}

// RequireNoViolations fails t now (t.Fatalf, so call it from the test
// goroutine) if s's census recorded any violation or any command outside the
// Redis 2.4 table.
func RequireNoViolations(t testing.TB, s *Server) {
	t.Helper()
	vs := s.Census.Violations()
	outside := s.Census.Outside24()
	if len(vs) == 0 && len(outside) == 0 {
		return
	}
	var b strings.Builder
	for _, v := range vs {
		fmt.Fprintf(&b, "\n  %v", v)
	}
	t.Fatalf("redistest: %d Redis 2.4 violations, commands outside the 2.4 table %v:%s", len(vs), outside, b.String())
}

// CensusCommands returns the sorted distinct command names sent through s's
// Pool connections (or refused there).
func CensusCommands(s *Server) []string {
	return s.Census.Commands()
}

// WaitUp waits until the server behind pool has been up at least d
// (INFO's uptime_in_seconds; a server that does not say, miniredis, is
// up): a reaper judges no worker dead on a server up less than a
// heartbeat TTL, so a test that reaps once on a server it just started
// waits for this first.
func WaitUp(t testing.TB, pool *redis.Pool, d time.Duration) {
	t.Helper()
	c := pool.Get()
	defer c.Close()
	up := time.Duration(-1)
	testwait.UntilShowing(t, d+30*time.Second, fmt.Sprintf("the server to be up %v", d), func() bool {
		info, err := redis.String(c.Do("INFO"))
		if err != nil {
			t.Fatalf("INFO: %v", err)
		}
		up = -1
		if s, ok := redisinfo.Int(info, "uptime_in_seconds"); ok {
			up = time.Duration(s) * time.Second
		}
		return up < 0 || up >= d
	}, func() string { return fmt.Sprintf("up %v", up) })
}
