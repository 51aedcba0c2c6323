package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Defaults of [Options].
const (
	DefaultMaxTries    = 16
	DefaultMinBackoff  = 10 * time.Millisecond
	DefaultMaxBackoff  = 500 * time.Millisecond
	DefaultMaxIdle     = 4
	DefaultIdleTimeout = 5 * time.Minute
	dialTimeout        = 5 * time.Second
)

// Options configures a [Router]. Zero fields take the defaults above.
type Options struct {
	// Seeds are host:port addresses of some nodes of the cluster; any one
	// that answers CLUSTER SLOTS is enough.
	Seeds []string
	// Dial opens a connection to a node. The default is redis.DialContext
	// over TCP with a 5 s connect timeout. Use it to add AUTH or to wrap
	// connections (a census, a guard).
	Dial func(ctx context.Context, addr string) (redis.Conn, error)
	// MaxIdle and MaxActive size each node's pool (MaxActive 0: no limit);
	// IdleTimeout closes connections idle that long.
	MaxIdle, MaxActive int
	IdleTimeout        time.Duration
	// MaxTries bounds the tries of one Do or Txn, each redirection, TRYAGAIN,
	// CLUSTERDOWN or unreachable node counting as one.
	MaxTries int
	// MinBackoff and MaxBackoff bound the jittered, doubling wait after a
	// TRYAGAIN, a CLUSTERDOWN or an unreachable node.
	MinBackoff, MaxBackoff time.Duration
}

// SlotRange is one entry of the slot map: slots Start to End (inclusive)
// are served by Master and copied to Replicas.
type SlotRange struct {
	Start, End int
	Master     string
	Replicas   []string
}

// Stats counts what a Router has followed since it was made.
type Stats struct {
	Moved, Ask, TryAgain, ClusterDown int64 // redirections and retryable replies seen
	Unreachable                       int64 // connections to a node that could not be made
	Refreshes                         int64 // slot maps loaded
}

// Router routes requests to the master of their hash slot. It is safe for
// concurrent use.
type Router struct {
	opts Options

	mu     sync.RWMutex
	owner  [Slots]string // master address per slot; "" when unknown
	ranges []SlotRange
	pools  map[string]*redis.Pool
	closed bool

	refreshMu sync.Mutex // one CLUSTER SLOTS at a time

	moved, ask, tryAgain, clusterDown, unreachable, refreshes atomic.Int64
}

// New returns a Router for the cluster that opts.Seeds belong to. It sends
// nothing: the slot map is loaded by the first request, or by Refresh.
func New(opts Options) (*Router, error) {
	if len(opts.Seeds) == 0 {
		return nil, errors.New("cluster: no seed address")
	}
	if opts.Dial == nil {
		opts.Dial = func(ctx context.Context, addr string) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", addr, redis.DialConnectTimeout(dialTimeout))
		}
	}
	if opts.MaxIdle <= 0 {
		opts.MaxIdle = DefaultMaxIdle
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.MaxTries <= 0 {
		opts.MaxTries = DefaultMaxTries
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = DefaultMinBackoff
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(DefaultMaxBackoff, opts.MinBackoff)
	}
	return &Router{opts: opts, pools: make(map[string]*redis.Pool)}, nil
}

// Close closes every node's pool. Connections still out are closed when
// they are returned.
func (r *Router) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	var first error
	for _, p := range r.pools {
		if err := p.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Stats returns the counters of what the Router has followed.
func (r *Router) Stats() Stats {
	return Stats{
		Moved: r.moved.Load(), Ask: r.ask.Load(), TryAgain: r.tryAgain.Load(),
		ClusterDown: r.clusterDown.Load(), Unreachable: r.unreachable.Load(),
		Refreshes: r.refreshes.Load(),
	}
}

// SlotMap returns the slot map last loaded, sorted by slot.
func (r *Router) SlotMap() []SlotRange {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]SlotRange, len(r.ranges))
	for i, s := range r.ranges {
		s.Replicas = append([]string(nil), s.Replicas...)
		out[i] = s
	}
	return out
}

