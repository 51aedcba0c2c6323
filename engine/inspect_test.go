package engine

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

// fixture is a namespace with tasks in every state on queue "work": a
// worker with two slots, both held by blocking tasks, so ready tasks stay
// ready.
type fixture struct {
	e                 *env
	c                 *laneClient
	in                *laneInspector
	worker            string
	release           chan struct{}
	scheduled, ready  []string
	running, retrying []string
	dead, done        []string
	stopWorker        func()
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	e := realEnv(t)
	e.cfg.Queues = []QueueConfig{{Name: "work", Weight: 1}}
	e.cfg.Concurrency = 2
	e.cfg.RetryDelay = func(*Task, int, error) time.Duration { return time.Hour }
	f := &fixture{e: e, c: e.client(t), release: make(chan struct{})}
	var err error
	if f.in, err = newLaneInspector(e.pool, e.cfg); err != nil {
		t.Fatal(err)
	}
	mux := NewMux()
	mux.HandleFunc("ok", func(context.Context, *Task) error { return nil })
	mux.HandleFunc("perm", func(context.Context, *Task) error { return Permanent(errors.New("bad input")) })
	mux.HandleFunc("flaky", func(context.Context, *Task) error { return errors.New("try later") })
	mux.HandleFunc("block", func(ctx context.Context, _ *Task) error {
		select {
		case <-f.release:
		case <-ctx.Done():
		}
		return nil
	})
	w, err := newWorker(e.pool, e.cfg, mux)
	if err != nil {
		t.Fatal(err)
	}
	f.worker = w.ID()
	f.stopWorker = runBackground(t, w.Run)
	t.Cleanup(func() { f.releaseAll() })
	ctx := checkCtx(t, time.Minute)
	enq := func(typ string, payload string, opts ...Option) string {
		t.Helper()
		info, err := f.c.Enqueue(ctx, typ, []byte(payload), append([]Option{Queue("work")}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return info.ID
	}
	for i := 0; i < 2; i++ {
		f.done = append(f.done, enq("ok", fmt.Sprintf(`{"n":%d}`, i)))
		f.dead = append(f.dead, enq("perm", fmt.Sprintf("dead payload %d", i)))
		f.retrying = append(f.retrying, enq("flaky", fmt.Sprintf("flaky payload %d", i)))
	}
	f.waitStats(t, "done, dead and retrying", func(q QueueInfo) bool {
		return q.Processed == 2 && q.Dead == 2 && q.Retrying == 2 && q.Running == 0
	})
	for i := 0; i < 2; i++ {
		f.running = append(f.running, enq("block", fmt.Sprintf("block %d", i)))
	}
	f.waitStats(t, "two running", func(q QueueInfo) bool { return q.Running == 2 })
	for i := 0; i < 3; i++ {
		f.ready = append(f.ready, enq("later", fmt.Sprintf("ready payload %d", i)))
	}
	for i := 0; i < 3; i++ {
		f.scheduled = append(f.scheduled, enq("sched", fmt.Sprintf("scheduled payload %d", i), In(time.Duration(i+1)*time.Hour)))
	}
	return f
}

func (f *fixture) releaseAll() {
	select {
	case <-f.release:
	default:
		close(f.release)
	}
}

func (f *fixture) waitStats(t *testing.T, what string, cond func(QueueInfo) bool) {
	t.Helper()
	waitFor(t, outcomeWait, what, func() bool {
		q, err := f.in.Queue(context.Background(), "work")
		return err == nil && cond(*q)
	})
}

// listAll pages through a listing and returns the ids in order.
func listAll(t *testing.T, in *laneInspector, opts ListOptions) (ids []string, views []*TaskInfo, total int64) {
	t.Helper()
	ctx := checkCtx(t, time.Minute)
	for i := 0; ; i++ {
		if i > 100000 {
			t.Fatalf("listing %+v does not end", opts.Filter)
		}
		p, err := in.ListTasks(ctx, opts)
		if err != nil {
			t.Fatalf("ListTasks(%+v): %v", opts.Filter, err)
		}
		total = p.Total
		for _, v := range p.Tasks {
			ids = append(ids, v.ID)
			views = append(views, v)
		}
		if p.Next == "" {
			return ids, views, total
		}
		opts.Cursor = p.Next
	}
}

func sorted(ids []string) []string {
	out := append([]string(nil), ids...)
	sort.Strings(out)
	return out
}

func sameSet(a, b []string) bool {
	return strings.Join(sorted(a), ",") == strings.Join(sorted(b), ",")
}

func requireClean(t *testing.T, c *laneClient) {
	t.Helper()
	if rep := mustCheck(t, c, CheckOptions{}); len(rep.Findings)+len(rep.Unconfirmed) > 0 {
		t.Fatalf("check after the action: findings%s", describe(append(rep.Findings, rep.Unconfirmed...)))
	}
}

// Every listing of a namespace with tasks in every state names exactly
// the tasks of that state, in order, with the state's exact count, at
// every page size.
func TestInspectListsEveryState(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := checkCtx(t, time.Minute)
	q, err := f.in.Queue(ctx, "work")
	if err != nil {
		t.Fatal(err)
	}
	// The three scheduled tasks and the two retries are in buckets: the
	// states are disjoint, so the retries are retrying, not scheduled.
	want := QueueInfo{Queue: "work", Scheduled: 3, Ready: 3, Running: 2, Retrying: 2, Dead: 2, Processed: 2, Failed: 4}
	got := *q
	got.Latency, got.Recovered, got.Cancelled = 0, 0, 0
	if got != want {
		t.Fatalf("Queue = %+v\nwant    %+v", got, want)
	}
	if q.Latency <= 0 {
		t.Errorf("latency %v with ready tasks; want > 0", q.Latency)
	}
	cases := []struct {
		state State
		queue string
		want  []string
		order bool
		total int64
	}{
		{StateScheduled, "work", f.scheduled, false, 3},
		{StateRetrying, "work", f.retrying, false, 2},
		{StateReady, "work", f.ready, true, 3},
		{StateRunning, "work", f.running, false, 2},
		{StateRunning, "", f.running, false, 2},
		{StateDead, "work", []string{f.dead[1], f.dead[0]}, false, 2},
		{StateDead, "", []string{f.dead[1], f.dead[0]}, false, 2},
	}
	for _, tc := range cases {
		for _, limit := range []int{1, 2, 50} {
			ids, views, total := listAll(t, f.in, ListOptions{Filter: Filter{Queue: tc.queue, State: tc.state}, Limit: limit})
			if total != tc.total {
				t.Errorf("%s/%q limit %d: total %d, want %d", tc.state, tc.queue, limit, total, tc.total)
			}
			if !sameSet(ids, tc.want) || (tc.order && strings.Join(ids, ",") != strings.Join(tc.want, ",")) {
				t.Errorf("%s/%q limit %d: ids %v, want %v", tc.state, tc.queue, limit, ids, tc.want)
			}
			for _, v := range views {
				if v.State != tc.state {
					t.Errorf("%s listing: task %s says %s", tc.state, v.ID, v.State)
				}
				if v.Preview == "" || v.Type == "" || v.Created.IsZero() || v.Due.IsZero() {
					t.Errorf("%s listing: task %+v lacks its type, preview or times", tc.state, v)
				}
				switch tc.state {
				case StateRunning:
					if v.Worker != f.worker || v.Lease.IsZero() || v.Started.IsZero() {
						t.Errorf("running task %s: worker %q lease %v started %v", v.ID, v.Worker, v.Lease, v.Started)
					}
				case StateRetrying:
					if v.LastError != "try later" || v.Attempts != 1 || !v.Due.After(time.Now()) {
						t.Errorf("retrying task %s: last error %q attempts %d next %v", v.ID, v.LastError, v.Attempts, v.Due)
					}
				case StateDead:
					if !strings.Contains(v.LastError, "bad input") || v.Finished.IsZero() {
						t.Errorf("dead task %s: reason %q died %v", v.ID, v.LastError, v.Finished)
					}
				}
			}
		}
	}
	// Scheduled tasks come in due order: the retries (due in an hour,
	// retried first) then the three scheduled in 1, 2, 3 hours.
	ids, views, _ := listAll(t, f.in, ListOptions{Filter: Filter{Queue: "work", State: StateScheduled}, Limit: 2})
	for i := 1; i < len(views); i++ {
		if views[i].Due.Before(views[i-1].Due) {
			t.Errorf("scheduled listing out of due order: %v", ids)
		}
	}
	// Done and cancelled tasks are found by id, not listed.
	if _, err := f.in.ListTasks(ctx, ListOptions{Filter: Filter{Queue: "work", State: StateDone}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("listing done tasks: %v, want ErrInvalid", err)
	}
	v, err := f.in.Task(ctx, f.done[0])
	if err != nil || v.State != StateDone || v.Preview != `{"n":0}` {
		t.Errorf("Task(done) = %+v, %v", v, err)
	}
	// Search: by id, type, payload substring.
	for _, s := range []struct {
		search string
		state  State
		want   []string
	}{
		{f.ready[1], StateReady, f.ready[1:2]},
		{"later", StateReady, f.ready},
		{"payload 2", StateReady, f.ready[2:]},
		{"payload 1", StateScheduled, f.scheduled[1:2]},
		{"payload 1", StateRetrying, f.retrying[1:2]},
		{"dead payload 0", StateDead, f.dead[:1]},
		{"block 1", StateRunning, f.running[1:]},
		{"nothing like it", StateReady, nil},
	} {
		ids, _, _ := listAll(t, f.in, ListOptions{Filter: Filter{Queue: "work", State: s.state, Search: s.search}, Limit: 1})
		if !sameSet(ids, s.want) {
			t.Errorf("search %q in %s: %v, want %v", s.search, s.state, ids, s.want)
		}
	}
	ws, err := f.in.Workers(ctx)
	if err != nil || len(ws) != 1 {
		t.Fatalf("Workers = %+v, %v", ws, err)
	}
	w := ws[0]
	if w.ID != f.worker || !w.Alive || w.Running != 2 || len(w.Tasks) != 2 || w.PID == 0 || w.Host == "" ||
		strings.Join(w.Queues, ",") != "work" || w.Concurrency != 2 || w.LastBeat.IsZero() {
		t.Errorf("worker = %+v", w)
	}
	requireClean(t, f.c)
}

// A queue whose bucket shares its time with the buckets of more queues
// than a page reads of the index is still listed, and the listing ends.
func TestInspectScheduledAmongManyQueues(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	in := c.inspector()
	ctx := checkCtx(t, time.Minute)
	due := time.Now().Add(time.Hour)
	var batch []NewTask
	for i := 0; i < maxVisits+10; i++ {
		batch = append(batch, NewTask{Type: "t", Options: []Option{Queue(fmt.Sprintf("q%03d", i)), At(due)}})
	}
	batch = append(batch,
		NewTask{Type: "t", Options: []Option{Queue("zzz"), At(due)}},
		NewTask{Type: "t", Options: []Option{Queue("zzz"), At(due.Add(time.Minute))}})
	ids, err := idsOf(c.EnqueueBatch(ctx, batch))
	if err != nil {
		t.Fatal(err)
	}
	want := ids[len(ids)-2:]
	for _, limit := range []int{1, 50} {
		got, _, total := listAll(t, in, ListOptions{Filter: Filter{Queue: "zzz", State: StateScheduled}, Limit: limit})
		if strings.Join(got, ",") != strings.Join(want, ",") || total != 2 {
			t.Errorf("limit %d: listed %v (total %d), want %v", limit, got, total, want)
		}
	}
	got, _, _ := listAll(t, in, ListOptions{Filter: Filter{Queue: "q000", State: StateScheduled}})
	if len(got) != 1 || got[0] != ids[0] {
		t.Errorf("q000: listed %v, want %s", got, ids[0])
	}
}
