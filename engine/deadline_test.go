package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
)

// Against a server that accepts connections and never answers, every call
// of the Client returns within its context's deadline plus a small slack,
// with an error matching context.DeadlineExceeded, and the connection it
// used is discarded rather than put back in the pool's idle list (a reply
// may still be on its way).
func TestCallsBoundedByDeadline(t *testing.T) {
	addr := silentAddr(t)
	pool := &redisPool{MaxIdle: 4, Dial: func() (redisConn, error) { return redisDial("tcp", addr) }}
	t.Cleanup(func() { pool.Close() })
	c, err := NewClient(pool, Config{Namespace: "deadline"})
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.NewString()
	calls := []struct {
		name string
		call func(context.Context) error
	}{
		{"Enqueue", func(ctx context.Context) error { _, err := c.Enqueue(ctx, "t", nil); return err }},
		{"EnqueueIn", func(ctx context.Context) error { _, err := c.EnqueueIn(ctx, time.Minute, "t", nil); return err }},
		{"EnqueueBatch", func(ctx context.Context) error {
			_, err := c.EnqueueBatch(ctx, []NewTask{{Type: "t"}, {Type: "t", Options: []Option{In(time.Hour)}}})
			return err
		}},
		{"Lookup", func(ctx context.Context) error { _, err := c.Lookup(ctx, id); return err }},
		{"Cancel", func(ctx context.Context) error { return c.Cancel(ctx, id) }},
		{"DeadLetters", func(ctx context.Context) error { _, err := c.DeadLetters(ctx, 0, 10); return err }},
		{"DeadCount", func(ctx context.Context) error { _, err := c.DeadCount(ctx); return err }},
		{"RetryDead", func(ctx context.Context) error { return c.RetryDead(ctx, id) }},
		{"PurgeDead", func(ctx context.Context) error { return c.PurgeDead(ctx, id) }},
		{"RetryAllDead", func(ctx context.Context) error { _, err := c.RetryAllDead(ctx); return err }},
		{"PurgeAllDead", func(ctx context.Context) error { _, err := c.PurgeAllDead(ctx); return err }},
		{"Stats", func(ctx context.Context) error { _, err := c.Stats(ctx); return err }},
	}
	const deadline, slack = 300 * time.Millisecond, 500 * time.Millisecond
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			err := tc.call(ctx)
			if took := time.Since(start); took > deadline+slack {
				t.Errorf("returned after %v; the deadline was %v", took, deadline)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("err %v; want one matching context.DeadlineExceeded", err)
			}
			if st := pool.Stats(); st.IdleCount != 0 || st.ActiveCount != 0 {
				t.Errorf("pool after the call: %d idle, %d open; want the connection discarded", st.IdleCount, st.ActiveCount)
			}
		})
	}
}

// silentAddr is the address of a server that accepts connections and
// never replies.
func silentAddr(t *testing.T) string { return newSilentServer(t).ln.Addr().String() }