// Master returns the address of the master of slot, loading the slot map
// first if there is none.
func (r *Router) Master(ctx context.Context, slot int) (string, error) {
	if slot < 0 || slot >= Slots {
		return "", fmt.Errorf("cluster: slot %d out of range 0-%d", slot, Slots-1)
	}
	r.mu.RLock()
	addr, closed := r.owner[slot], r.closed
	r.mu.RUnlock()
	if closed {
		return "", ErrClosed
	}
	if addr != "" {
		return addr, nil
	}
	if err := r.Refresh(ctx); err != nil {
		return "", err
	}
	r.mu.RLock()
	addr = r.owner[slot]
	r.mu.RUnlock()
	if addr == "" {
		return "", fmt.Errorf("%w: slot %d is not served by any master", ErrNoSlotMap, slot)
	}
	return addr, nil
}

// Get returns a connection to the master of slot; the caller closes it.
// A MOVED reply on it means the map is stale: pass the error to
// [Router.Redirected], which refreshes the map, and call Get again.
func (r *Router) Get(ctx context.Context, slot int) (redis.Conn, error) {
	addr, err := r.Master(ctx, slot)
	if err != nil {
		return nil, err
	}
	return r.conn(ctx, addr)
}

// GetForKey returns a connection to the master of key's slot.
func (r *Router) GetForKey(ctx context.Context, key string) (redis.Conn, error) {
	return r.Get(ctx, Slot(key))
}

// conn returns a connection from addr's pool.
func (r *Router) conn(ctx context.Context, addr string) (redis.Conn, error) {
	p, err := r.pool(addr)
	if err != nil {
		return nil, err
	}
	c, err := p.GetContext(ctx)
	if err != nil {
		r.unreachable.Add(1)
		return nil, fmt.Errorf("cluster: connect to %s: %w", addr, err)
	}
	return c, nil
}

