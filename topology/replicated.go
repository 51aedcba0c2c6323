package topology

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/bucketq/bucketq/internal/route"
	"github.com/bucketq/bucketq/internal/sentinel"
	"github.com/gomodule/redigo/redis"
)

// ReplicatedOptions configures a [Replicated].
type ReplicatedOptions struct {
	// Servers are the host:port addresses of the primary and its
	// replicas, in any order: the one whose INFO says role:master is
	// written to.
	Servers []string
	// Dial opens the connections handed out by the pool (default
	// DefaultDialer).
	Dial Dialer
	// DialControl opens the connections that read INFO (default Dial).
	DialControl Dialer
	// RoleMaxAge is how long the roles read are trusted (default 1 s): a
	// promotion is followed, and a demotion noticed, within it.
	RoleMaxAge time.Duration
	// CheckTimeout bounds the INFO of one server (default 1 s): an
	// unreachable replica must not hold up the writes to the master.
	CheckTimeout time.Duration
	// Pool sizes the pool.
	Pool PoolOptions
}

// ServerRole is what INFO said about one listed server.
type ServerRole struct {
	Addr string
	Role string // "master", "slave", or "" when Err is set
	Err  error
}

// Replicated hands out a pool whose connections reach the one listed
// server that says role:master, for Redis 2.4 replication without
// Sentinel. It is safe for concurrent use.
//
// The roles are read again, in the background, once they are RoleMaxAge
// old; requests meanwhile go to the master last read, for at most
// CheckTimeout more, so that a listed server that does not answer (a dead
// primary, after its replica was promoted) never holds up the writes.
type Replicated struct {
	opts ReplicatedOptions
	pool *redis.Pool

	mu         sync.Mutex
	read       time.Time // when the roles were read; zero: read them before the next request
	roles      []ServerRole
	master     string
	current    error         // why there is no master to write to
	refreshing chan struct{} // closed when the running read ends; nil when none runs
}

// NewReplicated returns a Replicated over opts.Servers. It sends nothing
// until the pool is used.
func NewReplicated(opts ReplicatedOptions) (*Replicated, error) {
	if len(opts.Servers) == 0 {
		return nil, errors.New("topology: no server listed")
	}
	seen := map[string]bool{}
	for _, s := range opts.Servers {
		if seen[s] {
			return nil, fmt.Errorf("topology: server %s listed twice", s)
		}
		seen[s] = true
	}
	opts.Servers = append([]string(nil), opts.Servers...)
	if opts.Dial == nil {
		opts.Dial = DefaultDialer
	}
	if opts.DialControl == nil {
		opts.DialControl = opts.Dial
	}
	if opts.RoleMaxAge <= 0 {
		opts.RoleMaxAge = DefaultRoleMaxAge
	}
	if opts.CheckTimeout <= 0 {
		opts.CheckTimeout = time.Second
	}
	r := &Replicated{opts: opts}
	r.pool = opts.Pool.pool(replicatedTarget{r})
	return r, nil
}

// Pool returns the pool; [Replicated.Close] closes it.
func (r *Replicated) Pool() *redis.Pool { return r.pool }

// Close closes the pool, after a reading of the roles under way ends.
func (r *Replicated) Close() error {
	r.mu.Lock()
	ch := r.refreshing
	r.mu.Unlock()
	if ch != nil {
		<-ch
	}
	return r.pool.Close()
}

// Master returns the address of the one listed server that says
// role:master. With none, or more than one, the error wraps
// [ErrNotMaster] or [ErrSeveralMasters] and names each server's role.
// Roles older than RoleMaxAge are read again (INFO on every server at
// once, each bounded by CheckTimeout); the master last read is returned
// meanwhile, for at most CheckTimeout.
func (r *Replicated) Master(ctx context.Context) (string, error) {
	for {
		r.mu.Lock()
		age := time.Since(r.read)
		known := !r.read.IsZero()
		if known && age < r.opts.RoleMaxAge {
			m, err := r.master, r.current
			r.mu.Unlock()
			return m, err
		}
		ch := r.startRefresh()
		if known && r.current == nil && age < r.opts.RoleMaxAge+r.opts.CheckTimeout {
			m := r.master
			r.mu.Unlock()
			return m, nil
		}
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return "", fmt.Errorf("topology: reading the servers' roles: %w", ctx.Err())
		}
	}
}

