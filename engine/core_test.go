package engine

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
	"github.com/bucketq/bucketq/internal/clocktest"
	"github.com/gomodule/redigo/redis"
)

// readyIDs lists queue q's ready list, oldest first.
func (e *env) readyIDs(t testing.TB, q string) []string {
	t.Helper()
	ids, err := redis.Strings(e.admin(t).Do("LRANGE", e.key("q:"+q), 0, -1))
	if err != nil {
		t.Fatal(err)
	}
	for i, j := 0, len(ids)-1; i < j; i, j = i+1, j-1 {
		ids[i], ids[j] = ids[j], ids[i]
	}
	return ids
}

func (e *env) zcard(t testing.TB, key string) int {
	n, err := redis.Int(e.admin(t).Do("ZCARD", e.key(key)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *env) keys(t testing.TB) []string {
	ks, err := redis.Strings(e.admin(t).Do("KEYS", "{"+e.ns+"}:*"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(ks)
	return ks
}

// exactlyOnce checks that ready holds each of want once and nothing else.
func exactlyOnce(t testing.TB, ready []string, want map[string]bool) {
	t.Helper()
	seen := map[string]int{}
	for _, id := range ready {
		seen[id]++
	}
	dup, extra, missing := 0, 0, 0
	for id, n := range seen {
		if n > 1 {
			dup++
		}
		if !want[id] {
			extra++
		}
	}
	for id := range want {
		if seen[id] == 0 {
			missing++
		}
	}
	if dup+extra+missing > 0 {
		t.Fatalf("ready list: %d duplicated, %d unexpected, %d missing of %d", dup, extra, missing, len(want))
	}
}

func (e *env) store(t testing.TB) *buckets.Store {
	st, err := buckets.NewStore(e.ns, e.cfg.withDefaults().Advanced.Resolution.Milliseconds())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestEnqueueValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, redistestMini(t))
	c := e.client(t)
	ctx := context.Background()
	big := make([]byte, 600<<10)
	cases := []struct {
		name string
		typ  string
		data []byte
		opts []Option
		want error
	}{
		{"empty type", "", nil, nil, ErrInvalid},
		{"control char type", "a\nb", nil, nil, ErrInvalid},
		{"bad queue", "t", nil, []Option{Queue("no spaces")}, ErrInvalid},
		{"empty queue", "t", nil, []Option{Queue("")}, ErrInvalid},
		{"oversized", "t", big, nil, ErrTooLarge},
		{"zero attempts", "t", nil, []Option{MaxAttempts(0)}, ErrInvalid},
		{"tiny timeout", "t", nil, []Option{Timeout(time.Microsecond)}, ErrInvalid},
		{"negative in", "t", nil, []Option{In(-time.Second)}, ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Enqueue(ctx, tc.typ, tc.data, tc.opts...)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Enqueue = %v, want %v", err, tc.want)
			}
		})
	}
	// A batch with one bad task writes nothing at all.
	_, err := c.EnqueueBatch(ctx, []NewTask{{Type: "ok"}, {Type: "ok", Options: []Option{In(time.Hour)}}, {Type: ""}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "task 2") {
		t.Fatalf("EnqueueBatch = %v, want ErrInvalid naming task 2", err)
	}
	if ks := e.keys(t); len(ks) != 0 {
		t.Fatalf("refused input wrote keys: %v", ks)
	}
}

// Atomic enqueue: a connection that dies after any number of commands
// leaves the whole batch or nothing (record, bucket, index, ready list).
func TestEnqueueAtomicUnderConnectionLoss(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		st := e.store(t)
		ctx := context.Background()
		now := time.Now().UnixMilli()
		for limit := 1; limit <= 22; limit++ {
			for _, lose := range []bool{false, true} {
				recs := []*buckets.Record{}
				for i := 0; i < 4; i++ {
					due := now + int64(i%2)*60_000 // half ready, half scheduled
					recs = append(recs, &buckets.Record{ID: fmt.Sprintf("%08d-0000-0000-0000-%012d", limit, i*2+b2i(lose)),
						Queue: "default", Type: "t", State: buckets.StateWaiting, MaxAttempts: 1, TimeoutMs: 1000, Created: now, Due: due})
				}
				conn, err := e.pool.GetContext(ctx)
				if err != nil {
					t.Fatal(err)
				}
				fc := &faultConn{Conn: conn, limit: limit, loseReply: lose}
				err = st.Enqueue(ctx, fc, now, recs)
				conn.Close()
				admin := e.admin(t)
				present := 0
				for _, r := range recs {
					n, _ := redis.Int(admin.Do("EXISTS", st.Keys.Task(r.ID)))
					present += n
				}
				if present != 0 && present != len(recs) {
					t.Fatalf("limit %d lose %v: %d of %d records written", limit, lose, present, len(recs))
				}
				if err == nil && present == 0 {
					t.Fatalf("limit %d: Enqueue returned nil but wrote nothing", limit)
				}
				if present > 0 {
					// Everything that goes with a record is there too.
					ready := e.readyIDs(t, "default")
					in := map[string]bool{}
					for _, id := range ready {
						in[id] = true
					}
					for _, r := range recs {
						if r.Due <= now && !in[r.ID] {
							t.Fatalf("limit %d: record of ready task %s written but not its ready entry", limit, r.ID)
						}
						if r.Due > now {
							ids, _ := redis.Strings(admin.Do("LRANGE", st.Keys.Bucket("default", buckets.BucketTime(r.Due, st.Resolution)), 0, -1))
							if !contains(ids, r.ID) {
								t.Fatalf("limit %d: scheduled task %s not in its bucket", limit, r.ID)
							}
						}
					}
				}
				if !fc.tripped() && err != nil {
					t.Fatalf("limit %d: error without a fault: %v", limit, err)
				}
			}
		}
	})
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// Never early: stepping the dispatcher's clock one millisecond at a time,
// no task is in a ready list before its due time on that clock, and each is
// there once its bucket time has come.
func TestNeverEarly(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		base := time.UnixMilli(time.Now().UnixMilli()/1000*1000 + 10_000)
		pclock := clocktest.NewSettable(base.Add(-5 * time.Second))
		e.cfg.Advanced.Clock = pclock
		c := e.client(t)
		due := map[string]time.Time{}
		for i := 0; i < 60; i++ {
			at := base.Add(time.Duration(i*7%53) * time.Millisecond).Add(time.Duration(i%3) * 100 * time.Microsecond)
			id, err := idOf(c.Enqueue(ctx, "t", nil, At(at)))
			if err != nil {
				t.Fatal(err)
			}
			due[id] = at
		}
		dclock := clocktest.NewSettable(time.Time{})
		e.cfg.Advanced.Clock = dclock
		d, err := newDispatcher(e.pool, e.cfg)
		if err != nil {
			t.Fatal(err)
		}
		h := []*rconn.Holder{{Pool: e.pool}}
		defer h[0].Close()
		res := e.cfg.withDefaults().Advanced.Resolution
		for step := base.Add(-2 * time.Millisecond); step.Before(base.Add(80 * time.Millisecond)); step = step.Add(time.Millisecond) {
			dclock.Set(step)
			for {
				next, err := d.round(ctx, h)
				if err != nil {
					t.Fatal(err)
				}
				if next != 0 {
					break
				}
			}
			ready := map[string]bool{}
			for _, id := range e.readyIDs(t, "default") {
				ready[id] = true
			}
			for id, at := range due {
				if ready[id] && step.Before(at) {
					t.Fatalf("task due %v ready at %v: early", at, step)
				}
				if !ready[id] && !step.Before(at.Add(res+time.Millisecond)) {
					t.Fatalf("task due %v still not ready at %v (resolution %v)", at, step, res)
				}
			}
		}
	})
}

func redistestMini(t testing.TB) *redistestServer { return miniServer(t) }

// Due times are kept in milliseconds rounded up: a task due a fraction of a
// millisecond from now waits for its bucket, a task due by now is ready.
func TestDueRounding(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	now := time.UnixMilli(1_800_000_000_000).Add(300 * time.Microsecond)
	e.cfg.Advanced.Clock = clocktest.NewSettable(now)
	c := e.client(t)
	ctx := context.Background()
	soon, _ := idOf(c.Enqueue(ctx, "t", nil, At(now.Add(400*time.Microsecond))))
	due, _ := idOf(c.Enqueue(ctx, "t", nil, At(now)))
	past, _ := idOf(c.Enqueue(ctx, "t", nil, At(now.Add(-time.Hour))))
	for id, want := range map[string]State{soon: StateScheduled, due: StateReady, past: StateReady} {
		info, err := c.Lookup(ctx, id)
		if err != nil || info.State != want {
			t.Fatalf("state %v %v, want %s", info.State, err, want)
		}
		if want == StateScheduled && info.Due.Before(now.Add(400*time.Microsecond)) {
			t.Fatalf("stored due %v is before the asked %v", info.Due, now.Add(400*time.Microsecond))
		}
	}
}
