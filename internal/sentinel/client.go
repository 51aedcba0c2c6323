package sentinel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"
)

// ErrNoMaster is returned by [Client.Discover] when no sentinel named a
// master that answered as one.
var ErrNoMaster = errors.New("sentinel: no sentinel named a usable master")

// ErrClosed is returned by a [Client] after Close.
var ErrClosed = errors.New("sentinel: client closed")

// Defaults of [Options].
const (
	DefaultMaxIdle      = 4
	DefaultIdleTimeout  = 5 * time.Minute
	DefaultResubscribe  = 30 * time.Second
	DefaultRetryBackoff = 200 * time.Millisecond
	dialTimeout         = 5 * time.Second
)

// Options configures a [Client].
type Options struct {
	// Sentinels are host:port addresses of the sentinels watching the set.
	Sentinels []string
	// MasterName is the name the sentinels monitor the set under.
	MasterName string
	// Dial opens a connection to a Redis server of the set (the master).
	// The default is redis.DialContext over TCP with a 5 s connect timeout.
	Dial func(ctx context.Context, addr string) (redis.Conn, error)
	// DialSentinel opens a connection to a sentinel; the default is as for Dial.
	DialSentinel func(ctx context.Context, addr string) (redis.Conn, error)
	// MaxIdle, MaxActive and IdleTimeout size the master's pool.
	MaxIdle, MaxActive int
	IdleTimeout        time.Duration
	// Resubscribe bounds how long Run waits on one subscription with no
	// message before it reconnects and asks for the master again (a
	// sentinel that vanished without closing the connection is noticed
	// within it). Default 30 s.
	Resubscribe time.Duration
	// RetryBackoff is Run's wait after a sentinel could not be reached.
	RetryBackoff time.Duration
}

// Client finds the master of a set through its sentinels and hands out
// connections to it. It is safe for concurrent use.
type Client struct {
	opts Options

	mu       sync.Mutex
	addr     string      // current master, "" until discovered
	pool     *redis.Pool // pool of addr
	closed   bool
	switches atomic.Int64
}

// New returns a Client; it sends nothing until used.
func New(opts Options) (*Client, error) {
	if len(opts.Sentinels) == 0 {
		return nil, errors.New("sentinel: no sentinel address")
	}
	if opts.MasterName == "" {
		return nil, errors.New("sentinel: no master name")
	}
	if opts.Dial == nil {
		opts.Dial = func(ctx context.Context, addr string) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", addr, redis.DialConnectTimeout(dialTimeout))
		}
	}
	if opts.DialSentinel == nil {
		opts.DialSentinel = opts.Dial
	}
	if opts.MaxIdle <= 0 {
		opts.MaxIdle = DefaultMaxIdle
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.Resubscribe <= 0 {
		opts.Resubscribe = DefaultResubscribe
	}
	if opts.RetryBackoff <= 0 {
		opts.RetryBackoff = DefaultRetryBackoff
	}
	opts.Sentinels = append([]string(nil), opts.Sentinels...)
	return &Client{opts: opts}, nil
}

// Close closes the master's pools; connections still out close when
// returned. Run must have returned or be stopped by its context.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.pool == nil {
		return nil
	}
	return c.pool.Close()
}

// Switches returns how many times the Client moved to a new master.
func (c *Client) Switches() int64 { return c.switches.Load() }

// Master returns the address of the master, discovering it first if none
// is known yet.
func (c *Client) Master(ctx context.Context) (string, error) {
	c.mu.Lock()
	addr, closed := c.addr, c.closed
	c.mu.Unlock()
	if closed {
		return "", ErrClosed
	}
	if addr != "" {
		return addr, nil
	}
	return c.Discover(ctx)
}

// Discover asks each sentinel in turn for the master's address, keeps the
// first one that answers ROLE (or INFO replication) as a master, and makes
// it the Client's master.
func (c *Client) Discover(ctx context.Context) (string, error) {
	var errs []error
	for _, s := range c.opts.Sentinels {
		addr, err := c.askSentinel(ctx, s)
		if err == nil {
			err = c.verify(ctx, addr)
		}
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if err := c.setMaster(addr); err != nil {
			return "", err
		}
		return addr, nil
	}
	return "", fmt.Errorf("%w for %q: %w", ErrNoMaster, c.opts.MasterName, errors.Join(errs...))
}

func (c *Client) askSentinel(ctx context.Context, sentinel string) (string, error) {
	conn, err := c.opts.DialSentinel(ctx, sentinel)
	if err != nil {
		return "", fmt.Errorf("sentinel: dial %s: %w", sentinel, err)
	}
	defer conn.Close()
	reply, err := redis.Strings(redis.DoContext(conn, ctx, "SENTINEL", "get-master-addr-by-name", c.opts.MasterName))
	if err != nil {
		return "", fmt.Errorf("sentinel: SENTINEL get-master-addr-by-name %s on %s: %w", c.opts.MasterName, sentinel, err)
	}
	if len(reply) != 2 {
		return "", fmt.Errorf("sentinel: %s does not know master %q", sentinel, c.opts.MasterName)
	}
	return net.JoinHostPort(reply[0], reply[1]), nil
}

