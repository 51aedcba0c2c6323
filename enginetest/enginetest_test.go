package enginetest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
)

// testCtx bounds a test's calls.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// fakeTB captures Errorf and Fatalf; the rest goes to the real test.
type fakeTB struct {
	testing.TB
	mu     sync.Mutex
	errs   []string
	fatals []string
}

func (f *fakeTB) Errorf(format string, a ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, fmt.Sprintf(format, a...))
}

func (f *fakeTB) Fatalf(format string, a ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fatals = append(f.fatals, fmt.Sprintf(format, a...))
}

func (f *fakeTB) captured() (errs, fatals []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.errs...), append([]string(nil), f.fatals...)
}

// A task that fails three times runs four times in one Drain, its
// backoffs (the default: seconds to minutes) passed on the Env's clock.
func TestDrainRetriesWithBackoff(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := New(t, engine.Config{})
	start := env.Now()
	if _, err := env.Client().Enqueue(ctx, "flaky", []byte("x"), engine.MaxAttempts(5)); err != nil {
		t.Fatal(err)
	}
	var attempts []int
	h := engine.HandlerFunc(func(ctx context.Context, task *engine.Task) error {
		attempts = append(attempts, task.Attempt)
		if task.Attempt < 4 {
			return fmt.Errorf("attempt %d fails", task.Attempt)
		}
		return nil
	})
	res, err := env.Drain(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(attempts) != "[1 2 3 4]" {
		t.Errorf("attempts %v, want [1 2 3 4]", attempts)
	}
	var states []engine.State
	for _, r := range res.Runs {
		states = append(states, r.State)
		if r.State == engine.StateRetrying && r.Err == nil {
			t.Errorf("run %+v: a failed run without its error", r)
		}
	}
	if fmt.Sprint(states) != "[retrying retrying retrying done]" {
		t.Errorf("run states %v", states)
	}
	if res.States[engine.StateDone] != 1 || len(res.States) != 1 {
		t.Errorf("States %v, want one done", res.States)
	}
	// Three backoffs of at least 0.5 s, 1 s and 2 s passed on the clock.
	if d := env.Now().Sub(start); d < 3500*time.Millisecond {
		t.Errorf("clock moved %v, want the three backoffs", d)
	}
}

// A group's members and then its callback run in one Drain.
func TestDrainGroupCallback(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := New(t, engine.Config{})
	_, err := env.Client().EnqueueGroup(ctx, engine.Group{
		ID: "g1",
		Members: []engine.Step{{Type: "resize", Payload: []byte("a")}, {Type: "resize", Payload: []byte("b")},
			{Type: "resize", Payload: []byte("c"), Options: []engine.Option{engine.Queue("slow")}}},
		Callback: &engine.Step{Type: "album.ready", Options: []engine.Option{engine.Queue("notify")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var outcomes []engine.Outcome
	calls := 0
	mux := engine.NewMux()
	mux.HandleFunc("resize", func(ctx context.Context, task *engine.Task) error {
		return engine.SetResult(ctx, append([]byte("thumb-"), task.Payload...))
	})
	mux.HandleFunc("album.ready", func(ctx context.Context, task *engine.Task) error {
		calls++
		outcomes = task.Workflow.Outcomes
		return nil
	})
	res, err := env.Drain(ctx, mux)
	if err != nil {
		t.Fatal(err)
	}
	if calls != 1 || len(outcomes) != 3 {
		t.Fatalf("callback ran %d times with %d outcomes, want once with 3", calls, len(outcomes))
	}
	for _, o := range outcomes {
		if o.State != engine.StateDone || !strings.HasPrefix(string(o.Result), "thumb-") {
			t.Errorf("outcome %+v", o)
		}
	}
	if res.States[engine.StateDone] != 4 || len(res.Runs) != 4 {
		t.Errorf("States %v after %d runs, want 4 done", res.States, len(res.Runs))
	}
	if left, err := env.Enqueued(ctx, Match{}); err != nil || len(left) != 0 {
		t.Errorf("after Drain: %d waiting, %v", len(left), err)
	}
}

// A task due in an hour is scheduled until Drain moves the clock to it;
// a snooze of half an hour is passed on the clock too.
func TestDrainDelayedAndSnoozed(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := New(t, engine.Config{})
	start := env.Now()
	ti, err := env.Client().Enqueue(ctx, "report", nil, engine.In(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	got := env.RequireEnqueued(ctx, t, Match{Type: "report", Due: start.Add(time.Hour)})
	if len(got) != 1 || got[0].ID != ti.ID || got[0].State != engine.StateScheduled {
		t.Fatalf("enqueued %v, want %s scheduled", got, ti.ID)
	}
	var ran []time.Time
	h := engine.HandlerFunc(func(ctx context.Context, task *engine.Task) error {
		ran = append(ran, env.Now())
		if len(ran) == 1 {
			return engine.Snooze(30 * time.Minute)
		}
		return nil
	})
	res, err := env.Drain(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	if len(ran) != 2 {
		t.Fatalf("ran %d times, want 2", len(ran))
	}
	if ran[0].Before(start.Add(time.Hour)) || ran[1].Before(ran[0].Add(30*time.Minute)) {
		t.Errorf("ran at %v and %v after start, want 1h and 30m more", ran[0].Sub(start), ran[1].Sub(start))
	}
	if len(res.Runs) != 2 || res.Runs[0].State != engine.StateScheduled || res.Runs[1].State != engine.StateDone {
		t.Errorf("runs %+v", res.Runs)
	}
}

// Drain stops at MaxRuns with ErrMaxRuns: a task that always fails with
// many attempts left, and one that enqueues itself again.
func TestDrainMaxRuns(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	t.Run("failing", func(t *testing.T) {
		t.Parallel()
		env := New(t, engine.Config{})
		env.MaxRuns = 5
		if _, err := env.Client().Enqueue(ctx, "doomed", nil, engine.MaxAttempts(1000)); err != nil {
			t.Fatal(err)
		}
		res, err := env.Drain(ctx, engine.HandlerFunc(func(context.Context, *engine.Task) error { return errors.New("no") }))
		if !errors.Is(err, ErrMaxRuns) {
			t.Fatalf("Drain: %v, want ErrMaxRuns", err)
		}
		if len(res.Runs) != 5 || res.States[engine.StateRetrying] != 1 {
			t.Errorf("%d runs, States %v; want 5 runs, one retrying", len(res.Runs), res.States)
		}
	})
	t.Run("self-enqueueing", func(t *testing.T) {
		t.Parallel()
		env := New(t, engine.Config{})
		env.MaxRuns = 50
		if _, err := env.Client().Enqueue(ctx, "tick", nil); err != nil {
			t.Fatal(err)
		}
		res, err := env.Drain(ctx, engine.HandlerFunc(func(ctx context.Context, task *engine.Task) error {
			_, err := env.Client().Enqueue(ctx, "tick", nil, engine.In(time.Minute))
			return err
		}))
		if !errors.Is(err, ErrMaxRuns) {
			t.Fatalf("Drain: %v, want ErrMaxRuns", err)
		}
		if len(res.Runs) != 50 {
			t.Errorf("%d runs, want 50", len(res.Runs))
		}
	})
	t.Run("exactly", func(t *testing.T) {
		t.Parallel()
		env := New(t, engine.Config{})
		env.MaxRuns = 2
		for range 2 {
			if _, err := env.Client().Enqueue(ctx, "one", nil); err != nil {
				t.Fatal(err)
			}
		}
		res, err := env.Drain(ctx, engine.HandlerFunc(func(context.Context, *engine.Task) error { return nil }))
		if err != nil || res.States[engine.StateDone] != 2 {
			t.Errorf("Drain of MaxRuns tasks: %v, States %v", err, res.States)
		}
	})
}

// A RequireEnqueued that finds nothing fails the test with what is
// waiting.
func TestRequireEnqueuedFailureListsWaiting(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := New(t, engine.Config{})
	a, err := env.Client().Enqueue(ctx, "mail.send", []byte(`{"to":"ada"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := env.Client().Enqueue(ctx, "mail.send", []byte(`{"to":"bob"}`), engine.Queue("bulk"), engine.In(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeTB{TB: t}
	if got := env.RequireEnqueued(ctx, fake, Match{Type: "mail.send", Payload: []byte(`{"to":"eve"}`)}); got != nil {
		t.Errorf("returned %v", got)
	}
	errs, fatals := fake.captured()
	if len(fatals) != 1 || len(errs) != 0 {
		t.Fatalf("failures %q and %q, want one Fatalf", fatals, errs)
	}
	msg := fatals[0]
	for _, want := range []string{`no enqueued task matches type="mail.send" payload="{\"to\":\"eve\"}"`, "2 waiting",
		a.ID, `queue="default" state=ready`, b.ID, `queue="bulk" state=scheduled`, `payload="{\"to\":\"bob\"}"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
	// A match passes.
	fake = &fakeTB{TB: t}
	if got := env.RequireEnqueued(ctx, fake, Match{Payload: []byte(`{"to":"bob"}`)}); len(got) != 1 || got[0].ID != b.ID {
		t.Errorf("RequireEnqueued of bob's: %v", got)
	}
	if errs, fatals := fake.captured(); len(errs)+len(fatals) > 0 {
		t.Errorf("failures %q %q", errs, fatals)
	}
}

// Each field of a Match picks the task that has it and not the others.
func TestMatchFields(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := New(t, engine.Config{})
	due := env.Now().Add(90 * time.Minute)
	full, err := env.Client().Enqueue(ctx, "sync", []byte("full"), engine.Queue("crm"), engine.At(due),
		engine.MaxAttempts(3), engine.Timeout(time.Minute), engine.UniqueKey("sync-ada", 0),
		engine.Metadata(map[string]string{"tenant": "acme"}), engine.Priority(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client().Enqueue(ctx, "sync", []byte("plain"), engine.Queue("crm")); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client().Enqueue(ctx, "other", []byte("x")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		m    Match
		want int // matches; 1 means full alone
	}{
		{Match{}, 3},
		{Match{Type: "sync"}, 2},
		{Match{Queue: "crm"}, 2},
		{Match{Payload: []byte("full")}, 1},
		{Match{PayloadFunc: func(p []byte) bool { return strings.HasPrefix(string(p), "fu") }}, 1},
		{Match{Due: due}, 1},
		{Match{Due: due.Add(time.Second)}, 0},
		{Match{Due: due.Add(time.Second), DueWithin: 2 * time.Second}, 1},
		{Match{MaxAttempts: 3}, 1},
		{Match{Timeout: time.Minute}, 1},
		{Match{Priority: 2}, 1},
		{Match{Priority: 3}, 0},
		{Match{UniqueKey: "sync-ada"}, 1},
		{Match{UniqueKey: "sync-bob"}, 0},
		{Match{Metadata: map[string]string{"tenant": "acme"}}, 1},
		{Match{Metadata: map[string]string{"tenant": "other"}}, 0},
		{Match{Type: "sync", Queue: "crm", MaxAttempts: 3, UniqueKey: "sync-ada"}, 1},
	} {
		got, err := env.Enqueued(ctx, c.m)
		if err != nil {
			t.Fatalf("Enqueued(%v): %v", c.m, err)
		}
		if len(got) != c.want || (c.want == 1 && got[0].ID != full.ID) {
			t.Errorf("Enqueued(%v): %d tasks, want %d", c.m, len(got), c.want)
		}
	}
}

// A command outside the Redis 2.4 set is refused and fails the test.
func TestGuardFailsOnNon24Command(t *testing.T) {
	t.Parallel()
	fake := &fakeTB{TB: t}
	env := New(fake, engine.Config{})
	conn := env.Pool().Get()
	defer conn.Close()
	if _, err := conn.Do("SET", "k", "v", "EX", 10); err == nil || !strings.Contains(err.Error(), "redis24") {
		t.Errorf("SET EX: %v, want the guard's refusal", err)
	}
	if _, err := conn.Do("SET", "k", "v"); err != nil {
		t.Errorf("SET: %v", err)
	}
	errs, fatals := fake.captured()
	if len(errs) != 1 || !strings.Contains(errs[0], "not valid for Redis 2.4") || len(fatals) != 0 {
		t.Errorf("failures %q %q, want one Errorf for SET EX", errs, fatals)
	}
}

// Programs that import only engine do not build miniredis or enginetest
// in; enginetest does.
func TestDepsOfEngineLackTestOnlyModules(t *testing.T) {
	t.Parallel()
	deps := func(pkg string) string {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		return string(out)
	}
	engineDeps := deps("github.com/bucketq/bucketq/engine")
	for _, bad := range []string{"github.com/alicebob/miniredis", "github.com/yuin/gopher-lua", "go.uber.org/goleak",
		"github.com/chromedp", "github.com/bucketq/bucketq/enginetest", "github.com/bucketq/bucketq/internal/minihook"} {
		if strings.Contains(engineDeps, bad) {
			t.Errorf("engine depends on %s", bad)
		}
	}
	if !strings.Contains(deps("github.com/bucketq/bucketq/enginetest"), "github.com/alicebob/miniredis/v2\n") {
		t.Errorf("enginetest's deps lack miniredis")
	}
}

// A reply task into a queue first written by the run is drained too, and
// a task of a type the handler lacks fails as a Mux says, until dead.
func TestDrainReplyAndUnhandledType(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := New(t, engine.Config{})
	job, err := env.Client().Enqueue(ctx, "job", []byte("in"), engine.ReplyTo("replies"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client().Enqueue(ctx, "unknown", nil, engine.MaxAttempts(3)); err != nil {
		t.Fatal(err)
	}
	var replies []*engine.Outcome
	mux := engine.NewMux()
	mux.HandleFunc("job", func(ctx context.Context, task *engine.Task) error {
		return engine.SetResult(ctx, []byte("out"))
	})
	mux.HandleFunc(engine.ReplyType, func(ctx context.Context, task *engine.Task) error {
		o, err := engine.DecodeReply(task.Payload)
		if err != nil {
			return engine.Permanent(err)
		}
		if task.Queue != "replies" {
			t.Errorf("reply in queue %q", task.Queue)
		}
		replies = append(replies, o)
		return nil
	})
	res, err := env.Drain(ctx, mux)
	if err != nil {
		t.Fatal(err)
	}
	if len(replies) != 1 || replies[0].ID != job.ID || replies[0].State != engine.StateDone || string(replies[0].Result) != "out" {
		t.Errorf("replies %+v", replies)
	}
	if res.States[engine.StateDone] != 2 || res.States[engine.StateDead] != 1 {
		t.Errorf("States %v, want 2 done and 1 dead", res.States)
	}
	for _, r := range res.Runs {
		if r.Type == "unknown" && !errors.Is(r.Err, engine.ErrNoHandler) {
			t.Errorf("run of the unknown type: %v", r.Err)
		}
	}
}

// Keyed tasks: Enqueued finds them by their key, and Drain runs them,
// round-robin by key.
func TestKeyedTasks(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := New(t, engine.Config{Queues: []engine.QueueConfig{{Name: "default", KeyMaxRunning: 1}}})
	for _, k := range []string{"a", "a", "a", "b"} {
		if _, err := env.Client().Enqueue(ctx, "t", []byte(k), engine.Key(k)); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := env.Enqueued(ctx, Match{Key: "a"}); err != nil || len(got) != 3 {
		t.Fatalf("Enqueued(key a) = %d tasks, %v; want 3", len(got), err)
	}
	var order []string
	res, err := env.Drain(ctx, engine.HandlerFunc(func(_ context.Context, task *engine.Task) error {
		order = append(order, task.Key)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if res.States[engine.StateDone] != 4 {
		t.Fatalf("States %v, want 4 done", res.States)
	}
	if strings.Join(order, "") != "abaa" {
		t.Errorf("keys in the order %v; want b's task second, round-robin", order)
	}
}
