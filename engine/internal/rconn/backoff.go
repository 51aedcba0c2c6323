// Package rconn holds what the engine's loops share for talking to Redis:
// a backoff for loops that retry, a held connection that is tested after
// an error, and a dedicated connection for blocking pops.
package rconn

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"
)

// Backoff grows a wait after consecutive failures of a loop. The first
// retry after a success is immediate (a connection cut is usually mended
// by the next connection: see Holder); after that 50 ms doubling to 2 s (a
// restarting Redis is back within seconds), with jitter. It logs only when
// the wait grows, so an outage is logged once per step, not once per try.
type Backoff struct {
	fails int
}

// Reset forgets the failures after a success.
func (b *Backoff) Reset() { b.fails = 0 }

// Fails is the number of consecutive failures so far.
func (b *Backoff) Fails() int { return b.fails }

// Wait sleeps after a failure; it returns false when ctx ended.
func (b *Backoff) Wait(ctx context.Context, log *slog.Logger, what string, err error) bool {
	b.fails++
	if b.fails == 1 {
		log.Warn(what+" failed; retrying", "err", err, "retry_in", time.Duration(0), "failures", b.fails)
		return ctx.Err() == nil
	}
	d := 50 * time.Millisecond << min(b.fails-2, 7)
	if d > 2*time.Second {
		d = 2 * time.Second
	}
	if b.fails <= 9 || b.fails%20 == 0 {
		log.Warn(what+" failed; retrying", "err", err, "retry_in", d.Round(time.Millisecond), "failures", b.fails)
	}
	d = d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
	return Sleep(ctx, d)
}

// Sleep waits d or until ctx ends; it reports whether the wait was full.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