func (r *Router) pool(addr string) (*redis.Pool, error) {
	r.mu.RLock()
	p, closed := r.pools[addr], r.closed
	r.mu.RUnlock()
	if closed {
		return nil, ErrClosed
	}
	if p != nil {
		return p, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	if p = r.pools[addr]; p == nil {
		p = &redis.Pool{
			DialContext: func(ctx context.Context) (redis.Conn, error) {
				c, err := r.opts.Dial(ctx, addr)
				if err != nil {
					return nil, err
				}
				return guardedConn{c}, nil
			},
			MaxIdle:     r.opts.MaxIdle,
			MaxActive:   r.opts.MaxActive,
			IdleTimeout: r.opts.IdleTimeout,
			Wait:        r.opts.MaxActive > 0,
		}
		r.pools[addr] = p
	}
	return p, nil
}

// Refresh loads the slot map with CLUSTER SLOTS from the first node that
// answers: known masters, then replicas, then the seeds.
func (r *Router) Refresh(ctx context.Context) error {
	r.refreshMu.Lock()
	defer r.refreshMu.Unlock()
	var errs []error
	for _, addr := range r.candidates() {
		ranges, err := r.slotsFrom(ctx, addr)
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		r.setMap(ranges)
		r.refreshes.Add(1)
		return nil
	}
	return fmt.Errorf("%w: no node answered CLUSTER SLOTS: %w", ErrNoSlotMap, errors.Join(errs...))
}

func (r *Router) candidates() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	seen := make(map[string]bool)
	var out []string
	add := func(a string) {
		if a != "" && !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	for _, s := range r.ranges {
		add(s.Master)
	}
	for _, s := range r.ranges {
		for _, a := range s.Replicas {
			add(a)
		}
	}
	for _, a := range r.opts.Seeds {
		add(a)
	}
	return out
}

func (r *Router) slotsFrom(ctx context.Context, addr string) ([]SlotRange, error) {
	c, err := r.conn(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	reply, err := redis.Values(redis.DoContext(c, ctx, "CLUSTER", "SLOTS"))
	if err != nil {
		return nil, fmt.Errorf("cluster: CLUSTER SLOTS on %s: %w", addr, err)
	}
	ranges, err := parseSlots(reply, addr)
	if err != nil {
		return nil, fmt.Errorf("cluster: CLUSTER SLOTS on %s: %w", addr, err)
	}
	if len(ranges) == 0 {
		return nil, fmt.Errorf("cluster: CLUSTER SLOTS on %s: no slot is assigned", addr)
	}
	return ranges, nil
}

// parseSlots reads a CLUSTER SLOTS reply: per range, start, end, the master
// and then each replica as [host, port, id, ...]. An empty or "?" host is
// that of the node that answered.
func parseSlots(reply []interface{}, from string) ([]SlotRange, error) {
	fromHost, _, _ := net.SplitHostPort(from)
	out := make([]SlotRange, 0, len(reply))
	for _, item := range reply {
		f, err := redis.Values(item, nil)
		if err != nil || len(f) < 3 {
			return nil, fmt.Errorf("malformed range %v", item)
		}
		start, err1 := redis.Int(f[0], nil)
		end, err2 := redis.Int(f[1], nil)
		if err1 != nil || err2 != nil || start < 0 || end >= Slots || start > end {
			return nil, fmt.Errorf("malformed slot bounds %v-%v", f[0], f[1])
		}
		sr := SlotRange{Start: start, End: end}
		for i, n := range f[2:] {
			nf, err := redis.Values(n, nil)
			if err != nil || len(nf) < 2 {
				return nil, fmt.Errorf("malformed node %v", n)
			}
			host, err1 := redis.String(nf[0], nil)
			port, err2 := redis.Int(nf[1], nil)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("malformed node %v", n)
			}
			if host == "" || host == "?" {
				host = fromHost
			}
			addr := net.JoinHostPort(host, strconv.Itoa(port))
			if i == 0 {
				sr.Master = addr
			} else {
				sr.Replicas = append(sr.Replicas, addr)
			}
		}
		out = append(out, sr)
	}
	return out, nil
}

func (r *Router) setMap(ranges []SlotRange) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.owner = [Slots]string{}
	for _, s := range ranges {
		for i := s.Start; i <= s.End; i++ {
			r.owner[i] = s.Master
		}
	}
	sortRanges(ranges)
	r.ranges = ranges
}

func sortRanges(s []SlotRange) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j].Start < s[j-1].Start; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// Redirected reports whether err carries a MOVED, ASK, TRYAGAIN or
// CLUSTERDOWN reply, after which the whole request may be sent again
// because the server did not run it. On MOVED it records the slot's new
// master and reloads the slot map; on CLUSTERDOWN it reloads the map; a
// failed reload is not an error here (the next request tries again).
func (r *Router) Redirected(ctx context.Context, err error, from string) (*Redirect, bool) {
	rd, ok := ParseRedirect(err, from)
	if !ok {
		return nil, false
	}
	switch rd.Kind {
	case KindMoved:
		r.moved.Add(1)
		_ = r.Refresh(ctx)
		// The node that answered MOVED knows better than a node whose map
		// may lag behind it.
		r.mu.Lock()
		r.owner[rd.Slot] = rd.Addr
		r.mu.Unlock()
	case KindAsk:
		r.ask.Add(1)
	case KindTryAgain:
		r.tryAgain.Add(1)
	case KindClusterDown:
		r.clusterDown.Add(1)
		_ = r.Refresh(ctx)
	}
	return rd, true
}

