package engine

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/bucketq/bucketq/buckets"
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
// doubling to 2 s (a restarting Redis is back within seconds), with jitter, and logs only when the wait grows so an
// outage is logged once per step, not once per try.
type retryBackoff struct {
	fails int
}

func (b *retryBackoff) reset() { b.fails = 0 }

// wait sleeps after a failure; it returns false when ctx ended.
func (b *retryBackoff) wait(ctx context.Context, log *slog.Logger, what string, err error) bool {
	b.fails++
	d := 50 * time.Millisecond << min(b.fails-1, 7)
	if d > 2*time.Second {
		d = 2 * time.Second
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

// blocker is a dedicated connection for blocking pops, dialled with the
// pool's dial function but kept out of the pool: a blocked BLPOP needs a
// read timeout longer than its own timeout, and must be interrupted by
// closing the connection when its context ends.
type blocker struct {
	pool *redis.Pool
	conn redis.Conn
}

func (b *blocker) get(ctx context.Context) (redis.Conn, error) {
	if b.conn != nil && b.conn.Err() == nil {
		return b.conn, nil
	}
	b.close()
	c, err := dialFresh(ctx, b.pool)
	if err != nil {
		return nil, err
	}
	b.conn = c
	return c, nil
}

// dialFresh dials a new connection with the pool's dial function, outside
// the pool.
func dialFresh(ctx context.Context, pool *redis.Pool) (redis.Conn, error) {
	switch {
	case pool.DialContext != nil:
		return pool.DialContext(ctx)
	case pool.Dial != nil:
		return pool.Dial()
	}
	return nil, errors.New("engine: the pool has no Dial function")
}

func (b *blocker) close() {
	if b.conn != nil {
		b.conn.Close()
		b.conn = nil
	}
}

// blockPop waits up to wait (whole seconds: Redis 2.4 refuses fractions)
// for a token on any of keys with BLPOP. It returns the key that had one,
// or "" on timeout. The read timeout allows for 2.4 firing a timeout of T
// after T to T+1 s; ctx ending closes the connection, which ends the wait.
func blockPop(ctx context.Context, b *blocker, keys []string, wait time.Duration) (string, error) {
	conn, err := b.get(ctx)
	if err != nil {
		return "", err
	}
	secs := max(1, int64(wait/time.Second))
	args := make([]interface{}, 0, len(keys)+1)
	for _, k := range keys {
		args = append(args, k)
	}
	args = append(args, secs)
	type result struct {
		rep []string
		err error
	}
	done := make(chan result, 1)
	go func() {
		var rep []string
		var err error
		if _, ok := conn.(redis.ConnWithTimeout); ok {
			rep, err = redis.Strings(redis.DoWithTimeout(conn, time.Duration(secs+3)*time.Second, "BLPOP", args...))
		} else {
			// A connection of the caller's that cannot take a read
			// timeout per command: its own read timeout must then exceed
			// IdleWait.
			rep, err = redis.Strings(conn.Do("BLPOP", args...))
		}
		done <- result{rep, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		conn.Close()
		<-done
		b.conn = nil
		return "", ctx.Err()
	}
	if errors.Is(r.err, redis.ErrNil) {
		return "", nil
	}
	if r.err != nil {
		b.close()
		return "", r.err
	}
	if len(r.rep) != 2 {
		return "", nil
	}
	return r.rep[0], nil
}

// setAside renames keys of the wrong type (written by hand, say) out of
// the way on a pooled connection, logging each one.
func setAside(ctx context.Context, pool *redis.Pool, st *buckets.Store, log *slog.Logger, want string, keys ...string) {
	conn, err := pool.GetContext(ctx)
	if err != nil {
		return
	}
	defer conn.Close()
	moved, err := st.SetAside(ctx, conn, want, keys...)
	for _, k := range moved {
		log.Error("key of the wrong type set aside", "key", k, "moved_to", st.Keys.Quarantine(k))
	}
	if err != nil {
		log.Warn("could not set aside keys of the wrong type", keyErr, err)
	}
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
