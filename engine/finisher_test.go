package engine

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// replyLosingStore records a result for real and then reports the
// connection lost, once, with every idle connection of the pool closed
// by the server meanwhile (as a restart or a proxy cut would).
type replyLosingStore struct {
	store
	armed atomic.Bool
	kill  func()
}

func (s *replyLosingStore) Finish(ctx context.Context, l *lane, req finishReq) (finishRes, error) {
	res, err := s.store.Finish(ctx, l, req)
	if err == nil && res.held && s.armed.CompareAndSwap(true, false) {
		l.h.Conn().Close()
		s.kill()
		return finishRes{sent: true}, errInjected
	}
	return res, err
}

// logLines keeps the messages logged at Warn and above.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, r.Message)
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }

// A result whose reply is lost, with the pool's idle connections dead, is
// recognised as recorded: no warning says the task was recovered
// elsewhere, and it ran once.
func TestLostResultReplyNotReportedAsRecovery(t *testing.T) {
	t.Parallel()
	e := privateEnv(t) // it kills every client connection of the server
	logs := &logLines{}
	e.cfg.Logger = slog.New(logs)
	rec := newRecorder(nil)
	e.cfg.Concurrency = 1
	w, _ := newWorker(e.pool, e.cfg, rec)
	ls := &replyLosingStore{store: w.store, kill: func() {
		admin := e.admin(t)
		_, _ = admin.Do("CLIENT", "KILL", "TYPE", "normal")
	}}
	w.setStore(ls)
	ls.armed.Store(true)
	stop := runBackground(t, w.Run)
	id, err := idOf(e.client(t).Enqueue(context.Background(), "t", nil))
	if err != nil {
		t.Fatal(err)
	}
	// The record says done as soon as FinishHeld's EXEC ran, before the
	// wrapper around it drops the reply: wait for both.
	waitFor(t, outcomeWait, "the result's reply lost", func() bool { return !ls.armed.Load() })
	waitFor(t, outcomeWait, "done", func() bool { return e.state(t, id) == StateDone })
	stop() // the finisher has logged whatever it logs
	if n := rec.count(id); n != 1 {
		t.Fatalf("ran %d times", n)
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	for _, l := range logs.lines {
		if strings.HasPrefix(l, "heartbeat failed") {
			// The kill cuts a heartbeat in flight too (more likely on a
			// loaded machine), and that warning is true; the test is
			// about what the finisher says of the result.
			continue
		}
		if strings.Contains(l, "returned to its queue") || strings.Contains(l, "recovered elsewhere") || strings.Contains(l, "changed while it ran") {
			t.Fatalf("misleading warning: %q", l)
		}
	}
}