// backoff waits a jittered, doubling delay for try (from 0), or until ctx
// ends.
func (r *Router) backoff(ctx context.Context, try int) error {
	d := r.opts.MinBackoff << min(try, 16)
	if d > r.opts.MaxBackoff || d <= 0 {
		d = r.opts.MaxBackoff
	}
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Do runs one command on the master of key's slot and follows MOVED, ASK
// (ASKING, then the command on the named node), TRYAGAIN and CLUSTERDOWN
// (wait, then again) up to MaxTries. A connection error other than an
// unreachable node is returned at once: the command may have run.
func (r *Router) Do(ctx context.Context, key string, cmd string, args ...interface{}) (interface{}, error) {
	slot := Slot(key)
	askAddr := ""
	var last error
	for try := 0; try < r.opts.MaxTries; try++ {
		addr := askAddr
		if addr == "" {
			a, err := r.Master(ctx, slot)
			if err != nil {
				return nil, err
			}
			addr = a
		}
		c, err := r.conn(ctx, addr)
		if err != nil {
			if errors.Is(err, ErrClosed) || ctx.Err() != nil {
				return nil, err
			}
			last = err
			askAddr = ""
			_ = r.Refresh(ctx)
			if err := r.backoff(ctx, try); err != nil {
				return nil, fmt.Errorf("cluster: %s: %w (after %w)", cmd, err, last)
			}
			continue
		}
		bc := &boundConn{c: c, ctx: ctx, asking: askAddr != ""}
		reply, err := bc.Do(cmd, args...)
		c.Close()
		askAddr = ""
		if err == nil {
			return reply, nil
		}
		rd, ok := r.Redirected(ctx, err, addr)
		if !ok {
			return reply, err
		}
		last = err
		switch rd.Kind {
		case KindAsk:
			askAddr = rd.Addr
		case KindTryAgain, KindClusterDown:
			if err := r.backoff(ctx, try); err != nil {
				return nil, fmt.Errorf("cluster: %s: %w (after %w)", cmd, err, last)
			}
		}
	}
	return nil, fmt.Errorf("%w: %s on slot %d, %d tries: %w", ErrTriesExhausted, cmd, slot, r.opts.MaxTries, last)
}

// NoteUnreachable counts a node that a caller dialling on its own (outside
// the Router's pools) could not reach, in [Stats].Unreachable.
func (r *Router) NoteUnreachable() { r.unreachable.Add(1) }

// guardedConn refuses to write to a connection that failed. redigo's
// DoContext returns when its context ends while its writer goroutine may
// still be using the connection; the pool's Close of that connection then
// sends UNWATCH or DISCARD, which raced with that goroutine.
type guardedConn struct{ redis.Conn }

var (
	_ redis.ConnWithContext = guardedConn{}
	_ redis.ConnWithTimeout = guardedConn{}
)

func (g guardedConn) Send(cmd string, args ...interface{}) error {
	if err := g.Conn.Err(); err != nil {
		return err
	}
	return g.Conn.Send(cmd, args...)
}

func (g guardedConn) Flush() error {
	if err := g.Conn.Err(); err != nil {
		return err
	}
	return g.Conn.Flush()
}

func (g guardedConn) Do(cmd string, args ...interface{}) (interface{}, error) {
	if err := g.Conn.Err(); err != nil {
		return nil, err
	}
	return g.Conn.Do(cmd, args...)
}

func (g guardedConn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	if err := g.Conn.Err(); err != nil {
		return nil, err
	}
	return redis.DoContext(g.Conn, ctx, cmd, args...)
}

func (g guardedConn) DoWithTimeout(timeout time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	if err := g.Conn.Err(); err != nil {
		return nil, err
	}
	return redis.DoWithTimeout(g.Conn, timeout, cmd, args...)
}

func (g guardedConn) Receive() (interface{}, error) { return g.Conn.Receive() }

func (g guardedConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(g.Conn, ctx)
}

func (g guardedConn) ReceiveWithTimeout(timeout time.Duration) (interface{}, error) {
	return redis.ReceiveWithTimeout(g.Conn, timeout)
}