// verify checks on a fresh connection that addr is a master.
func (c *Client) verify(ctx context.Context, addr string) error {
	conn, err := c.opts.Dial(ctx, addr)
	if err != nil {
		return fmt.Errorf("sentinel: dial master %s: %w", addr, err)
	}
	defer conn.Close()
	role, err := QueryRole(ctx, conn)
	if err != nil {
		return fmt.Errorf("sentinel: %s: %w", addr, err)
	}
	if role != RoleMaster {
		return fmt.Errorf("%w: %s says it is a %s", ErrNotMaster, addr, role)
	}
	return nil
}

func (c *Client) setMaster(addr string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if addr == c.addr {
		return nil
	}
	if c.pool != nil {
		// Connections out on the old master close when returned.
		_ = c.pool.Close()
		c.switches.Add(1)
	}
	c.addr = addr
	c.pool = &redis.Pool{
		DialContext: func(ctx context.Context) (redis.Conn, error) { return c.opts.Dial(ctx, addr) },
		MaxIdle:     c.opts.MaxIdle,
		MaxActive:   c.opts.MaxActive,
		IdleTimeout: c.opts.IdleTimeout,
		Wait:        c.opts.MaxActive > 0,
	}
	return nil
}

// Get returns a connection to the master for writing, having checked on it
// with ROLE that the server is still a master. When it is not (a failover
// the Client has not heard of yet, or a demoted master), Get asks the
// sentinels again once and retries; if that fails too the error wraps
// ErrNotMaster or ErrNoMaster. The caller closes the connection.
func (c *Client) Get(ctx context.Context) (redis.Conn, error) {
	var first error
	for try := 0; try < 2; try++ {
		if _, err := c.Master(ctx); err != nil {
			return nil, err
		}
		c.mu.Lock()
		pool, addr := c.pool, c.addr
		c.mu.Unlock()
		conn, err := pool.GetContext(ctx)
		if err == nil {
			var role Role
			if role, err = QueryRole(ctx, conn); err == nil && role != RoleMaster {
				err = fmt.Errorf("%w: %s says it is a %s", ErrNotMaster, addr, role)
			}
			if err == nil {
				return conn, nil
			}
			conn.Close()
		} else {
			err = fmt.Errorf("sentinel: connect to master %s: %w", addr, err)
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil || try == 1 {
			break
		}
		if _, derr := c.Discover(ctx); derr != nil {
			return nil, fmt.Errorf("%w (then: %w)", first, derr)
		}
	}
	return nil, first
}

// Run follows failovers until ctx ends, then returns nil. It subscribes to
// +switch-master on one sentinel after another (moving on when one fails),
// asks for the master again after every (re)subscription, in case a switch
// happened while it was not listening, and moves the Client to the new
// master named in each +switch-master for its set.
func (c *Client) Run(ctx context.Context) error {
	for i := 0; ; i++ {
		if ctx.Err() != nil {
			return nil
		}
		s := c.opts.Sentinels[i%len(c.opts.Sentinels)]
		err := c.follow(ctx, s)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			t := time.NewTimer(c.opts.RetryBackoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
		}
	}
}

// follow listens on one sentinel until it fails, goes quiet for
// Resubscribe, or ctx ends.
func (c *Client) follow(ctx context.Context, sentinel string) error {
	conn, err := c.opts.DialSentinel(ctx, sentinel)
	if err != nil {
		return fmt.Errorf("sentinel: dial %s: %w", sentinel, err)
	}
	psc := redis.PubSubConn{Conn: conn}
	defer psc.Close()
	if err := psc.Subscribe("+switch-master"); err != nil {
		return fmt.Errorf("sentinel: SUBSCRIBE on %s: %w", sentinel, err)
	}
	subscribed := false
	for {
		rctx, cancel := context.WithTimeout(ctx, c.opts.Resubscribe)
		msg := psc.ReceiveContext(rctx)
		cancel()
		switch m := msg.(type) {
		case error:
			return fmt.Errorf("sentinel: receive from %s: %w", sentinel, m)
		case redis.Subscription:
			if m.Kind == "subscribe" && !subscribed {
				subscribed = true
				// Listening now: catch a switch made before.
				if _, err := c.Discover(ctx); err != nil && ctx.Err() == nil {
					return err
				}
			}
		case redis.Message:
			// "<name> <old-ip> <old-port> <new-ip> <new-port>"
			f := strings.Fields(string(m.Data))
			if len(f) == 5 && f[0] == c.opts.MasterName {
				addr := net.JoinHostPort(f[3], f[4])
				if err := c.verify(ctx, addr); err != nil {
					// Not a master yet or not reachable: ask again.
					if _, err := c.Discover(ctx); err != nil && ctx.Err() == nil {
						return err
					}
					continue
				}
				if err := c.setMaster(addr); err != nil {
					return err
				}
			}
		}
	}
}
