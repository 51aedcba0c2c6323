package engine

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// A handler's result is stored with its success: Result and Wait return
// it, a task that ended earlier is found at once, one still to run is
// waited for without polling, and dead and cancelled tasks report so.
func TestResultAndWait(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, e *env) {
		e.cfg.MaxResult = 16
		c := e.client(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		mux := NewMux()
		mux.HandleFunc("ok", func(ctx context.Context, t *Task) error {
			return SetResult(ctx, append([]byte("r:"), t.Payload...))
		})
		mux.HandleFunc("big", func(ctx context.Context, t *Task) error {
			if err := SetResult(ctx, bytes.Repeat([]byte{1}, 17)); !errors.Is(err, ErrTooLarge) {
				return Permanent(errors.New("no refusal"))
			}
			return Permanent(errors.New("result too large"))
		})
		mux.HandleFunc("fail", func(ctx context.Context, t *Task) error {
			_ = SetResult(ctx, []byte("not kept"))
			return Permanent(errors.New("boom"))
		})
		ok, err := c.Enqueue(ctx, "ok", []byte("1"))
		if err != nil {
			t.Fatal(err)
		}
		// Wait blocks before any worker runs.
		got := make(chan *Outcome, 1)
		go func() {
			o, err := c.Wait(ctx, ok.ID)
			if err != nil {
				t.Errorf("wait: %v", err)
			}
			got <- o
		}()
		w, _ := newWorker(e.pool, e.cfg, mux)
		runBackground(t, w.Run)
		o := <-got
		if o == nil || o.State != StateDone || string(o.Result) != "r:1" || o.Err() != nil {
			t.Fatalf("wait: %+v", o)
		}
		if r, err := c.Result(ctx, ok.ID); err != nil || string(r) != "r:1" {
			t.Fatalf("result: %q %v", r, err)
		}
		// Ended before Wait: found at once.
		if o, err := c.Wait(ctx, ok.ID); err != nil || string(o.Result) != "r:1" {
			t.Fatalf("second wait: %+v %v", o, err)
		}
		for typ, want := range map[string]string{"big": "result too large", "fail": "boom"} {
			info, err := c.Enqueue(ctx, typ, nil)
			if err != nil {
				t.Fatal(err)
			}
			o, err := c.Wait(ctx, info.ID)
			if err != nil || o.State != StateDead || !strings.Contains(o.Error, want) || o.Result != nil || o.Err() == nil {
				t.Fatalf("%s: %+v %v", typ, o, err)
			}
		}
		later, _ := c.Enqueue(ctx, "ok", nil, In(time.Hour))
		// Cancelled while Wait blocks (its BRPOPLPUSH sent).
		type waited struct {
			o   *Outcome
			err error
		}
		brpops := e.srv.Census.Count("BRPOPLPUSH")
		cancelled := make(chan waited, 1)
		go func() {
			o, err := c.Wait(ctx, later.ID)
			cancelled <- waited{o, err}
		}()
		waitFor(t, outcomeWait, "the Wait to block", func() bool { return e.srv.Census.Count("BRPOPLPUSH") > brpops })
		_ = c.Cancel(ctx, later.ID)
		if w := <-cancelled; w.err != nil || w.o.State != StateCancelled {
			t.Fatalf("cancelled: %+v %v", w.o, w.err)
		}
		if _, err := c.Wait(ctx, "no-such-task"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("wait for nothing: %v", err)
		}
		short, cancelShort := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer cancelShort()
		never, _ := c.Enqueue(ctx, "ok", nil, In(time.Hour))
		if _, err := c.Wait(short, never.ID); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("wait past the context: %v", err)
		}
		if err := SetResult(ctx, nil); !errors.Is(err, errNoResultHere) {
			t.Fatalf("SetResult outside a handler: %v", err)
		}
	})
}

