package engine

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Eight producers race to enqueue one unique key 1,000 times in all:
// exactly one task is written, and every refusal names it.
func TestUniqueRace(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	const producers, total = 8, 1000
	var (
		wg      sync.WaitGroup
		won     atomic.Int32
		winners sync.Map
		holders sync.Map
	)
	start := make(chan struct{})
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; i < total/producers; i++ {
				info, err := c.Enqueue(context.Background(), "t", []byte(fmt.Sprint(p, i)), UniqueKey("race", 0))
				var dup *ExistsError
				switch {
				case err == nil:
					won.Add(1)
					winners.Store(info.ID, true)
				case errors.As(err, &dup) && errors.Is(err, ErrDuplicate):
					holders.Store(dup.IDs[0], true)
				default:
					t.Errorf("enqueue: %v", err)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if n := won.Load(); n != 1 {
		t.Fatalf("%d enqueues succeeded, want exactly 1", n)
	}
	var winner string
	winners.Range(func(k, _ any) bool { winner = k.(string); return true })
	holders.Range(func(k, _ any) bool {
		if k.(string) != winner {
			t.Errorf("a refusal named %s, not the task written (%s)", k, winner)
		}
		return true
	})
	keys, err := redis.Strings(e.admin(t).Do("KEYS", e.key("t:*")))
	if err != nil || len(keys) != 1 {
		t.Fatalf("task records: %v %v, want exactly one", keys, err)
	}
}

// Unique(ttl) is keyed by queue, type and payload: another payload, type
// or queue is another key. A batch is all or nothing, and refuses two of
// its own tasks with one key before writing anything.
func TestUniqueDigestAndBatch(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	ctx := context.Background()
	first, err := c.Enqueue(ctx, "t", []byte("a"), Unique(0))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Enqueue(ctx, "t", []byte("a"), Unique(time.Hour))
	var dup *ExistsError
	if !errors.As(err, &dup) || dup.IDs[0] != first.ID {
		t.Fatalf("same queue, type, payload: %v, want a duplicate of %s", err, first.ID)
	}
	for _, o := range [][]Option{{Unique(0)}, {Unique(0), Queue("other")}} {
		if _, err := c.Enqueue(ctx, "t", []byte("b"), o...); err != nil {
			t.Fatalf("another payload or queue: %v", err)
		}
	}
	if _, err := c.Enqueue(ctx, "u", []byte("a"), Unique(0)); err != nil {
		t.Fatalf("another type: %v", err)
	}
	before := countKeys(t, e, "t:*")
	_, err = c.EnqueueBatch(ctx, []NewTask{
		{Type: "n", Options: []Option{UniqueKey("fresh", 0)}},
		{Type: "t", Payload: []byte("a"), Options: []Option{Unique(0)}},
	})
	if !errors.As(err, &dup) || dup.IDs[0] != first.ID {
		t.Fatalf("batch with one duplicate: %v", err)
	}
	_, err = c.EnqueueBatch(ctx, []NewTask{
		{Type: "n", Options: []Option{UniqueKey("twice", 0)}},
		{Type: "m", Options: []Option{UniqueKey("twice", 0)}},
	})
	if !errors.Is(err, ErrDuplicate) {
		t.Fatalf("batch with one key twice: %v", err)
	}
	if after := countKeys(t, e, "t:*"); after != before {
		t.Fatalf("refused batches wrote %d records", after-before)
	}
	if n := countKeys(t, e, "u:k:fresh"); n != 0 {
		t.Fatalf("a refused batch took a key")
	}
	for _, bad := range []Option{UniqueKey("", 0), UniqueKey(strings.Repeat("k", 201), 0), UniqueKey("a\nb", 0), Unique(-time.Second)} {
		if _, err := c.Enqueue(ctx, "t", nil, bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("bad unique option: %v, want ErrInvalid", err)
		}
	}
}

func countKeys(t testing.TB, e *env, pattern string) int {
	t.Helper()
	keys, err := redis.Strings(e.admin(t).Do("KEYS", e.key(pattern)))
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

// uniqueRows is the state table of docs/unique.md, row by row: how to
// bring a task holding a key into the state, and whether the key is then
// held. TestUniqueStateTable checks each row against a server, and
// TestUniqueDocTable that the doc says the same.
var uniqueRows = []struct {
	row  string
	held bool
}{
	{"scheduled", true},
	{"ready", true},
	{"running", true},
	{"retrying", true},
	{"recovered after its worker died", true},
	{"done", false},
	{"dead", false},
	{"cancelled", false},
	{"purged", false},
	{"ttl passed", false},
	{"ttl passed while running", false},
	{"revived dead letter, key free", true},
}

func TestUniqueStateTable(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	e.cfg.RetryDelay = func(*Task, int, error) time.Duration { return time.Hour }
	c := e.client(t)
	ctx := context.Background()
	release := make(chan struct{})
	defer close(release)
	started := make(chan string, 16)
	mux := NewMux()
	mux.HandleFunc("block", func(ctx context.Context, t *Task) error {
		started <- t.ID
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	mux.HandleFunc("ok", func(context.Context, *Task) error { return nil })
	mux.HandleFunc("fail", func(context.Context, *Task) error { return errors.New("boom") })
	mux.HandleFunc("die", func(context.Context, *Task) error { return Permanent(errors.New("boom")) })
	w, err := newWorker(e.pool, e.cfg, mux)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, w.Run)
	wait := func(id string) *Outcome {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		o, err := c.Wait(wctx, id)
		if err != nil {
			t.Fatalf("wait %s: %v", id, err)
		}
		return o
	}
	for _, row := range uniqueRows {
		t.Run(strings.ReplaceAll(row.row, " ", "_"), func(t *testing.T) {
			key := UniqueKey("row-"+row.row, 0)
			enq := func(typ string, opts ...Option) string {
				t.Helper()
				info, err := c.Enqueue(ctx, typ, nil, append(opts, key)...)
				if err != nil {
					t.Fatalf("enqueue %s: %v", typ, err)
				}
				return info.ID
			}
			var holder string
			switch row.row {
			case "scheduled":
				holder = enq("ok", In(time.Hour))
			case "ready":
				holder = enq("ok", Queue("nobody"))
			case "running":
				holder = enq("block")
				<-started
			case "retrying":
				holder = enq("fail")
				waitFor(t, outcomeWait, "retrying", func() bool { return e.state(t, holder) == StateRetrying })
			case "recovered after its worker died":
				// A task a dead worker held goes back to its queue still
				// holding its key: Requeue is not a final transition.
				holder = enq("ok", Queue("nobody"))
				conn := e.admin(t)
				if _, err := conn.Do("RPOPLPUSH", e.key("q:nobody"), e.key("f:ghost")); err != nil {
					t.Fatal(err)
				}
				if _, err := w.store.(*redisStore).st.RecoverAllInflight(ctx, conn, "ghost", ms(time.Now()), true); err != nil {
					t.Fatal(err)
				}
			case "done":
				if o := wait(enq("ok")); o.State != StateDone {
					t.Fatalf("state %s", o.State)
				}
			case "dead":
				if o := wait(enq("die")); o.State != StateDead {
					t.Fatalf("state %s", o.State)
				}
			case "cancelled":
				id := enq("ok", In(time.Hour))
				if err := c.Cancel(ctx, id); err != nil {
					t.Fatal(err)
				}
			case "purged":
				id := enq("die")
				wait(id)
				if res := act(t, c, ActionDelete, id); res.Done != 1 {
					t.Fatalf("delete the dead letter: %+v", res)
				}
			case "ttl passed", "ttl passed while running":
				key = UniqueKey("row-"+row.row, time.Second)
				typ := "ok"
				if row.row == "ttl passed while running" {
					typ = "block"
				}
				if typ == "block" {
					enq(typ)
					<-started
				} else {
					enq(typ, Queue("nobody"))
				}
				// The server expires the key on its own clock.
				waitFor(t, outcomeWait, "the key to expire", func() bool { return countKeys(t, e, "u:k:row-"+row.row) == 0 })
			case "revived dead letter, key free":
				id := enq("die")
				wait(id)
				// The queue paused, the worker cannot run the revived
				// task again (and bury it, freeing the key) before the
				// check: the row is about the revived state.
				if err := c.PauseQueue(ctx, "default"); err != nil {
					t.Fatal(err)
				}
				retryDead(t, c, id)
				holder = id
			}
			_, err := c.Enqueue(ctx, "ok", nil, key, Queue("nobody"))
			var dup *ExistsError
			switch {
			case row.held && !errors.As(err, &dup):
				t.Fatalf("key free (enqueue: %v), want held", err)
			case row.held && dup.IDs[0] != holder:
				t.Fatalf("duplicate names %s, want %s", dup.IDs[0], holder)
			case !row.held && err != nil:
				t.Fatalf("key held (enqueue: %v), want free", err)
			}
		})
	}
}

// A dead letter whose key another task took meanwhile is not revived: a
// retry skips it and it stays dead.
func TestUniqueReviveRefused(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	ctx := context.Background()
	mux := NewMux()
	mux.HandleFunc("die", func(context.Context, *Task) error { return Permanent(errors.New("boom")) })
	w, _ := newWorker(e.pool, e.cfg, mux)
	runBackground(t, w.Run)
	dead, err := c.Enqueue(ctx, "die", nil, UniqueKey("k", 0))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := c.Wait(wctx, dead.ID); err != nil {
		t.Fatal(err)
	}
	next, err := c.Enqueue(ctx, "ok", nil, UniqueKey("k", 0), Queue("nobody"))
	if err != nil {
		t.Fatal(err)
	}
	if res := act(t, c, ActionRetry, dead.ID); res.Done != 0 || res.Skipped != 1 {
		t.Fatalf("retry of a dead letter whose key %s holds: %+v, want skipped", next.ID, res)
	}
	if _, err := c.Enqueue(ctx, "ok", nil, UniqueKey("k", 0), Queue("nobody")); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("the key after the refused retry: %v, want still held by %s", err, next.ID)
	}
	if s := e.state(t, dead.ID); s != StateDead {
		t.Fatalf("refused revive left the task %s", s)
	}
}

// TestUniqueDocTable checks that docs/unique.md's state table says what
// TestUniqueStateTable checks: the same rows, held or free alike.
func TestUniqueDocTable(t *testing.T) {
	t.Parallel()
	f, err := os.Open("../docs/unique.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc := map[string]bool{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = strings.Contains(line, "State table")
			continue
		}
		if !in || !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| ---") || strings.HasPrefix(line, "| state") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), "|")
		if len(cells) < 2 {
			continue
		}
		name := strings.TrimSpace(cells[0])
		switch strings.TrimSpace(cells[1]) {
		case "held":
			doc[name] = true
		case "free":
			doc[name] = false
		default:
			t.Errorf("docs/unique.md row %q: %q is neither held nor free", name, cells[1])
		}
	}
	if len(doc) != len(uniqueRows) {
		t.Errorf("docs/unique.md has %d rows, the test %d", len(doc), len(uniqueRows))
	}
	for _, r := range uniqueRows {
		held, ok := doc[r.row]
		if !ok {
			t.Errorf("docs/unique.md has no row %q", r.row)
		} else if held != r.held {
			t.Errorf("docs/unique.md row %q: held %v, the test checks %v", r.row, held, r.held)
		}
	}
}
