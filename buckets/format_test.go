package buckets

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// countConn counts the commands sent through it (Do and Send alike; the
// empty flush of a pipeline is not one).
type countConn struct {
	redis.Conn
	n int
}

func (c *countConn) Send(name string, args ...interface{}) error {
	c.n++
	return c.Conn.Send(name, args...)
}

func (c *countConn) DoContext(ctx context.Context, name string, args ...interface{}) (interface{}, error) {
	if name != "" {
		c.n++
	}
	return redis.DoContext(c.Conn, ctx, name, args...)
}

func (c *countConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(c.Conn, ctx)
}

func formatMark(t *testing.T, s *Store, c redis.Conn) string {
	t.Helper()
	v, err := redis.String(c.Do("GET", s.Keys.Format()))
	if err != nil && err != redis.ErrNil {
		t.Fatal(err)
	}
	return v
}

// A store that follows the mark marks a new namespace and writes compact
// storage on it, from then on without a round trip.
func TestResolveFormatMarksANewNamespace(t *testing.T) {
	s, c, ctx := batchEnv(t)
	s.Auto = true
	if s.WritesCompact() || s.inlines() {
		t.Fatal("a store that has not looked writes compact storage")
	}
	on, err := s.ResolveFormat(ctx, c)
	if err != nil || !on {
		t.Fatalf("ResolveFormat on a new namespace = %v, %v; want true", on, err)
	}
	if got := formatMark(t, s, c); got != "4" {
		t.Fatalf("the format mark is %q; want 4", got)
	}
	if !s.WritesCompact() || !s.inlines() {
		t.Fatal("a store on a marked namespace writes the legacy storage")
	}
	if v := s.EncodeRecord(&Record{ID: NewID(1700000000000), Type: "t", Queue: "default"}); v[1] != 4 {
		t.Fatalf("the record is version %d; want 4", v[1])
	}
	cc := &countConn{Conn: c}
	if on, err := s.ResolveFormat(ctx, cc); err != nil || !on || cc.n != 0 {
		t.Fatalf("a second look = %v, %v after %d commands; want true after none", on, err, cc.n)
	}
}

