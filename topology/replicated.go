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
type Replicated struct {
	opts ReplicatedOptions
	pool *redis.Pool

	mu      sync.Mutex // held while the roles are read
	read    time.Time
	roles   []ServerRole
	master  string
	current error // why there is no master to write to
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

// Close closes the pool.
func (r *Replicated) Close() error { return r.pool.Close() }

// Master returns the address of the one listed server that says
// role:master, reading the roles again if they are older than RoleMaxAge.
// With none, or more than one, the error wraps [ErrNotMaster] or
// [ErrSeveralMasters] and names each server's role.
func (r *Replicated) Master(ctx context.Context) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.read.IsZero() || time.Since(r.read) >= r.opts.RoleMaxAge {
		r.refresh(ctx)
	}
	return r.master, r.current
}

// Roles reads every listed server's role now.
func (r *Replicated) Roles(ctx context.Context) []ServerRole {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refresh(ctx)
	return append([]ServerRole(nil), r.roles...)
}

// refresh reads INFO on every server at once; r.mu is held.
func (r *Replicated) refresh(ctx context.Context) {
	roles := make([]ServerRole, len(r.opts.Servers))
	var wg sync.WaitGroup
	for i, addr := range r.opts.Servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, r.opts.CheckTimeout)
			defer cancel()
			roles[i] = ServerRole{Addr: addr}
			conn, err := r.opts.DialControl(cctx, addr)
			if err != nil {
				roles[i].Err = err
				return
			}
			defer conn.Close()
			role, err := sentinel.InfoRole(cctx, conn)
			roles[i].Role, roles[i].Err = string(role), err
		}()
	}
	wg.Wait()
	r.roles, r.read = roles, time.Now()
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
	switch len(masters) {
	case 1:
		r.master, r.current = masters[0], nil
	case 0:
		r.master = ""
		r.current = fmt.Errorf("%w: no listed server says role:master, so nothing is written (a Redis 2.4 replica "+
			"would accept writes and lose them at its next resync; promote one with SLAVEOF NO ONE): %s",
			ErrNotMaster, strings.Join(all, "; "))
	default:
		r.master = ""
		r.current = fmt.Errorf("%w: %s; make all but one a replica with SLAVEOF (%s)",
			ErrSeveralMasters, strings.Join(masters, ", "), strings.Join(all, "; "))
	}
	if ctx.Err() != nil && r.current != nil {
		// Read under a context that ended: do not trust it for long.
		r.read = time.Time{}
	}
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
