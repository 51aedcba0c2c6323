package topology

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/internal/cluster"
	"github.com/bucketq/bucketq/internal/route"
	"github.com/gomodule/redigo/redis"
)

// ClusterOptions configures a [Cluster].
type ClusterOptions struct {
	// Seeds are host:port addresses of some nodes; one that answers
	// CLUSTER SLOTS is enough.
	Seeds []string
	// Dial opens the connections handed out by the pools (default
	// DefaultDialer).
	Dial Dialer
	// DialControl opens the connections that load the slot map with
	// CLUSTER SLOTS (default Dial).
	DialControl Dialer
	// Pool sizes each pool returned by [Cluster.Pool].
	Pool PoolOptions
}

// Cluster hands out pools whose connections reach the master of one hash
// slot of a Redis Cluster, following the slot when it moves. It is safe
// for concurrent use.
type Cluster struct {
	r    *cluster.Router
	opts ClusterOptions

	mu    sync.Mutex
	pools []*redis.Pool

	lastRefresh atomic.Int64 // unix ns of the last reload after an unreachable node
}

// refreshGap is the least time between two reloads of the slot map after
// unreachable nodes: during a failover every connection finds its master
// gone at once.
const refreshGap = 50 * time.Millisecond

// NewCluster returns a Cluster for the cluster the seeds belong to. It
// sends nothing until a pool is used.
func NewCluster(opts ClusterOptions) (*Cluster, error) {
	if opts.Dial == nil {
		opts.Dial = DefaultDialer
	}
	if opts.DialControl == nil {
		opts.DialControl = opts.Dial
	}
	r, err := cluster.New(cluster.Options{Seeds: opts.Seeds, Dial: opts.DialControl, MaxIdle: 2})
	if err != nil {
		return nil, err
	}
	return &Cluster{r: r, opts: opts}, nil
}

// Slot returns the hash slot of key: that of its hash tag (the part
// between the first "{" and the next "}") when it has one.
func Slot(key string) int { return cluster.Slot(key) }

// Pool returns a pool whose connections reach the master of the hash slot
// of key. For the engine, key is any key of the namespace (or lane), such
// as "{ns}": all its keys carry that hash tag. Pools are closed by
// [Cluster.Close].
func (c *Cluster) Pool(key string) *redis.Pool {
	p := c.opts.Pool.pool(&slotTarget{c: c, slot: cluster.Slot(key)})
	c.mu.Lock()
	c.pools = append(c.pools, p)
	c.mu.Unlock()
	return p
}

// Refresh loads the slot map now.
func (c *Cluster) Refresh(ctx context.Context) error { return c.r.Refresh(ctx) }

// Master returns the address of the master of key's slot.
func (c *Cluster) Master(ctx context.Context, key string) (string, error) {
	return c.r.Master(ctx, cluster.Slot(key))
}

// ClusterStats counts what a Cluster's pools have followed.
type ClusterStats struct {
	Moved, Ask, TryAgain, ClusterDown int64 // redirections and retryable replies seen
	Unreachable                       int64 // nodes that could not be reached
	Refreshes                         int64 // slot maps loaded
}

// Stats returns the counts since the Cluster was made.
func (c *Cluster) Stats() ClusterStats {
	s := c.r.Stats()
	return ClusterStats{Moved: s.Moved, Ask: s.Ask, TryAgain: s.TryAgain, ClusterDown: s.ClusterDown,
		Unreachable: s.Unreachable, Refreshes: s.Refreshes}
}

// Close closes the pools and the slot-map connections.
func (c *Cluster) Close() error {
	c.mu.Lock()
	pools := c.pools
	c.pools = nil
	c.mu.Unlock()
	var errs []error
	for _, p := range pools {
		errs = append(errs, p.Close())
	}
	errs = append(errs, c.r.Close())
	return errors.Join(errs...)
}

// slotTarget routes to the master of one slot.
type slotTarget struct {
	c    *Cluster
	slot int
}

func (t *slotTarget) Addr(ctx context.Context) (string, error) { return t.c.r.Master(ctx, t.slot) }

func (t *slotTarget) Dial(ctx context.Context, addr string) (redis.Conn, error) {
	conn, err := t.c.opts.Dial(ctx, addr)
	if err != nil {
		// The node may be gone (a failover): learn the map again, once
		// per refreshGap however many connections find it gone.
		t.c.r.NoteUnreachable()
		now := time.Now().UnixNano()
		if last := t.c.lastRefresh.Load(); now-last >= int64(refreshGap) && t.c.lastRefresh.CompareAndSwap(last, now) {
			_ = t.c.r.Refresh(ctx)
		}
		return nil, err
	}
	return conn, nil
}

func (t *slotTarget) Judge(ctx context.Context, reply redis.Error, addr string) route.Verdict {
	if v, ok := commonJudge(reply); ok {
		return v
	}
	rd, ok := t.c.r.Redirected(ctx, reply, addr)
	if !ok {
		return route.Keep
	}
	if rd.Kind == cluster.KindMoved {
		return route.Follow
	}
	// ASK: wait for the migration to end (see the package doc);
	// TRYAGAIN and CLUSTERDOWN: wait.
	return route.Wait
}