// With DoneRetention negative the record goes with the success; the
// completion list still tells Wait the outcome.
func TestWaitWithoutDoneRecord(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	e.cfg.DoneRetention = -1
	e.cfg.ResultRetention = time.Minute
	c := e.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w, _ := newWorker(e.pool, e.cfg, HandlerFunc(func(ctx context.Context, t *Task) error { return SetResult(ctx, []byte("x")) }))
	runBackground(t, w.Run)
	info, _ := c.Enqueue(ctx, "t", nil)
	o, err := c.Wait(ctx, info.ID)
	if err != nil || o.State != StateDone || string(o.Result) != "x" {
		t.Fatalf("%+v %v", o, err)
	}
	if _, err := c.Lookup(ctx, info.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("lookup: %v, want the record gone", err)
	}
	if o, err := c.Wait(ctx, info.ID); err != nil || o.State != StateDone {
		t.Fatalf("wait after: %+v %v", o, err)
	}
}

// A worker that dies at any step between taking a task and recording its
// result: Wait, started before, still returns the final outcome (from
// the worker that runs it next), and exactly one reply task is enqueued
// for the task, whatever the step.
func TestWaitAndReplyAcrossWorkerDeath(t *testing.T) {
	t.Parallel()
	for _, stage := range []string{"after-pop", "after-claim", "before-finish", "after-finish"} {
		t.Run(stage, func(t *testing.T) {
			t.Parallel()
			e := realEnv(t)
			c := e.client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			info, err := c.Enqueue(ctx, "t", []byte("p"), ReplyTo("replies"))
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan *Outcome, 1)
			go func() {
				o, err := c.Wait(ctx, info.ID)
				if err != nil {
					t.Errorf("wait: %v", err)
				}
				got <- o
			}()
			h := HandlerFunc(func(ctx context.Context, t *Task) error { return SetResult(ctx, []byte("out")) })
			e.dieAndTakeOver(t, h, stage)
			o := <-got
			if o == nil || o.State != StateDone || string(o.Result) != "out" {
				t.Fatalf("wait: %+v", o)
			}
			rs := replyTasks(t, c, "replies")
			if len(rs) != 1 || rs[0].ID != info.ID || rs[0].State != StateDone || string(rs[0].Result) != "out" {
				t.Fatalf("replies: %+v, want exactly one, done with its result", rs)
			}
		})
	}
}

