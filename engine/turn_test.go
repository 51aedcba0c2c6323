package engine

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/clocktest"
	"github.com/gomodule/redigo/redis"
)

// msgTally is a slog.Handler that counts records by message, at every
// level.
type msgTally struct {
	mu sync.Mutex
	n  map[string]int
}

func newMsgTally() *msgTally { return &msgTally{n: map[string]int{}} }

func (h *msgTally) Enabled(context.Context, slog.Level) bool { return true }
func (h *msgTally) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.n[r.Message]++
	h.mu.Unlock()
	return nil
}
func (h *msgTally) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *msgTally) WithGroup(string) slog.Handler      { return h }

func (h *msgTally) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[msg]
}

// turnEnv is a real server with n one-task buckets due (1 ms resolution),
// dispatchers that move few buckets a round so that the backlog spans
// many rounds, and a log that counts messages.
func turnEnv(t *testing.T, n int) (*env, map[string]bool, *msgTally) {
	e := realEnv(t)
	e.cfg.Advanced.Resolution = time.Millisecond
	e.cfg.Advanced.DispatchBuckets = 4 // 32 buckets a round
	want := scheduleMany(t, e, n, time.Now().Add(time.Hour), 10*time.Second)
	e.cfg.Advanced.Clock = clocktest.Offset(2 * time.Hour)
	logs := newMsgTally()
	e.cfg.Logger = slog.New(logs)
	return e, want, logs
}

// Dispatchers over one backlog take the dispatch turn and move every task
// exactly once; the turn is given up when the backlog is done.
func TestDispatchTurn(t *testing.T) {
	t.Parallel()
	e, want, logs := turnEnv(t, 3000)
	var stops []func()
	for i := 0; i < 4; i++ {
		d, err := newDispatcher(e.pool, e.cfg)
		if err != nil {
			t.Fatal(err)
		}
		stops = append(stops, runBackground(t, d.Run))
	}
	waitFor(t, time.Minute, "index to empty", func() bool { return e.zcard(t, "sched") == 0 })
	waitFor(t, outcomeWait, "the turn to end", func() bool {
		n, _ := redis.Int(e.admin(t).Do("EXISTS", e.key("turn")))
		return n == 0
	})
	for _, stop := range stops {
		stop()
	}
	exactlyOnce(t, e.readyIDs(t, "default"), want)
	if logs.count("dispatch turn taken") == 0 {
		t.Errorf("no dispatcher took the turn over a backlog of %d rounds", 3000/32)
	}
}

// A turn held by a dispatcher that died is respected until it ends with
// its TTL; then a dispatcher that was turned away takes it and moves the
// rest.
func TestDispatchTurnTakenOver(t *testing.T) {
	t.Parallel()
	e, want, logs := turnEnv(t, 500)
	admin := e.admin(t)
	if _, err := admin.Do("SETEX", e.key("turn"), 2, "dead"); err != nil {
		t.Fatal(err)
	}
	d, err := newDispatcher(e.pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stop := runBackground(t, d.Run)
	defer stop()
	// The first round reads a full window, asks for the turn before it
	// moves anything, and is turned away: it marks that.
	waitFor(t, outcomeWait, "the turned-away mark", func() bool {
		n, _ := redis.Int(admin.Do("EXISTS", e.key("turn:missed")))
		return n == 1
	})
	if n := e.zcard(t, "sched"); n == 0 {
		t.Fatalf("everything moved while another dispatcher held the turn")
	}
	waitFor(t, outcomeWait, "index to empty", func() bool { return e.zcard(t, "sched") == 0 })
	if el := time.Since(start); el < time.Second {
		t.Errorf("the backlog moved in %v, before the dead holder's turn (2 s) ended", el)
	}
	if logs.count("dispatch turn taken") == 0 {
		t.Errorf("the dispatcher never took the turn over")
	}
	stop()
	exactlyOnce(t, e.readyIDs(t, "default"), want)
}

// A turn key of the wrong type never keeps a task from moving: it is set
// aside, and the dispatcher moves without the turn meanwhile.
func TestDispatchTurnWrongType(t *testing.T) {
	t.Parallel()
	e, want, logs := turnEnv(t, 500)
	admin := e.admin(t)
	if _, err := admin.Do("RPUSH", e.key("turn"), "x"); err != nil {
		t.Fatal(err)
	}
	d, err := newDispatcher(e.pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := runBackground(t, d.Run)
	defer stop()
	waitFor(t, outcomeWait, "index to empty", func() bool { return e.zcard(t, "sched") == 0 })
	stop()
	exactlyOnce(t, e.readyIDs(t, "default"), want)
	if n, _ := redis.Int(admin.Do("LLEN", e.key("bad:turn"))); n != 1 {
		t.Errorf("the list at the turn key was not set aside (bad:turn holds %d)", n)
	}
	if logs.count("key of the wrong type set aside") == 0 {
		t.Errorf("setting the turn key aside was not logged")
	}
}
