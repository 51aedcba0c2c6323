package engine

import (
	"context"

	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// startLog records when each task's handler started.
type startLog struct {
	mu     sync.Mutex
	starts map[string]time.Time
}

func (l *startLog) handler(d time.Duration) func(context.Context, *Task) error {
	return func(ctx context.Context, t *Task) error {
		l.mu.Lock()
		if l.starts == nil {
			l.starts = map[string]time.Time{}
		}
		l.starts[t.ID] = time.Now()
		l.mu.Unlock()
		// real time: a run of d, so that a backlog is running when the
		// pause comes.
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
		return nil
	}
}

func (l *startLog) started(id string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.starts[id]
	return at, ok
}

func (l *startLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.starts)
}

// Pause: no task of a paused queue starts once PauseQueue has returned
// plus a second (strictly: none is claimed after it), running ones finish,
// the dispatcher still makes due tasks ready, Stats says paused; the other
// queues run on. Resume: idle workers start the queue's tasks at once,
// well within IdleWait.
func TestPauseResume(t *testing.T) {
	// Not parallel: it bounds a time in real time, which the load of
	// the package's parallel tests would stretch.
	eachServer(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		cfg := e.cfg
		cfg.Advanced.IdleWait = 10 * time.Second // a resume must not wait for it
		cfg.Concurrency = 2
		cfg.Queues = []QueueConfig{{Name: "q"}, {Name: "other"}}
		var log startLog
		mux := NewMux()
		mux.HandleFunc("slow", log.handler(20*time.Millisecond))
		mux.HandleFunc("mark", log.handler(0))
		srv, err := newLaneServer(e.pool, cfg, mux, AllRoles)
		if err != nil {
			t.Fatal(err)
		}
		runBackground(t, srv.Run)
		c := e.client(t)

		// A backlog running when the pause comes.
		var batch []NewTask
		for i := 0; i < 60; i++ {
			batch = append(batch, NewTask{Type: "slow", Options: []Option{Queue("q")}})
		}
		infos, err := c.EnqueueBatch(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, outcomeWait, "the backlog to start", func() bool { return log.count() >= 4 })
		if err := c.PauseQueue(ctx, "q"); err != nil {
			t.Fatal(err)
		}
		paused := time.Now()
		// Due tasks are still made ready while paused.
		later, err := idOf(c.Enqueue(ctx, "slow", nil, In(100*time.Millisecond), Queue("q")))
		if err != nil {
			t.Fatal(err)
		}
		// The worker is alive and takes other queues' tasks: a mark task
		// enqueued past the second after the pause runs. real time: the
		// second is the pause's documented grace.
		waitFor(t, 5*time.Second, "a second past the pause", func() bool { return time.Since(paused) > time.Second })
		mark, err := idOf(c.Enqueue(ctx, "mark", nil, Queue("other")))
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, outcomeWait, "the other queue's task", func() bool { return e.state(t, mark) == StateDone })
		waitFor(t, outcomeWait, "the delayed task to be made ready", func() bool {
			for _, id := range e.readyIDs(t, "q") {
				if id == later {
					return true
				}
			}
			return false
		})
		waitFor(t, outcomeWait, "the running tasks to finish", func() bool {
			st := queueStats(t, c, "q")
			return st.Running == 0
		})
		st := queueStats(t, c, "q")
		if !st.Paused || st.Ready == 0 {
			t.Fatalf("stats of the paused queue: %+v, want paused with tasks ready", st)
		}
		ran := 0
		for _, in := range infos {
			at, ok := log.started(in.ID)
			if !ok {
				continue
			}
			ran++
			if at.After(paused.Add(time.Second)) {
				t.Errorf("task %s started %v after the pause returned", in.ID, at.Sub(paused))
			}
			if s := e.state(t, in.ID); s != StateDone {
				t.Errorf("task %s started before the pause is %s, want done", in.ID, s)
			}
		}
		if _, ok := log.started(later); ok || ran == len(infos) {
			t.Fatalf("the pause stopped nothing: %d of %d ran", ran, len(infos))
		}
		t.Logf("%d of %d tasks ran before the pause; %d ready", ran, len(infos), st.Ready)

		// Resume: the idle workers start at once.
		if err := c.ResumeQueue(ctx, "q"); err != nil {
			t.Fatal(err)
		}
		resumed := time.Now()
		waitFor(t, 9*time.Second, "a task to start after the resume", func() bool { return log.count() > ran+1 })
		if d := time.Since(resumed); d > cfg.Advanced.IdleWait/4 {
			t.Errorf("the first task started %v after the resume; IdleWait is %v", d, cfg.Advanced.IdleWait)
		} else {
			t.Logf("first task started %v after the resume", d.Round(time.Millisecond))
		}
		waitFor(t, outcomeWait, "every task", func() bool { return log.count() == len(infos)+2 })
		if st := queueStats(t, c, "q"); st.Paused {
			t.Fatalf("stats after the resume: %+v, want not paused", st)
		}
	})
}