// replyTasks decodes the reply tasks waiting in queue q (no worker here
// serves it), oldest first.
func replyTasks(t testing.TB, c *laneClient, q string) []*Outcome {
	t.Helper()
	page, err := c.inspector().ListTasks(context.Background(), ListOptions{Filter: Filter{Queue: q, State: StateReady}, Limit: maxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	var out []*Outcome
	for _, v := range page.Tasks {
		if v.Type != ReplyType {
			t.Fatalf("task %s of type %q in the reply queue", v.ID, v.Type)
		}
		o, err := DecodeReply(v.Payload)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, o)
	}
	return out
}

// Every final outcome sends one reply: done with its result, dead with
// its error, cancelled; a revived dead letter that then succeeds sends a
// second reply, for its second outcome. Retries send none.
func TestReplyPerOutcome(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var fails = make(chan bool, 1)
	fails <- true
	mux := NewMux()
	mux.HandleFunc("ok", func(ctx context.Context, t *Task) error { return SetResult(ctx, t.Payload) })
	mux.HandleFunc("flaky", func(ctx context.Context, t *Task) error {
		if t.Attempt == 1 {
			return errors.New("first try fails")
		}
		return nil
	})
	mux.HandleFunc("once", func(ctx context.Context, t *Task) error {
		select {
		case <-fails:
			return Permanent(errors.New("dies once"))
		default:
			return nil
		}
	})
	w, _ := newWorker(e.pool, e.cfg, mux)
	runBackground(t, w.Run)
	d, _ := newDispatcher(e.pool, e.cfg)
	runBackground(t, d.Run)
	ok, _ := c.Enqueue(ctx, "ok", []byte("res"), ReplyTo("r"))
	flaky, _ := c.Enqueue(ctx, "flaky", nil, ReplyTo("r"))
	once, _ := c.Enqueue(ctx, "once", nil, ReplyTo("r"))
	gone, _ := c.Enqueue(ctx, "ok", nil, ReplyTo("r"), In(time.Hour))
	if err := c.Cancel(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	replies := map[string][]*Outcome{}
	waitFor(t, outcomeWait, "four replies", func() bool { return len(replyTasks(t, c, "r")) >= 4 })
	for _, r := range replyTasks(t, c, "r") {
		replies[r.ID] = append(replies[r.ID], r)
	}
	if r := replies[ok.ID]; len(r) != 1 || r[0].State != StateDone || string(r[0].Result) != "res" {
		t.Fatalf("done: %+v", r)
	}
	if r := replies[flaky.ID]; len(r) != 1 || r[0].State != StateDone {
		t.Fatalf("retried then done: %+v", r)
	}
	if r := replies[once.ID]; len(r) != 1 || r[0].State != StateDead || r[0].Error != "dies once" {
		t.Fatalf("dead: %+v", r)
	}
	if r := replies[gone.ID]; len(r) != 1 || r[0].State != StateCancelled {
		t.Fatalf("cancelled: %+v", r)
	}
	if res, err := c.inspector().Act(ctx, ActionRetry, once.ID); err != nil || res.Done != 1 {
		t.Fatalf("retry the dead letter: %+v %v", res, err)
	}
	if o, err := c.Wait(ctx, once.ID); err != nil || o.State != StateDone {
		t.Fatalf("wait after revival: %+v %v", o, err)
	}
	waitFor(t, outcomeWait, "the revived task's reply", func() bool { return len(replyTasks(t, c, "r")) >= 5 })
	if rs := replyTasks(t, c, "r"); len(rs) != 5 || rs[4].ID != once.ID || rs[4].State != StateDone {
		t.Fatalf("replies after the revival: %+v, want a fifth, done", rs)
	}
	if _, err := c.Enqueue(ctx, "ok", nil, ReplyTo("bad name")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad reply queue: %v", err)
	}
	// Results, completion lists, reply tasks and unique keys are nothing
	// for the checker to report.
	if _, err := c.Enqueue(ctx, "ok", nil, UniqueKey("k", time.Hour), ReplyTo("r"), In(time.Hour)); err != nil {
		t.Fatal(err)
	}
	rep, err := c.Check(ctx, CheckOptions{})
	if err != nil || len(rep.Findings) != 0 || len(rep.Unconfirmed) != 0 {
		t.Fatalf("check: %+v %v", rep, err)
	}
}

// ReplyTo enqueues one reply task per final outcome into the named
// queue, in the same transaction; a worker of that queue handles it like
// any task, and DecodeReply reads its payload.
func TestReplyTo(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	e.cfg.Queues = []QueueConfig{{Name: "default"}, {Name: "answers"}}
	c := e.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan *Outcome, 8)
	mux := NewMux()
	mux.HandleFunc("ok", func(ctx context.Context, t *Task) error { return SetResult(ctx, []byte("42")) })
	mux.HandleFunc("die", func(ctx context.Context, t *Task) error { return Permanent(errors.New("no")) })
	mux.HandleFunc(ReplyType, func(ctx context.Context, task *Task) error {
		r, err := DecodeReply(task.Payload)
		if err != nil {
			t.Errorf("reply task payload: %v", err)
			return nil
		}
		if task.Queue != "answers" || !strings.HasPrefix(task.ID, r.ID+"~r") {
			t.Errorf("reply task %s in queue %s for %s", task.ID, task.Queue, r.ID)
		}
		got <- r
		return nil
	})
	w, _ := newWorker(e.pool, e.cfg, mux)
	runBackground(t, w.Run)
	ok, _ := c.Enqueue(ctx, "ok", nil, ReplyTo("answers"))
	dead, _ := c.Enqueue(ctx, "die", nil, ReplyTo("answers"))
	replies := map[string]*Outcome{}
	for len(replies) < 2 {
		select {
		case r := <-got:
			if replies[r.ID] != nil {
				t.Fatalf("a second reply for %s", r.ID)
			}
			replies[r.ID] = r
		case <-ctx.Done():
			t.Fatalf("replies: %v", replies)
		}
	}
	if r := replies[ok.ID]; r == nil || r.State != StateDone || string(r.Result) != "42" {
		t.Fatalf("done reply: %+v", r)
	}
	if r := replies[dead.ID]; r == nil || r.State != StateDead || r.Error != "no" {
		t.Fatalf("dead reply: %+v", r)
	}
	if _, err := c.Enqueue(ctx, "ok", nil, ReplyTo("no queue")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad reply queue: %v", err)
	}
	rep, err := c.Check(ctx, CheckOptions{})
	if err != nil || len(rep.Findings) != 0 {
		t.Fatalf("check: %+v %v", rep, err)
	}
}

// Several waiters on one task all get its outcome from the one completion
// element: each BRPOPLPUSH hands it back onto the same list.
func TestManyWaiters(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	info, err := c.Enqueue(ctx, "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 4
	got := make(chan *Outcome, waiters)
	for i := 0; i < waiters; i++ {
		go func() {
			o, err := c.Wait(ctx, info.ID)
			if err != nil {
				t.Errorf("wait: %v", err)
			}
			got <- o
		}()
	}
	w, _ := newWorker(e.pool, e.cfg, HandlerFunc(func(ctx context.Context, t *Task) error { return SetResult(ctx, []byte("r")) }))
	runBackground(t, w.Run)
	for i := 0; i < waiters; i++ {
		if o := <-got; o == nil || o.State != StateDone || string(o.Result) != "r" {
			t.Fatalf("waiter %d: %+v", i, o)
		}
	}
	if n := listLen(t, e, "c:"+info.ID); n != 1 {
		t.Fatalf("completion list holds %d elements, want 1", n)
	}
	// The rotation keeps the list's TTL: it still expires on its own.
	if ttl, err := e.admin(t).Do("TTL", e.key("c:"+info.ID)); err != nil || ttl.(int64) <= 0 {
		t.Fatalf("completion list TTL %v %v, want one", ttl, err)
	}
}

// A success nobody waits for pushes no completion list when its done
// record is kept at least as long as the list would be (the defaults);
// a later Wait reads the outcome and the result from the record. With the
// record kept shorter, the list is pushed all the same.
func TestWaitAfterUnwaitedSuccess(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		done     time.Duration
		wantList bool
	}{
		{"record kept", 0, false},                       // default: 10 min, results as long
		{"record kept shorter", 30 * time.Second, true}, // the list: 60 s at least
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := realEnv(t)
			e.cfg.DoneRetention = tc.done
			finished := make(chan string, 1)
			e.cfg.Observer = ObserverFunc(func(ev Event) {
				if ev.Kind == EventFinished {
					finished <- ev.TaskID
				}
			})
			c := e.client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			info, err := c.Enqueue(ctx, "t", nil)
			if err != nil {
				t.Fatal(err)
			}
			w, _ := newWorker(e.pool, e.cfg, HandlerFunc(func(ctx context.Context, t *Task) error { return SetResult(ctx, []byte("x")) }))
			runBackground(t, w.Run)
			select {
			case id := <-finished:
				if id != info.ID {
					t.Fatalf("finished %s, want %s", id, info.ID)
				}
			case <-ctx.Done():
				t.Fatal("the task never finished")
			}
			n, err := redis.Int(e.admin(t).Do("EXISTS", e.key("c:"+info.ID)))
			if err != nil {
				t.Fatal(err)
			}
			if got := n == 1; got != tc.wantList {
				t.Fatalf("completion list exists: %v, want %v", got, tc.wantList)
			}
			o, err := c.Wait(ctx, info.ID)
			if err != nil || o.State != StateDone || string(o.Result) != "x" || o.Finished.IsZero() {
				t.Fatalf("wait: %+v %v", o, err)
			}
		})
	}
}

func listLen(t testing.TB, e *env, key string) int {
	t.Helper()
	n, err := e.admin(t).Do("LLEN", e.key(key))
	if err != nil {
		t.Fatal(err)
	}
	return int(n.(int64))
}
