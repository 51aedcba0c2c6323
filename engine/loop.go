package engine

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Log attribute keys.
const (
	keyComponent = "component"
	keyTaskID    = "task_id"
	keyQueue     = "queue"
	keyType      = "type"
	keyWorker    = "worker"
	keyAttempt   = "attempt"
	keyErr       = "err"
)

// retryBackoff grows a wait after consecutive failures of a loop: 50 ms
// doubling to 5 s, with jitter, and logs only when the wait grows so an
// outage is logged once per step, not once per try.
type retryBackoff struct {
	fails int
}

func (b *retryBackoff) reset() { b.fails = 0 }

// wait sleeps after a failure; it returns false when ctx ended.
func (b *retryBackoff) wait(ctx context.Context, log *slog.Logger, what string, err error) bool {
	b.fails++
	d := 50 * time.Millisecond << min(b.fails-1, 7)
	if d > 5*time.Second {
		d = 5 * time.Second
	}
	if b.fails <= 8 || b.fails%20 == 0 {
		log.Warn(what+" failed; retrying", keyErr, err, "retry_in", d.Round(time.Millisecond), "failures", b.fails)
	}
	d = d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
	return sleep(ctx, d)
}

// sleep waits d or until ctx ends; it reports whether the wait was full.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// connHolder keeps one pooled connection for a loop and replaces it after
// an error, since a redigo connection that failed is not reusable.
type connHolder struct {
	pool *redis.Pool
	conn redis.Conn
}

func (h *connHolder) get(ctx context.Context) (redis.Conn, error) {
	if h.conn != nil {
		if h.conn.Err() == nil {
			return h.conn, nil
		}
		h.conn.Close()
		h.conn = nil
	}
	c, err := h.pool.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	h.conn = c
	return c, nil
}

// drop discards the connection after an error.
func (h *connHolder) drop() {
	if h.conn != nil {
		h.conn.Close()
		h.conn = nil
	}
}

func (h *connHolder) close() { h.drop() }

// blockPop waits up to wait (whole seconds) for a token on any of keys with
// BLPOP on the holder's connection. It returns the key that had one, or ""
// on timeout. ctx ending closes the connection, which ends the wait.
func blockPop(ctx context.Context, h *connHolder, keys []string, wait time.Duration) (string, error) {
	conn, err := h.get(ctx)
	if err != nil {
		return "", err
	}
	secs := max(1, int64(wait/time.Second))
	args := make([]interface{}, 0, len(keys)+1)
	for _, k := range keys {
		args = append(args, k)
	}
	args = append(args, secs)
	// A blocking timeout of T fires after T to T+1 s at 2.4; allow for it.
	cctx, cancel := context.WithTimeout(ctx, time.Duration(secs+3)*time.Second)
	defer cancel()
	rep, err := redis.Strings(redis.DoContext(conn, cctx, "BLPOP", args...))
	if errors.Is(err, redis.ErrNil) {
		return "", nil
	}
	if err != nil {
		h.drop()
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", err
	}
	if len(rep) != 2 {
		return "", nil
	}
	return rep[0], nil
}

// group runs goroutines and waits for them all.
type group struct {
	wg sync.WaitGroup
}

func (g *group) Go(f func()) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f()
	}()
}

func (g *group) Wait() { g.wg.Wait() }
