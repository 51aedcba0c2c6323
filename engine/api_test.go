package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/internal/clocktest"
)

func TestMuxHandleTwicePanics(t *testing.T) {
	t.Parallel()
	m := NewMux()
	m.HandleFunc("t", func(context.Context, *Task) error { return nil })
	for name, f := range map[string]func(){
		"same type":    func() { m.HandleFunc("t", func(context.Context, *Task) error { return nil }) },
		"nil handler":  func() { m.Handle("u", nil) },
		"nil function": func() { m.HandleFunc("v", nil) },
	} {
		func() {
			defer func() {
				if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), "engine: Mux.Handle") {
					t.Errorf("%s: recovered %v, want a panic naming Mux.Handle", name, v)
				}
			}()
			f()
		}()
	}
	if got := m.Types(); len(got) != 1 || got[0] != "t" {
		t.Fatalf("Types() = %v after refused registrations", got)
	}
}

func TestRoles(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	for _, r := range []Roles{0, AllRoles + 1, 1 << 7} {
		if _, err := newLaneServer(e.pool, e.cfg, NewMux(), r); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewServer(roles %#x) = %v, want ErrInvalid", uint8(r), err)
		}
	}
	s, err := newLaneServer(e.pool, e.cfg, nil, RoleDispatcher|RoleReaper)
	if err != nil || s.Dispatcher == nil || s.Reaper == nil || s.Worker != nil {
		t.Fatalf("NewServer(RoleDispatcher|RoleReaper) = %+v, %v", s, err)
	}
	s, err = newLaneServer(e.pool, e.cfg, NewMux(), AllRoles)
	if err != nil || s.Dispatcher == nil || s.Reaper == nil || s.Worker == nil {
		t.Fatalf("NewServer(AllRoles) = %+v, %v", s, err)
	}
	if !AllRoles.Has(RoleWorker|RoleReaper) || RoleWorker.Has(RoleReaper) {
		t.Fatal("Has is wrong")
	}
}

// The engine's sentinels are its own, and what a caller reads is one
// sentence in the engine's words, without the inner packages' names.
func TestErrorsInTheEnginesWords(t *testing.T) {
	t.Parallel()
	for _, pair := range [][2]error{{ErrNotFound, buckets.ErrNotFound}, {ErrAlreadyDone, buckets.ErrAlreadyDone},
		{ErrAlreadyRunning, buckets.ErrAlreadyRunning},
		{ErrTooLarge, buckets.ErrTooLarge}, {ErrInvalid, buckets.ErrInvalid}} {
		if pair[0] == pair[1] || errors.Is(pair[0], pair[1]) {
			t.Errorf("%v is buckets' %v", pair[0], pair[1])
		}
	}
	e := newEnv(t, miniServer(t))
	c := e.client(t)
	ctx := context.Background()
	id, err := idOf(c.Enqueue(ctx, "t", nil, In(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, DefaultConfig().MaxPayload+1)
	_, enqBig := c.Enqueue(ctx, "t", big)
	_, enqName := c.Enqueue(ctx, "", nil)
	_, enqBatch := c.EnqueueBatch(ctx, []NewTask{{Type: "t"}, {Type: "t", Options: []Option{Queue("bad name")}}})
	_, lookErr := c.Lookup(ctx, "missing")
	for _, tc := range []struct {
		err  error
		want error
		text string
	}{
		{c.Cancel(ctx, id), ErrAlreadyDone, "engine: cannot cancel task " + id + ": it has finished already"},
		{c.Cancel(ctx, "missing"), ErrNotFound, "engine: cannot cancel task missing: there is no such task"},
		{lookErr, ErrNotFound, "engine: task missing not found"},
		{enqBig, ErrTooLarge, "engine: payload of"},
		{enqName, ErrInvalid, "engine: task type"},
		{enqBatch, ErrInvalid, "engine: task 1: queue name"},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%v: want %v", tc.err, tc.want)
			continue
		}
		msg := tc.err.Error()
		if !strings.HasPrefix(msg, tc.text) || strings.Contains(msg, "buckets:") || strings.Contains(msg, "txn:") || strings.Count(msg, "engine:") > 2 {
			t.Errorf("message %q, want it to start %q and name no inner package", msg, tc.text)
		}
	}
}

// A cancelled context is still recognised through the engine's errors.
func TestErrorsKeepContext(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	c := e.client(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Enqueue(ctx, "t", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Enqueue with a cancelled context = %v", err)
	}
}

// The retry policy is given the task as its handler saw it and the error.
func TestRetryDelaySeesTaskAndError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	var mu sync.Mutex
	var calls []string
	e.cfg.RetryDelay = func(task *Task, attempt int, err error) time.Duration {
		mu.Lock()
		calls = append(calls, fmt.Sprintf("%s %s attempt=%d run=%d err=%v", task.ID, task.Type, attempt, task.Attempt, err))
		mu.Unlock()
		return time.Millisecond
	}
	mux := NewMux()
	mux.HandleFunc("fails", func(_ context.Context, t *Task) error { return fmt.Errorf("boom %d", t.Attempt) })
	srv, err := newLaneServer(e.pool, e.cfg, mux, AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, srv.Run)
	ctx := context.Background()
	id, err := idOf(e.client(t).Enqueue(ctx, "fails", nil, MaxAttempts(3), TaskID("retry-policy")))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, outcomeWait, "dead", func() bool { e.tick(); return e.state(t, id) == StateDead })
	mu.Lock()
	defer mu.Unlock()
	want := "[retry-policy fails attempt=1 run=1 err=boom 1 retry-policy fails attempt=2 run=2 err=boom 2]"
	if fmt.Sprint(calls) != want {
		t.Fatalf("RetryDelay calls %v, want %v", calls, want)
	}
}

