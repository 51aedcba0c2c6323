package buckets

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// errCrash is what a crashConn answers once it has "crashed".
var errCrash = errors.New("injected crash")

// crashConn stands for a process that dies at one command of a
// transaction: before EXEC is sent (the connection closes with MULTI and
// the queued commands unexecuted, as when the process dies there) or
// right after EXEC reached the server (the reply is read and thrown away,
// then the connection closes: the process died before it saw the answer).
// From then on every call fails with errCrash.
type crashConn struct {
	inner   redis.Conn
	at      string // command name, upper case
	after   bool   // crash after the command ran, not before it is sent
	skip    int    // occurrences of at to let through before the crash
	pending []string
	crashed bool
	fired   bool
}

func (c *crashConn) crash() error {
	c.crashed, c.fired = true, true
	_ = c.inner.Close()
	return errCrash
}

func (c *crashConn) Send(name string, args ...interface{}) error {
	if c.crashed {
		return errCrash
	}
	up := strings.ToUpper(name)
	if up == c.at && c.skip > 0 {
		c.skip--
		up = "" // let this one through
	}
	if up == c.at && !c.after {
		return c.crash()
	}
	c.pending = append(c.pending, up)
	return c.inner.Send(name, args...)
}

func (c *crashConn) Flush() error {
	if c.crashed {
		return errCrash
	}
	return c.inner.Flush()
}

func (c *crashConn) Receive() (interface{}, error) {
	if c.crashed {
		return nil, errCrash
	}
	var name string
	if len(c.pending) > 0 {
		name, c.pending = c.pending[0], c.pending[1:]
	}
	rep, err := c.inner.Receive()
	if name == c.at && c.after {
		return nil, c.crash()
	}
	return rep, err
}

// Do behaves as redigo's: it sends the command (if any), flushes, and
// reads every pending reply; with a command it returns the last reply and
// the first error reply, without one the list of replies.
func (c *crashConn) Do(name string, args ...interface{}) (interface{}, error) {
	if name != "" {
		if err := c.Send(name, args...); err != nil {
			return nil, err
		}
	}
	if err := c.Flush(); err != nil {
		return nil, err
	}
	n := len(c.pending)
	reps := make([]interface{}, 0, n)
	var first error
	for i := 0; i < n; i++ {
		rep, err := c.Receive()
		if err != nil {
			return nil, err
		}
		if e, ok := rep.(redis.Error); ok && first == nil {
			first = e
		}
		reps = append(reps, rep)
	}
	if name == "" {
		return reps, nil
	}
	if len(reps) == 0 {
		return nil, first
	}
	return reps[len(reps)-1], first
}

// DoContext and ReceiveContext make crashConn a redis.ConnWithContext, as
// txn requires; the deadline is not needed by these tests.
func (c *crashConn) DoContext(_ context.Context, name string, args ...interface{}) (interface{}, error) {
	return c.Do(name, args...)
}

func (c *crashConn) ReceiveContext(context.Context) (interface{}, error) { return c.Receive() }

func (c *crashConn) Err() error {
	if c.crashed {
		return errCrash
	}
	return c.inner.Err()
}

func (c *crashConn) Close() error {
	if c.crashed {
		return nil
	}
	return c.inner.Close()
}