func queueStats(t testing.TB, c *laneClient, q string) QueueInfo {
	t.Helper()
	all, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if s.Queue == q {
			return s
		}
	}
	t.Fatalf("no stats for queue %s", q)
	return QueueInfo{}
}

// A pause is kept in Redis: a worker started after it (a restart) takes
// nothing from the queue; the pause holds until a resume.
func TestPauseSurvivesRestart(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	cfg := e.cfg
	cfg.Queues = []QueueConfig{{Name: "q"}, {Name: "other"}}
	var log startLog
	mux := NewMux()
	mux.HandleFunc("t", log.handler(0))
	c := e.client(t)
	if err := c.PauseQueue(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	ids, err := idsOf(c.EnqueueBatch(ctx, []NewTask{{Type: "t", Options: []Option{Queue("q")}}, {Type: "t", Options: []Option{Queue("q")}}}))
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 2; round++ {
		srv, err := newLaneServer(e.pool, cfg, mux, AllRoles)
		if err != nil {
			t.Fatal(err)
		}
		stop := runBackground(t, srv.Run)
		mark, err := idOf(c.Enqueue(ctx, "t", nil, Queue("other")))
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, outcomeWait, "the other queue's task", func() bool { return e.state(t, mark) == StateDone })
		stop()
		for _, id := range ids {
			if _, ok := log.started(id); ok {
				t.Fatalf("round %d: task %s of the paused queue ran", round, id)
			}
		}
	}
	srv, err := newLaneServer(e.pool, cfg, mux, AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, srv.Run)
	if err := c.ResumeQueue(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		waitFor(t, outcomeWait, "the resumed tasks", func() bool { return e.state(t, id) == StateDone })
	}
}

// Bad queue names are refused before anything is sent.
func TestPauseBadName(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	for _, q := range []string{"", "a b", "x:y"} {
		if err := c.PauseQueue(context.Background(), q); err == nil {
			t.Errorf("PauseQueue(%q) = nil, want an error", q)
		}
		if err := c.ResumeQueue(context.Background(), q); err == nil {
			t.Errorf("ResumeQueue(%q) = nil, want an error", q)
		}
	}
	if n, err := redis.Int(e.admin(t).Do("EXISTS", e.key("paused"))); err != nil || n != 0 {
		t.Fatalf("paused set written: %d %v", n, err)
	}

}

// The inspector shows a paused queue as paused.
func TestInspectorPaused(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	c := e.client(t)
	for _, q := range []string{"a", "b"} {
		if _, err := c.Enqueue(ctx, "t", nil, Queue(q)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.PauseQueue(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	in, err := newLaneInspector(e.pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := in.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, q := range qs {
		got[q.Queue] = q.Paused
	}
	if len(got) != 2 || got["a"] || !got["b"] {
		t.Fatalf("inspector queues paused: %v, want b only", got)
	}
}
