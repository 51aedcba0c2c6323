package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// eventLog is an Observer that keeps every event.
type eventLog struct {
	mu sync.Mutex
	ev []Event
}

func (l *eventLog) Observe(e Event) {
	l.mu.Lock()
	l.ev = append(l.ev, e)
	l.mu.Unlock()
}

// of returns the kinds of the events about task id, in order.
func (l *eventLog) of(id string) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Event
	for _, e := range l.ev {
		if e.TaskID == id {
			out = append(out, e)
		}
	}
	return out
}

func (l *eventLog) count(k EventKind) (n, moved int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.ev {
		if e.Kind == k {
			n++
			moved += e.Moved
		}
	}
	return n, moved
}

func kinds(evs []Event) []EventKind {
	out := make([]EventKind, len(evs))
	for i, e := range evs {
		out[i] = e.Kind
	}
	return out
}

// TestObserverEvents follows a task that fails once through the events
// it causes, and checks that a refused enqueue causes none.
func TestObserverEvents(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	log := &eventLog{}
	e.cfg.Observer = log
	c := e.client(t)
	ctx := t.Context()
	if _, err := c.Enqueue(ctx, "flaky", nil, TaskID("b")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, "flaky", nil, TaskID("b")); !errors.Is(err, ErrTaskExists) {
		t.Fatalf("second enqueue of b: %v, want ErrTaskExists", err)
	}
	if got := kinds(log.of("b")); len(got) != 1 || got[0] != EventEnqueued {
		t.Fatalf("events after a refused enqueue: %v, want one enqueued", got)
	}
	mux := NewMux()
	mux.HandleFunc("flaky", func(_ context.Context, task *Task) error {
		if task.Attempt == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	})
	s, err := newLaneServer(e.pool, e.cfg, mux, RoleDispatcher|RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, s.Run)
	waitFor(t, outcomeWait, "b to succeed", func() bool {
		evs := log.of("b")
		return len(evs) > 0 && evs[len(evs)-1].Kind == EventFinished && evs[len(evs)-1].State == StateDone
	})
	evs := log.of("b")
	want := []EventKind{EventEnqueued, EventStarted, EventFinished, EventStarted, EventFinished}
	if got := kinds(evs); len(got) != len(want) {
		t.Fatalf("events of b: %v, want %v", got, want)
	}
	for i, k := range want {
		if evs[i].Kind != k {
			t.Fatalf("event %d of b: %v, want %v (all: %v)", i, evs[i].Kind, k, kinds(evs))
		}
		if evs[i].Queue != "default" || evs[i].Type != "flaky" {
			t.Errorf("event %d of b: queue %q type %q", i, evs[i].Queue, evs[i].Type)
		}
	}
	if evs[1].Attempt != 1 || evs[3].Attempt != 2 || evs[2].State != StateRetrying || evs[2].Err == nil || evs[2].Due.IsZero() || evs[4].Attempt != 2 {
		t.Errorf("attempts and outcomes: %+v", evs)
	}
	if evs[3].Time.Before(evs[2].Due) {
		t.Errorf("second start %v before the retry was due %v", evs[3].Time, evs[2].Due)
	}
	if evs[4].Duration < 0 || evs[1].Time.Before(evs[1].Due) {
		t.Errorf("duration %v, start %v due %v", evs[4].Duration, evs[1].Time, evs[1].Due)
	}
	if n, moved := log.count(EventDispatched); n == 0 || moved < 1 {
		t.Errorf("dispatch events %d moving %d; the retry went through a bucket", n, moved)
	}
}

// TestObserverLeaseExpiry: a run that outlives its lease is reported
// recovered, with its reason, and then runs again.
func TestObserverLeaseExpiry(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	log := &eventLog{}
	e.cfg.Observer = log
	e.cfg.Advanced.LeaseGrace = 50 * time.Millisecond
	release := make(chan struct{})
	defer close(release)
	mux := NewMux()
	mux.HandleFunc("hang", func(_ context.Context, task *Task) error {
		if task.Run == 1 {
			<-release // ignores its context: hung
		}
		return nil
	})
	if _, err := e.client(t).Enqueue(t.Context(), "hang", nil, TaskID("h"), Timeout(50*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	w, err := newWorker(e.pool, e.cfg, mux)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, func(ctx context.Context) error {
		err := w.Run(ctx)
		return err
	})
	waitFor(t, outcomeWait, "h to succeed on its second run", func() bool {
		evs := log.of("h")
		return len(evs) > 0 && evs[len(evs)-1].Kind == EventFinished
	})
	got := log.of("h")
	want := []EventKind{EventEnqueued, EventStarted, EventRecovered, EventStarted, EventFinished}
	if len(got) != len(want) {
		t.Fatalf("events of h: %v, want %v", kinds(got), want)
	}
	for i, k := range want {
		if got[i].Kind != k {
			t.Fatalf("events of h: %v, want %v", kinds(got), want)
		}
	}
	if got[2].Reason != "lease_expired" || got[4].State != StateDone {
		t.Errorf("recovered reason %q, outcome %v", got[2].Reason, got[4].State)
	}
}

// enqueuedIDs lists the ids of the EventEnqueued events, in order.
func (l *eventLog) enqueuedIDs() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for _, e := range l.ev {
		if e.Kind == EventEnqueued {
			out[e.TaskID]++
		}
	}
	return out
}

// TestObserverEnqueuedEverywhere: every task written is reported
// enqueued once: a chain's steps (its first by EnqueueChain, the next by
// its predecessor's success), a group's members and its callback, and a
// periodic entry's firings.
func TestObserverEnqueuedEverywhere(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	log := &eventLog{}
	e.cfg.Observer = log
	c := e.client(t)
	ctx := t.Context()
	if _, err := c.EnqueueChain(ctx, "ch", Step{Type: "s"}, Step{Type: "s"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.EnqueueGroup(ctx, Group{ID: "gr", Members: []Step{{Type: "s"}, {Type: "s"}}, Callback: &Step{Type: "s"}}); err != nil {
		t.Fatal(err)
	}
	sc := e.scheduler(t, 0, time.Hour, Periodic{Name: "tick", Every: time.Hour, Type: "s"})
	if err := sc.RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	ran := make(chan string, 16)
	mux := NewMux()
	mux.HandleFunc("s", func(_ context.Context, task *Task) error {
		ran <- task.ID
		return nil
	})
	e.runServer(t, mux)
	want := map[string]bool{"ch~0": true, "ch~1": true, "gr~0": true, "gr~1": true, "gr~cb": true}
	for len(want) > 0 {
		select {
		case id := <-ran:
			delete(want, id)
		case <-time.After(outcomeWait):
			t.Fatalf("tasks %v did not run", want)
		}
	}
	// A spawned task is reported after its parent's transaction, which
	// another handler slot may beat to running it: wait for the reports.
	ids := []string{"ch~0", "ch~1", "gr~0", "gr~1", "gr~cb"}
	waitFor(t, outcomeWait, "every enqueue reported", func() bool {
		got := log.enqueuedIDs()
		for _, id := range ids {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	got := log.enqueuedIDs()
	for _, id := range ids {
		if got[id] != 1 {
			t.Errorf("task %s reported enqueued %d times, want once (all: %v)", id, got[id], got)
		}
	}
	firings := 0
	for id, n := range got {
		if strings.HasPrefix(id, "p:tick@") {
			firings += n
		}
	}
	if firings != 1 {
		t.Errorf("%d firings of the periodic entry reported enqueued, want 1 (all: %v)", firings, got)
	}
}