// snapshot is every key of a namespace with its type and content (the
// namespace replaced by "NS", so that two namespaces compare), and
// whether it has a TTL.
func snapshot(t *testing.T, admin redis.Conn, ns string) string {
	t.Helper()
	prefix := "{" + ns + "}"
	keys, err := redis.Strings(admin.Do("KEYS", prefix+"*"))
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		typ, err := redis.String(admin.Do("TYPE", k))
		if err != nil {
			t.Fatalf("TYPE %s: %v", k, err)
		}
		var content interface{}
		switch typ {
		case "string":
			content, err = redis.String(admin.Do("GET", k))
		case "list":
			content, err = redis.Strings(admin.Do("LRANGE", k, 0, -1))
		case "set":
			var m []string
			m, err = redis.Strings(admin.Do("SMEMBERS", k))
			sort.Strings(m)
			content = m
		case "zset":
			content, err = redis.Strings(admin.Do("ZRANGE", k, 0, -1, "WITHSCORES"))
		case "hash":
			var m map[string]string
			m, err = redis.StringMap(admin.Do("HGETALL", k))
			content = fmt.Sprint(m) // fmt sorts map keys
		}
		if err != nil {
			t.Fatalf("read %s %s: %v", typ, k, err)
		}
		ttl, err := redis.Int(admin.Do("TTL", k))
		if err != nil {
			t.Fatalf("TTL %s: %v", k, err)
		}
		fmt.Fprintf(&b, "%s %s ttl:%v %q\n", strings.Replace(k, prefix, "NS", 1), typ, ttl > 0, fmt.Sprint(content))
	}
	return b.String()
}

// Fixed times (Unix ms), so that every run of a case writes the same.
const (
	t0 = int64(1_700_000_000_000)
	w1 = "w1"
)

func newRec(id string, due int64) *Record {
	return &Record{ID: id, Queue: "q", Type: "job", Payload: []byte("p-" + id), State: StateWaiting,
		MaxAttempts: 3, TimeoutMs: 1000, Created: t0, Due: due}
}

func lease(r *Record) int64 { return t0 + 5000 }

// crashCase is one transaction of this package: setup brings a fresh
// namespace to the state the transaction starts from (on a plain
// connection), op runs the transaction.
type crashCase struct {
	name  string
	setup func(ctx context.Context, s *Store, c redis.Conn) error
	op    func(ctx context.Context, s *Store, c redis.Conn) error
}

// crashBefore lists the cases whose op runs skip transactions before the
// one under test; mid builds the state those leave, which is what a crash
// before the tested EXEC leaves.
var crashBefore = map[string]struct {
	skip int
	mid  func(ctx context.Context, s *Store, c redis.Conn) error
}{
	"FinishHeld":                       {1, claimed("a")},
	"FinishHeld/unique, result, reply": {1, uniqueClaimed},
	"FinishHeld/kept, waited":          {1, marked(claimed("a"), "a")},
	"FinishHeld/kept, not waited":      {1, claimed("a")},
}

// marked is setup, then a waiter's mark on ids (as Completed leaves it).
func marked(setup func(ctx context.Context, s *Store, c redis.Conn) error, ids ...string) func(ctx context.Context, s *Store, c redis.Conn) error {
	return func(ctx context.Context, s *Store, c redis.Conn) error {
		if err := setup(ctx, s, c); err != nil {
			return err
		}
		for _, id := range ids {
			if _, err := c.Do("SETEX", s.Keys.Waiter(id), WaiterTTL, 1); err != nil {
				return err
			}
		}
		return nil
	}
}

// enqueued, popped, claimed and dead build up the usual starting states.
func enqueued(ids ...string) func(ctx context.Context, s *Store, c redis.Conn) error {
	return func(ctx context.Context, s *Store, c redis.Conn) error {
		var recs []*Record
		for _, id := range ids {
			recs = append(recs, newRec(id, t0))
		}
		return s.Enqueue(ctx, c, t0, recs)
	}
}

func popped(ids ...string) func(ctx context.Context, s *Store, c redis.Conn) error {
	return func(ctx context.Context, s *Store, c redis.Conn) error {
		if err := enqueued(ids...)(ctx, s, c); err != nil {
			return err
		}
		for range ids {
			if _, err := s.Pop(ctx, c, "q", w1); err != nil {
				return err
			}
		}
		return nil
	}
}

func claimed(ids ...string) func(ctx context.Context, s *Store, c redis.Conn) error {
	return func(ctx context.Context, s *Store, c redis.Conn) error {
		if err := popped(ids...)(ctx, s, c); err != nil {
			return err
		}
		for _, id := range ids {
			if _, res, err := s.Claim(ctx, c, w1, "q", id, t0+10, lease, false, nil); err != nil || res != Claimed {
				return fmt.Errorf("claim %s: %v, %v", id, res, err)
			}
		}
		return nil
	}
}

