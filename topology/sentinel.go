package topology

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/bucketq/bucketq/internal/route"
	"github.com/bucketq/bucketq/internal/sentinel"
	"github.com/gomodule/redigo/redis"
)

// SentinelOptions configures a [Sentinel].
type SentinelOptions struct {
	// Sentinels are host:port addresses of the sentinels watching the set.
	Sentinels []string
	// MasterName is the name the sentinels monitor the set under.
	MasterName string
	// Dial opens the connections handed out by the pool (default
	// DefaultDialer).
	Dial Dialer
	// DialControl opens the connections that check a server's role with
	// ROLE (default Dial).
	DialControl Dialer
	// DialSentinel opens connections to sentinels (default
	// DefaultDialer: sentinels usually have no password of the data's).
	DialSentinel Dialer
	// RoleMaxAge is how long a master's role, once checked, is trusted
	// before it is checked again (default 1 s).
	RoleMaxAge time.Duration
	// Pool sizes the pool.
	Pool PoolOptions
}

// Sentinel hands out a pool whose connections reach the master that a set
// of Redis Sentinels names, and follows it through failovers. It is safe
// for concurrent use.
type Sentinel struct {
	cl     *sentinel.Client
	opts   SentinelOptions
	pool   *redis.Pool
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	checked map[string]time.Time // master address → when ROLE said master
}

// NewSentinel returns a Sentinel and starts following +switch-master on
// the sentinels; Close stops it. It does not wait for a master: the first
// request asks the sentinels.
func NewSentinel(opts SentinelOptions) (*Sentinel, error) {
	if opts.Dial == nil {
		opts.Dial = DefaultDialer
	}
	if opts.DialControl == nil {
		opts.DialControl = opts.Dial
	}
	if opts.DialSentinel == nil {
		opts.DialSentinel = DefaultDialer
	}
	if opts.RoleMaxAge <= 0 {
		opts.RoleMaxAge = DefaultRoleMaxAge
	}
	cl, err := sentinel.New(sentinel.Options{
		Sentinels: opts.Sentinels, MasterName: opts.MasterName,
		Dial: opts.DialControl, DialSentinel: opts.DialSentinel, MaxIdle: 1,
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sentinel{cl: cl, opts: opts, cancel: cancel, done: make(chan struct{}), checked: map[string]time.Time{}}
	s.pool = opts.Pool.pool(sentinelTarget{s})
	go func() {
		defer close(s.done)
		_ = cl.Run(ctx)
	}()
	return s, nil
}

// Pool returns the pool; [Sentinel.Close] closes it.
func (s *Sentinel) Pool() *redis.Pool { return s.pool }

// Master returns the address of the master, asking the sentinels if none
// is known yet.
func (s *Sentinel) Master(ctx context.Context) (string, error) { return s.cl.Master(ctx) }

// Switches returns how many times the master changed since the Sentinel
// was made.
func (s *Sentinel) Switches() int64 { return s.cl.Switches() }

// Close stops following the sentinels and closes the pool.
func (s *Sentinel) Close() error {
	s.cancel()
	<-s.done
	return errors.Join(s.pool.Close(), s.cl.Close())
}

// Addr routes: the master, whose role is checked again
// once RoleMaxAge has passed since the last check.
func (t sentinelTarget) Addr(ctx context.Context) (string, error) {
	s := t.s
	addr, err := s.cl.Master(ctx)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	fresh := time.Since(s.checked[addr]) < s.opts.RoleMaxAge
	s.mu.Unlock()
	if fresh {
		return addr, nil
	}
	if err := s.checkRole(ctx, addr); err != nil {
		// A failover the sentinels have made (or are making): ask again.
		naddr, derr := s.cl.Discover(ctx)
		if derr != nil {
			return "", fmt.Errorf("%w (then: %w)", err, derr)
		}
		addr = naddr
		if err := s.checkRole(ctx, addr); err != nil {
			return "", err
		}
	}
	return addr, nil
}

func (s *Sentinel) checkRole(ctx context.Context, addr string) error {
	conn, err := s.opts.DialControl(ctx, addr)
	if err != nil {
		return fmt.Errorf("topology: role check of %s: %w", addr, err)
	}
	defer conn.Close()
	role, err := sentinel.QueryRole(ctx, conn)
	if err != nil {
		return fmt.Errorf("topology: role check of %s: %w", addr, err)
	}
	if role != sentinel.RoleMaster {
		return fmt.Errorf("%w: %s says it is a %s", ErrNotMaster, addr, role)
	}
	s.mu.Lock()
	s.checked[addr] = time.Now()
	s.mu.Unlock()
	return nil
}

func (s *Sentinel) forget(addr string) {
	s.mu.Lock()
	delete(s.checked, addr)
	s.mu.Unlock()
}

// Dial dials addr.
func (t sentinelTarget) Dial(ctx context.Context, addr string) (redis.Conn, error) {
	s := t.s
	c, err := s.opts.Dial(ctx, addr)
	if err != nil {
		s.forget(addr) // check it (and ask the sentinels) before the next try
		return nil, err
	}
	return c, nil
}

// Judge judges an error reply: READONLY means the server is a replica
// now.
func (t sentinelTarget) Judge(ctx context.Context, reply redis.Error, addr string) route.Verdict {
	s := t.s
	if v, ok := commonJudge(reply); ok {
		return v
	}
	if firstWord(reply) == "READONLY" {
		s.forget(addr)
		return route.Follow
	}
	return route.Keep
}

// sentinelTarget is the route.Target of a Sentinel's pool.
type sentinelTarget struct{ s *Sentinel }