// A namespace in use without the mark keeps the legacy storage: nothing
// is written, later looks are a GET at most once per FormatRecheck, and
// an operator's mark is taken up at the next look.
func TestResolveFormatKeepsANamespaceInUse(t *testing.T) {
	for _, key := range []string{"queues", "w", "sched", "dead", "periodic"} {
		t.Run(key, func(t *testing.T) {
			s, c, ctx := batchEnv(t)
			s.Auto = true
			if _, err := c.Do("SADD", s.Keys.Queues(), "q"); key == "queues" && err != nil {
				t.Fatal(err)
			}
			if key != "queues" {
				if _, err := c.Do("DEL", s.Keys.Queues()); err != nil {
					t.Fatal(err)
				}
				var err error
				switch key {
				case "w":
					_, err = c.Do("SADD", s.Keys.Workers(), "w1")
				case "sched":
					_, err = c.Do("ZADD", s.Keys.Schedule(), 1, "q:1000")
				case "dead":
					_, err = c.Do("ZADD", s.Keys.Dead(), 1, "x")
				case "periodic":
					_, err = c.Do("SADD", s.Keys.Periodics(), "p")
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			on, err := s.ResolveFormat(ctx, c)
			if err != nil || on || s.WritesCompact() || s.inlines() {
				t.Fatalf("ResolveFormat on a namespace in use = %v, %v; want false", on, err)
			}
			if got := formatMark(t, s, c); got != "" {
				t.Fatalf("a namespace in use was marked %q", got)
			}
			if v := s.EncodeRecord(&Record{ID: NewID(1700000000000), Type: "t", Queue: "default"}); v[1] != 1 {
				t.Fatalf("the record is version %d; want 1", v[1])
			}
			cc := &countConn{Conn: c}
			if on, err := s.ResolveFormat(ctx, cc); err != nil || on || cc.n != 0 {
				t.Fatalf("a look within FormatRecheck = %v, %v after %d commands; want false after none", on, err, cc.n)
			}
			if err := s.MarkFormat(ctx, c, true); err != nil {
				t.Fatal(err)
			}
			s.formatNext.Store(0) // FormatRecheck has passed
			if on, err := s.ResolveFormat(ctx, cc); err != nil || !on || cc.n != 1 {
				t.Fatalf("a look after the mark = %v, %v after %d commands; want true after one GET", on, err, cc.n)
			}
			if m, err := s.ReadFormat(ctx, c); err != nil || m.Version != CompactVersion {
				t.Fatalf("ReadFormat = %+v, %v", m, err)
			}
		})
	}
}

// Store.FormatRecheck sets how long an unmarked namespace in use is left
// unlooked at: no command within it, one GET once it has passed.
func TestResolveFormatRecheckInterval(t *testing.T) {
	s, c, ctx := batchEnv(t)
	s.Auto, s.FormatRecheck = true, 300*time.Millisecond
	if _, err := c.Do("SADD", s.Keys.Queues(), "q"); err != nil {
		t.Fatal(err)
	}
	if on, err := s.ResolveFormat(ctx, c); err != nil || on {
		t.Fatalf("the first look = %v, %v; want false", on, err)
	}
	start := time.Now()
	if err := s.MarkFormat(ctx, c, true); err != nil {
		t.Fatal(err)
	}
	cc := &countConn{Conn: c}
	for time.Since(start) < 200*time.Millisecond {
		if on, err := s.ResolveFormat(ctx, cc); err != nil || on || cc.n != 0 {
			t.Fatalf("a look within the interval = %v, %v after %d commands; want false after none", on, err, cc.n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		on, err := s.ResolveFormat(ctx, cc)
		if err != nil {
			t.Fatal(err)
		}
		if on {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the mark was not taken up within 5 s with a 300 ms interval (%d commands)", cc.n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if cc.n != 1 {
		t.Fatalf("taking the mark up sent %d commands; want one GET", cc.n)
	}
}

// A namespace that comes into use between the look's reads and its EXEC
// is not marked: the look's WATCH fails the EXEC and the reads, done
// again, find it in use.
func TestResolveFormatRace(t *testing.T) {
	s, pool, _ := realStore(t)
	s.Auto = true
	ctx := context.Background()
	c, other := pool.Get(), pool.Get()
	t.Cleanup(func() { c.Close(); other.Close() })
	hc := &hookConn{Conn: c, hook: func() error {
		_, err := other.Do("SADD", s.Keys.Queues(), "q")
		return err
	}}
	on, err := s.ResolveFormat(ctx, hc)
	if err != nil || on {
		t.Fatalf("ResolveFormat = %v, %v; want false", on, err)
	}
	if !hc.fired {
		t.Fatal("the hook did not run: the look sent no MULTI")
	}
	if got := formatMark(t, s, c); got != "" {
		t.Fatalf("the namespace was marked %q while it came into use", got)
	}
}

// A mark that is not a version, or a key of the wrong type, is an error
// that says what is wrong; the store keeps the legacy storage.
func TestResolveFormatBadMark(t *testing.T) {
	s, c, ctx := batchEnv(t)
	s.Auto = true
	if _, err := c.Do("SET", s.Keys.Format(), "soon"); err != nil {
		t.Fatal(err)
	}
	on, err := s.ResolveFormat(ctx, c)
	if err == nil || on || !strings.Contains(err.Error(), `"soon"`) || s.WritesCompact() {
		t.Fatalf("ResolveFormat with a bad mark = %v, %v; want false and an error naming it", on, err)
	}
	if m, err := s.ReadFormat(ctx, c); err != nil || m.Version != 0 || m.Raw != "soon" {
		t.Fatalf("ReadFormat = %+v, %v", m, err)
	}
	// replace writes the mark again with cmd (SET, or RPUSH for a key of
	// the wrong type) and lets the next look read it at once.
	replace := func(cmd, v string) {
		t.Helper()
		if _, err := c.Do("DEL", s.Keys.Format()); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Do(cmd, s.Keys.Format(), v); err != nil {
			t.Fatal(err)
		}
		s.formatNext.Store(0)
	}
	replace("RPUSH", "4")
	if on, err := s.ResolveFormat(ctx, c); err == nil || on || s.WritesCompact() {
		t.Fatalf("ResolveFormat with a list for a mark = %v, %v; want false and an error", on, err)
	}
	// An empty mark is not a version either.
	replace("SET", "")
	if on, err := s.ResolveFormat(ctx, c); err == nil || on || s.WritesCompact() {
		t.Fatalf("ResolveFormat with an empty mark = %v, %v; want false and an error", on, err)
	}
	// An old mark (a lower version) is the legacy storage, without error.
	replace("SET", "1")
	if on, err := s.ResolveFormat(ctx, c); err != nil || on {
		t.Fatalf("ResolveFormat with mark 1 = %v, %v; want false", on, err)
	}
	if err := s.MarkFormat(ctx, c, false); err != nil {
		t.Fatal(err)
	}
	if got := formatMark(t, s, c); got != "" {
		t.Fatalf("MarkFormat(false) left %q", got)
	}
}

// A store that does not follow the mark sends nothing and keeps its
// setting.
func TestResolveFormatNotAuto(t *testing.T) {
	s, c, ctx := batchEnv(t)
	cc := &countConn{Conn: c}
	if on, err := s.ResolveFormat(ctx, cc); err != nil || on || cc.n != 0 {
		t.Fatalf("ResolveFormat = %v, %v after %d commands; want false after none", on, err, cc.n)
	}
	s.Compact = true
	if on, err := s.ResolveFormat(ctx, cc); err != nil || !on || cc.n != 0 {
		t.Fatalf("ResolveFormat with Compact = %v, %v after %d commands; want true after none", on, err, cc.n)
	}
	if got := formatMark(t, s, c); got != "" {
		t.Fatalf("a store that does not follow the mark marked the namespace %q", got)
	}
}