func dead(ids ...string) func(ctx context.Context, s *Store, c redis.Conn) error {
	return func(ctx context.Context, s *Store, c redis.Conn) error {
		if err := claimed(ids...)(ctx, s, c); err != nil {
			return err
		}
		for _, id := range ids {
			if _, _, err := s.Finish(ctx, c, w1, id, 1, t0+20, 60, func(r *Record) Outcome {
				r.LastError = "boom"
				return Bury
			}); err != nil {
				return err
			}
		}
		return nil
	}
}

func nothing(context.Context, *Store, redis.Conn) error { return nil }

// uniqueRec is a task holding unique key k:<id> (ttl in seconds) with a
// reply list.
func uniqueRec(id string, ttl int64) *Record {
	r := newRec(id, t0)
	r.Unique, r.UniqueTTL, r.ReplyTo = "k:"+id, ttl, "r"
	return r
}

func uniquePopped(ctx context.Context, s *Store, c redis.Conn) error {
	if err := s.Enqueue(ctx, c, t0, []*Record{uniqueRec("a", 0)}); err != nil {
		return err
	}
	_, err := s.Pop(ctx, c, "q", w1)
	return err
}

func uniqueClaimed(ctx context.Context, s *Store, c redis.Conn) error {
	if err := uniquePopped(ctx, s, c); err != nil {
		return err
	}
	if _, res, err := s.Claim(ctx, c, w1, "q", "a", t0+10, lease, false, nil); err != nil || res != Claimed {
		return fmt.Errorf("claim: %v, %v", res, err)
	}
	return nil
}