// Enqueue and its kin return what was written: the id, the queue, the due
// time the producer asked for (on its own clock) and the state.
func TestEnqueueReturnsInfo(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniServer(t))
	clock := clocktest.NewSettable(time.UnixMilli(1_700_000_000_000).Add(300 * time.Microsecond))
	e.cfg.Advanced.Clock = clock
	c := e.client(t)
	ctx := context.Background()
	now := clock.Now()
	in, err := c.Enqueue(ctx, "t", []byte("p"), In(90*time.Second), Queue("q"), TaskID("in"))
	if err != nil {
		t.Fatal(err)
	}
	// Due is rounded up to the millisecond, never earlier than asked.
	wantDue := time.UnixMilli(msCeil(now.Add(90 * time.Second)))
	if in.ID != "in" || in.Queue != "q" || in.Type != "t" || string(in.Payload) != "p" || !in.Due.Equal(wantDue) ||
		in.State != StateScheduled || !in.Created.Equal(time.UnixMilli(ms(now))) || in.Attempt != 1 {
		t.Fatalf("Enqueue with In = %+v, want id in, queue q, due %v, scheduled", in, wantDue)
	}
	at := now.Add(time.Hour)
	atInfo, err := c.Enqueue(ctx, "t", nil, At(at))
	if err != nil || !atInfo.Due.Equal(time.UnixMilli(msCeil(at))) || atInfo.State != StateScheduled || atInfo.Queue != "default" {
		t.Fatalf("Enqueue with At = %+v, %v", atInfo, err)
	}
	ready, err := c.Enqueue(ctx, "t", nil)
	if err != nil || ready.State != StateReady || ready.Due.After(now) || ready.ID == "" {
		t.Fatalf("Enqueue = %+v, %v", ready, err)
	}
	batch, err := c.EnqueueBatch(ctx, []NewTask{{Type: "a"}, {Type: "b", Options: []Option{In(time.Minute)}}})
	if err != nil || len(batch) != 2 || batch[0].State != StateReady || batch[1].State != StateScheduled || batch[1].Type != "b" {
		t.Fatalf("EnqueueBatch = %+v, %v", batch, err)
	}
	// Lookup agrees with what Enqueue said.
	got, err := c.Lookup(ctx, "in")
	if err != nil || !got.Due.Equal(in.Due) || got.State != in.State || got.Queue != in.Queue {
		t.Fatalf("Lookup = %+v, %v; Enqueue said %+v", got, err, in)
	}
}