// Roles reads every listed server's role now.
func (r *Replicated) Roles(ctx context.Context) ([]ServerRole, error) {
	r.mu.Lock()
	r.read = time.Time{}
	r.mu.Unlock()
	_, _ = r.Master(ctx)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ServerRole(nil), r.roles...), nil
}

// startRefresh starts reading the roles unless a reading runs, and returns
// the channel closed when it ends; r.mu is held.
func (r *Replicated) startRefresh() chan struct{} {
	if r.refreshing == nil {
		r.refreshing = make(chan struct{})
		go r.refresh(r.refreshing)
	}
	return r.refreshing
}

// refresh reads INFO on every server at once and closes done.
func (r *Replicated) refresh(done chan struct{}) {
	roles := make([]ServerRole, len(r.opts.Servers))
	var wg sync.WaitGroup
	for i, addr := range r.opts.Servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), r.opts.CheckTimeout)
			defer cancel()
			roles[i] = ServerRole{Addr: addr}
			conn, err := r.opts.DialControl(ctx, addr)
			if err != nil {
				roles[i].Err = err
				return
			}
			defer conn.Close()
			role, err := sentinel.InfoRole(ctx, conn)
			roles[i].Role, roles[i].Err = string(role), err
		}()
	}
	wg.Wait()
	var masters, all []string
	for _, s := range roles {
		if s.Err != nil {
			all = append(all, fmt.Sprintf("%s: %v", s.Addr, s.Err))
			continue
		}
		all = append(all, s.Addr+" role:"+s.Role)
		if s.Role == string(sentinel.RoleMaster) {
			masters = append(masters, s.Addr)
		}
	}
	var master string
	var current error
	switch len(masters) {
	case 1:
		master = masters[0]
	case 0:
		current = fmt.Errorf("%w: no listed server says role:master, so nothing is written (a Redis 2.4 replica "+
			"would accept writes and lose them at its next resync; promote one with SLAVEOF NO ONE): %s",
			ErrNotMaster, strings.Join(all, "; "))
	default:
		current = fmt.Errorf("%w: %s; make all but one a replica with SLAVEOF (%s)",
			ErrSeveralMasters, strings.Join(masters, ", "), strings.Join(all, "; "))
	}
	r.mu.Lock()
	r.roles, r.master, r.current, r.read = roles, master, current, time.Now()
	r.refreshing = nil
	r.mu.Unlock()
	close(done)
}

// stale makes the next Master read the roles again.
func (r *Replicated) stale() {
	r.mu.Lock()
	r.read = time.Time{}
	r.mu.Unlock()
}

// Addr routes.
func (t replicatedTarget) Addr(ctx context.Context) (string, error) { return t.r.Master(ctx) }

// Dial dials addr.
func (t replicatedTarget) Dial(ctx context.Context, addr string) (redis.Conn, error) {
	r := t.r
	c, err := r.opts.Dial(ctx, addr)
	if err != nil {
		r.stale()
		return nil, err
	}
	return c, nil
}

// Judge judges an error reply: READONLY (a modern replica) means the
// roles changed.
func (t replicatedTarget) Judge(ctx context.Context, reply redis.Error, addr string) route.Verdict {
	r := t.r
	if v, ok := commonJudge(reply); ok {
		return v
	}
	if firstWord(reply) == "READONLY" {
		r.stale()
		return route.Follow
	}
	return route.Keep
}

// replicatedTarget is the route.Target of a Replicated's pool.
type replicatedTarget struct{ r *Replicated }