var crashCases = []crashCase{
	{"Enqueue/ready", nothing, func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Enqueue(ctx, c, t0, []*Record{newRec("a", t0), newRec("b", t0)})
	}},
	{"Enqueue/scheduled", nothing, func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Enqueue(ctx, c, t0, []*Record{newRec("a", t0+60_000), newRec("b", t0+120_000)})
	}},
	{"Move", func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Enqueue(ctx, c, t0-60_000, []*Record{newRec("a", t0-1000), newRec("b", t0-1000)})
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		_, err := s.Move(ctx, c, []string{Member("q", BucketTime(t0-1000, s.Resolution))}, 100)
		return err
	}},
	{"Enqueue/scheduled inline", nothing, func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Enqueue(ctx, c, t0, []*Record{newRec(fixedID(1), t0+60_000)})
	}},
	{"Move/inline", func(ctx context.Context, s *Store, c redis.Conn) error {
		for i, id := range []string{fixedID(1), fixedID(2)} {
			if err := s.Enqueue(ctx, c, t0-60_000, []*Record{newRec(id, t0-1000-int64(i)*1000)}); err != nil {
				return err
			}
		}
		return s.Enqueue(ctx, c, t0-60_000, []*Record{newRec("a", t0-3000), newRec("b", t0-3000)})
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		_, err := s.Move(ctx, c, []string{InlineMember("q", fixedID(1)), InlineMember("q", fixedID(2)), Member("q", BucketTime(t0-3000, s.Resolution))}, 100)
		return err
	}},
	{"Claim", popped("a"), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, res, err := s.Claim(ctx, c, w1, "q", "a", t0+10, lease, false, nil)
		if err == nil && res != Claimed {
			err = fmt.Errorf("claim: %v", res)
		}
		return err
	}},
	{"Claim/missing record", func(ctx context.Context, s *Store, c redis.Conn) error {
		if err := popped("a")(ctx, s, c); err != nil {
			return err
		}
		_, err := c.Do("DEL", s.Keys.Task("a"))
		return err
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		_, _, err := s.Claim(ctx, c, w1, "q", "a", t0+10, lease, false, nil)
		return err
	}},
	{"Finish/done", claimed("a"), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, _, err := s.Finish(ctx, c, w1, "a", 1, t0+20, 60, func(*Record) Outcome { return Done })
		return err
	}},
	{"Finish/retry", claimed("a"), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, _, err := s.Finish(ctx, c, w1, "a", 1, t0+20, 60, func(r *Record) Outcome {
			r.State, r.Attempts, r.Due, r.LastError = StateRetry, 1, t0+30_000, "boom"
			return Again
		})
		return err
	}},
	{"Finish/bury", claimed("a"), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, _, err := s.Finish(ctx, c, w1, "a", 1, t0+20, 60, func(r *Record) Outcome { r.LastError = "boom"; return Bury })
		return err
	}},
	{"FinishHeld", popped("a"), func(ctx context.Context, s *Store, c redis.Conn) error {
		// The holding claim (the transaction before) leaves the watch
		// that FinishHeld, the one under test, writes under.
		var cs ClaimState
		rec, res, err := s.Claim(ctx, c, w1, "q", "a", t0+10, lease, true, &cs)
		if err != nil || res != Claimed {
			return fmt.Errorf("claim: %v, %v", res, err)
		}
		_, _, _, err = s.FinishHeld(ctx, cs.Held(), w1, rec, cs.Waited(), t0+20, 60, func(*Record) Outcome { return Done }, nil)
		return err
	}},
	{"ClaimBatch", popped("a", "b", "c"), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, res, err := s.ClaimBatch(ctx, c, w1, "q", []string{"a", "b", "c"}, t0+10, lease, make([]ClaimState, 3), false)
		if err == nil && (res[0] != Claimed || res[1] != Claimed || res[2] != Claimed) {
			err = fmt.Errorf("claim batch: %v", res)
		}
		return err
	}},
	{"FinishGroup", claimed("a", "b", "c"), func(ctx context.Context, s *Store, c redis.Conn) error {
		done := func(*Record) Outcome { return Done }
		res, err := s.FinishGroup(ctx, c, w1, []FinishItem{
			{ID: "a", Run: 1, Now: t0 + 20, Decide: done},
			{ID: "b", Run: 1, Now: t0 + 20, Decide: func(r *Record) Outcome {
				r.State, r.Attempts, r.Due, r.LastError = StateRetry, 1, t0+30_000, "boom"
				return Again
			}},
			{ID: "c", Run: 1, Now: t0 + 20, Decide: func(r *Record) Outcome { r.LastError = "boom"; return Bury }},
		}, 60)
		for _, r := range res {
			if err == nil && r.Err != nil {
				err = r.Err
			}
		}
		return err
	}},
	// A success whose done record is kept as long as the completion
	// list would be (doneTTL 600 = ResultTTL): the list only for a task
	// with a waiter mark ("a"), none for the other ("b").
	{"FinishGroup/kept, one waited", marked(claimed("a", "b"), "a"), func(ctx context.Context, s *Store, c redis.Conn) error {
		done := func(*Record) Outcome { return Done }
		res, err := s.FinishGroup(ctx, c, w1, []FinishItem{
			{ID: "a", Run: 1, Now: t0 + 20, Decide: done},
			{ID: "b", Run: 1, Now: t0 + 20, Decide: done},
		}, 600)
		for _, r := range res {
			if err == nil && r.Err != nil {
				err = r.Err
			}
		}
		return err
	}},
	{"Finish/done, kept, waited", marked(claimed("a"), "a"), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, _, err := s.Finish(ctx, c, w1, "a", 1, t0+20, 600, func(*Record) Outcome { return Done })
		return err
	}},
	{"Finish/done, kept, not waited", claimed("a"), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, _, err := s.Finish(ctx, c, w1, "a", 1, t0+20, 600, func(*Record) Outcome { return Done })
		return err
	}},
	{"FinishHeld/kept, waited", marked(popped("a"), "a"), func(ctx context.Context, s *Store, c redis.Conn) error {
		var cs ClaimState
		rec, res, err := s.Claim(ctx, c, w1, "q", "a", t0+10, lease, true, &cs)
		if err != nil || res != Claimed || !cs.Waited() {
			return fmt.Errorf("claim: %v, %v, waited %v", res, err, cs.Waited())
		}
		_, _, _, err = s.FinishHeld(ctx, cs.Held(), w1, rec, cs.Waited(), t0+20, 600, func(*Record) Outcome { return Done }, nil)
		return err
	}},
	{"FinishHeld/kept, not waited", popped("a"), func(ctx context.Context, s *Store, c redis.Conn) error {
		var cs ClaimState
		rec, res, err := s.Claim(ctx, c, w1, "q", "a", t0+10, lease, true, &cs)
		if err != nil || res != Claimed || cs.Waited() {
			return fmt.Errorf("claim: %v, %v, waited %v", res, err, cs.Waited())
		}
		_, _, _, err = s.FinishHeld(ctx, cs.Held(), w1, rec, cs.Waited(), t0+20, 600, func(*Record) Outcome { return Done }, nil)
		return err
	}},
	{"Requeue/worker died", claimed("a", "b"), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, err := s.Requeue(ctx, c, w1, []string{"a", "b"}, t0+30, WorkerDied, 3)
		return err
	}},
	{"Requeue/undecodable record", func(ctx context.Context, s *Store, c redis.Conn) error {
		if err := claimed("a")(ctx, s, c); err != nil {
			return err
		}
		_, err := c.Do("SET", s.Keys.Task("a"), "garbage")
		return err
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		_, err := s.Requeue(ctx, c, w1, []string{"a"}, t0+6000, LeaseExpired, 3)
		return err
	}},
	{"RecoverInflight", popped("a", "b"), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, err := s.RecoverAllInflight(ctx, c, w1, t0+30, true)
		return err
	}},
	{"Cancel", func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Enqueue(ctx, c, t0, []*Record{newRec("a", t0+60_000)})
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Cancel(ctx, c, "a", t0+10, 3600)
	}},
	{"Revive", dead("a"), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, err := reviveDead(ctx, s, c, []string{"a"}, t0+40)
		return err
	}},
	{"Purge", dead("a"), func(ctx context.Context, s *Store, c redis.Conn) error {
		_, err := s.Purge(ctx, c, []string{"a"})
		return err
	}},
	{"Enqueue/unique", func(ctx context.Context, s *Store, c redis.Conn) error {
		// An ended holder: its key is taken over.
		if _, err := c.Do("SET", s.Keys.Unique("k:b"), "gone"); err != nil {
			return err
		}
		return nil
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Enqueue(ctx, c, t0, []*Record{uniqueRec("a", 0), uniqueRec("b", 600)}, "a")
	}},
	{"Finish/done, unique, result, reply", uniqueClaimed, func(ctx context.Context, s *Store, c redis.Conn) error {
		_, _, err := s.Finish(ctx, c, w1, "a", 1, t0+20, 60, func(r *Record) Outcome { r.Result = []byte("out"); return Done })
		return err
	}},
	{"Finish/bury, unique, reply", uniqueClaimed, func(ctx context.Context, s *Store, c redis.Conn) error {
		_, _, err := s.Finish(ctx, c, w1, "a", 1, t0+20, 60, func(r *Record) Outcome { r.LastError = "boom"; return Bury })
		return err
	}},
	{"FinishHeld/unique, result, reply", uniquePopped, func(ctx context.Context, s *Store, c redis.Conn) error {
		var cs ClaimState
		rec, res, err := s.Claim(ctx, c, w1, "q", "a", t0+10, lease, true, &cs)
		if err != nil || res != Claimed {
			return fmt.Errorf("claim: %v, %v", res, err)
		}
		_, _, _, err = s.FinishHeld(ctx, cs.Held(), w1, rec, cs.Waited(), t0+20, 60, func(r *Record) Outcome { r.Result = []byte("out"); return Done }, nil)
		return err
	}},
	{"Finish/done, reply queue", func(ctx context.Context, s *Store, c redis.Conn) error {
		r := newRec("a", t0)
		r.ReplyTo = ReplyQueuePrefix + "answers"
		if err := s.Enqueue(ctx, c, t0, []*Record{r}); err != nil {
			return err
		}
		if _, err := s.Pop(ctx, c, "q", w1); err != nil {
			return err
		}
		_, _, err := s.Claim(ctx, c, w1, "q", "a", t0+10, lease, false, nil)
		return err
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		_, _, err := s.Finish(ctx, c, w1, "a", 1, t0+20, 60, func(r *Record) Outcome { r.Result = []byte("out"); return Done })
		return err
	}},
	{"Cancel/unique, reply", func(ctx context.Context, s *Store, c redis.Conn) error {
		r := uniqueRec("a", 0)
		r.Due = t0 + 60_000
		return s.Enqueue(ctx, c, t0, []*Record{r})
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Cancel(ctx, c, "a", t0+10, 3600)
	}},
	{"Revive/unique", func(ctx context.Context, s *Store, c redis.Conn) error {
		if err := uniqueClaimed(ctx, s, c); err != nil {
			return err
		}
		_, _, err := s.Finish(ctx, c, w1, "a", 1, t0+20, 60, func(r *Record) Outcome { r.LastError = "boom"; return Bury })
		return err
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		n, err := reviveDead(ctx, s, c, []string{"a"}, t0+40)
		if err == nil && n != 1 {
			err = fmt.Errorf("revived %d", n)
		}
		return err
	}},
	{"Beat", nothing, func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Beat(ctx, c, w1, 60, []byte("info"))
	}},
	{"Claim/paused", func(ctx context.Context, s *Store, c redis.Conn) error {
		if err := popped("a")(ctx, s, c); err != nil {
			return err
		}
		return s.Pause(ctx, c, "q")
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		_, res, err := s.Claim(ctx, c, w1, "q", "a", t0+10, lease, false, nil)
		if err == nil && res != Paused {
			err = fmt.Errorf("claim: %v, want Paused", res)
		}
		return err
	}},
	{"Claim/not served", popped("a"), func(ctx context.Context, s *Store, c redis.Conn) error {
		cs := ClaimState{Serves: func(string) bool { return false }, UnservedGrace: 60_000}
		_, res, err := s.Claim(ctx, c, w1, "q", "a", t0+10, lease, false, &cs)
		if err == nil && res != NotServed {
			err = fmt.Errorf("claim: %v, want NotServed", res)
		}
		return err
	}},
	{"Claim/not served past the grace", func(ctx context.Context, s *Store, c redis.Conn) error {
		if err := popped("a")(ctx, s, c); err != nil {
			return err
		}
		_, err := c.Do("HSET", s.Keys.Unserved("q"), "job", t0-120_000)
		return err
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		cs := ClaimState{Serves: func(string) bool { return false }, UnservedGrace: 60_000}
		_, res, err := s.Claim(ctx, c, w1, "q", "a", t0+10, lease, false, &cs)
		if err == nil && res != Claimed {
			err = fmt.Errorf("claim: %v, want Claimed", res)
		}
		return err
	}},
	{"Pause", nothing, func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Pause(ctx, c, "q")
	}},
	{"Resume", func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Pause(ctx, c, "q")
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Resume(ctx, c, "q")
	}},
	{"Beat/serving", func(ctx context.Context, s *Store, c redis.Conn) error {
		_, err := c.Do("HSET", s.Keys.Unserved("q"), "t", t0)
		return err
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Beat(ctx, c, w1, 60, []byte("info"), Served{Queue: "q", Types: []string{"t", "u"}, TTL: 60})
	}},
	{"Refresh/serving", func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Beat(ctx, c, w1, 60, []byte("info"), Served{Queue: "q", Types: []string{"t", "u"}, TTL: 60})
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		return s.Refresh(ctx, c, w1, 90, []byte("info2"), Served{Queue: "q", Types: []string{"t", "u"}, TTL: 90})
	}},
	{"Forget", func(ctx context.Context, s *Store, c redis.Conn) error {
		_, err := c.Do("SADD", s.Keys.Workers(), w1)
		return err
	}, func(ctx context.Context, s *Store, c redis.Conn) error {
		removed, err := s.Forget(ctx, c, w1, true)
		if err == nil && !removed {
			err = errors.New("not removed")
		}
		return err
	}},
}

