package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
	"github.com/gomodule/redigo/redis"
)

// control is the worker's view of the paused queues. A subscriber keeps
// one dedicated connection SUBSCRIBEd to the namespace's control channel
// and applies "pause q" / "resume q" as they come; after every
// subscription it re-reads the paused set (SMEMBERS paused), so nothing
// falls between. A claim that finds its queue paused marks it (a lost
// pause costs one task given back), and while one of the worker's queues
// is paused the waiter re-reads the set whenever its wait times out (a
// lost resume costs at most one idle wait). No polling: pub/sub pushes.
//
// At Redis 2.4 a subscribed connection takes no PING, so a half-open one
// cannot be tested: the subscriber subscribes afresh (and re-reads) after
// any error and after a few idle waits without a message.
type control struct {
	controlParams
	mu      sync.Mutex
	paused  map[string]bool // guarded by mu
	changed chan struct{}   // closed and replaced on every change; guarded by mu
}

// controlParams is what the control part needs.
type controlParams struct {
	store    store
	pool     *redis.Pool // for the subscription's own connection
	channel  string      // Keys.Control
	idleWait time.Duration
	log      *slog.Logger
}

func newControl(p controlParams) *control {
	return &control{controlParams: p, paused: map[string]bool{}, changed: make(chan struct{})}
}

// isPaused reports whether queue q is paused, as far as the worker knows.
func (c *control) isPaused(q string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.paused[q]
}

// anyPaused reports whether any of qs is paused, as far as the worker knows.
func (c *control) anyPaused(qs []string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, q := range qs {
		if c.paused[q] {
			return true
		}
	}
	return false
}

// watch returns a channel closed at the next change.
func (c *control) watch() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

func (c *control) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// set marks q paused or not.
func (c *control) set(q string, paused bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.paused[q] == paused {
		return
	}
	if paused {
		c.paused[q] = true
	} else {
		delete(c.paused, q)
	}
	c.notifyLocked()
}

// replace takes the paused set as read from Redis.
func (c *control) replace(qs []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := make(map[string]bool, len(qs))
	for _, q := range qs {
		next[q] = true
	}
	same := len(next) == len(c.paused)
	for q := range next {
		same = same && c.paused[q]
	}
	if same {
		return
	}
	c.paused = next
	c.notifyLocked()
}

// controlTimeout bounds each round trip of the control parts.
const controlTimeout = 5 * time.Second

// reread reads the paused set (one SMEMBERS on a pooled connection).
func (c *control) reread(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	qs, err := c.store.PausedQueues(ctx, nil)
	if err != nil {
		return err
	}
	c.replace(qs)
	return nil
}

// errRecycle ends a subscription that saw no message for a while: it is
// made afresh, in case the connection went half-open.
var errRecycle = errors.New("subscription recycled")

// run keeps the subscription until ctx ends.
func (c *control) run(ctx context.Context) {
	var bo rconn.Backoff
	for ctx.Err() == nil {
		err := c.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errRecycle) {
			bo.Reset()
			continue
		}
		if !bo.Wait(ctx, c.log, "control channel subscription", err) {
			return
		}
	}
}

// recycleAfter is how long a subscription may see no message before it is
// made afresh.
func (c *control) recycleAfter() time.Duration {
	return max(3*c.idleWait, 30*time.Second)
}

// session subscribes once, re-reads the paused set, and applies messages
// until an error, ctx's end, or recycleAfter without a message.
func (c *control) session(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, controlTimeout)
	conn, err := rconn.DialFresh(dctx, c.pool)
	cancel()
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	// Closing the connection ends a receive when ctx ends.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	psc := redis.PubSubConn{Conn: conn}
	if err := psc.Subscribe(c.channel); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	switch v := psc.ReceiveWithTimeout(controlTimeout).(type) {
	case redis.Subscription:
	case error:
		return fmt.Errorf("subscribe: %w", v)
	default:
		return fmt.Errorf("subscribe: unexpected reply %T", v)
	}
	// Subscribed: from now on no change is missed; read what was before.
	if err := c.reread(ctx); err != nil {
		return fmt.Errorf("read the paused set: %w", err)
	}
	for {
		switch v := psc.ReceiveWithTimeout(c.recycleAfter()).(type) {
		case redis.Message:
			if verb, q, ok := buckets.ParseControl(string(v.Data)); ok {
				c.set(q, verb == buckets.CtlPause)
				c.log.Info("queue "+verb+"d", keyQueue, q)
			}
		case redis.Subscription, redis.Pong:
		case error:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var ne interface{ Timeout() bool }
			if errors.As(v, &ne) && ne.Timeout() {
				return errRecycle
			}
			return v
		}
	}
}