// TestCrashPoints runs each transaction of the package three times on the
// same starting state, each in its own namespace: undisturbed (the state
// after it), crashing just before EXEC is sent (nothing may be written),
// and crashing just after EXEC ran (everything must be written, exactly
// as undisturbed, although the caller got an error).
func TestCrashPoints(t *testing.T) {
	t.Parallel()
	servers := map[string]func(t *testing.T) *redistest.Server{
		"miniredis": func(t *testing.T) *redistest.Server { return redistest.Mini(t) },
		"redis":     func(t *testing.T) *redistest.Server { return redistest.Start(t) },
	}
	for name, start := range servers {
		t.Run(name, func(t *testing.T) {
			srv := start(t)
			pool := srv.Pool(t)
			admin := srv.Admin(t)
			for _, tc := range crashCases {
				t.Run(tc.name, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					fresh := func() (*Store, string) {
						ns := redistest.Namespace(t)
						t.Cleanup(func() { srv.Cleanup(t, ns) })
						s, err := NewStore(ns, 1000)
						if err != nil {
							t.Fatal(err)
						}
						s.ResultTTL = 600
						s.FlowTTL = 600 // not 0, whose 1 s could run out between a snapshot's reads
						c := pool.Get()
						defer c.Close()
						if err := tc.setup(ctx, s, c); err != nil {
							t.Fatalf("setup: %v", err)
						}
						return s, ns
					}

					s, ns := fresh()
					before := snapshot(t, admin, ns)
					c := pool.Get()
					err := tc.op(ctx, s, c)
					c.Close()
					if err != nil {
						t.Fatalf("undisturbed: %v", err)
					}
					after := snapshot(t, admin, ns)
					if after == before {
						t.Fatalf("the transaction changed nothing:\n%s", before)
					}

					pre, hasPre := crashBefore[tc.name]
					if hasPre {
						// The state the transactions before the one under
						// test leave: a crash before its EXEC leaves it.
						ns := redistest.Namespace(t)
						t.Cleanup(func() { srv.Cleanup(t, ns) })
						s, err := NewStore(ns, 1000)
						if err != nil {
							t.Fatal(err)
						}
						s.ResultTTL = 600
						s.FlowTTL = 600 // not 0, whose 1 s could run out between a snapshot's reads
						c := pool.Get()
						if err := pre.mid(ctx, s, c); err != nil {
							t.Fatalf("mid: %v", err)
						}
						c.Close()
						before = snapshot(t, admin, ns)
					}
					for _, crashAfter := range []bool{false, true} {
						s, ns := fresh()
						cc := &crashConn{inner: pool.Get(), at: "EXEC", after: crashAfter, skip: pre.skip}
						err := tc.op(ctx, s, cc)
						cc.Close()
						point, want := "before EXEC", before
						if crashAfter {
							point, want = "after EXEC", after
						}
						if !cc.fired {
							t.Fatalf("crash %s: the transaction never reached EXEC", point)
						}
						if !errors.Is(err, errCrash) {
							t.Errorf("crash %s: the caller got %v, want the connection's error", point, err)
						}
						if got := snapshot(t, admin, ns); got != want {
							t.Errorf("crash %s: the namespace holds\n%s\nwant\n%s", point, got, want)
						}
					}
				})
			}
		})
	}
}
