package topology

import (
	"context"
	"errors"
	"time"

	"github.com/bucketq/bucketq/internal/route"
	"github.com/bucketq/bucketq/internal/sentinel"
	"github.com/gomodule/redigo/redis"
)

// ErrNotMaster is wrapped by the errors of a [Sentinel] or [Replicated]
// pool when no server it may write to is a master: writes go nowhere
// rather than to a replica. It is the same error as that of package
// internal/sentinel, so errors.Is matches either.
var ErrNotMaster = sentinel.ErrNotMaster

// ErrSeveralMasters is wrapped by the errors of a [Replicated] pool when
// more than one listed server says role:master: writing to either could
// lose what the other holds, so nothing is written until an operator
// makes all but one a replica (SLAVEOF host port) or removes it from the
// list.
var ErrSeveralMasters = errors.New("topology: more than one listed server says role:master")

// Dialer opens a connection to the Redis server at addr (host:port). Use
// it to add AUTH, TLS, timeouts or a command guard.
type Dialer func(ctx context.Context, addr string) (redis.Conn, error)

// DefaultDialTimeout bounds the connect of the default [Dialer].
const DefaultDialTimeout = 5 * time.Second

// DefaultDialer dials addr over TCP with a 5 s connect timeout.
func DefaultDialer(ctx context.Context, addr string) (redis.Conn, error) {
	return redis.DialContext(ctx, "tcp", addr, redis.DialConnectTimeout(DefaultDialTimeout))
}

// PoolOptions sizes the pools a topology hands out (see redis.Pool).
type PoolOptions struct {
	// MaxIdle is the number of idle connections kept (default 8).
	MaxIdle int
	// MaxActive bounds the connections out at once; 0 means no bound.
	// With a bound, Get waits for a free connection.
	MaxActive int
	// IdleTimeout closes connections idle that long (default 5 minutes).
	IdleTimeout time.Duration
	// MaxTries, MinBackoff and MaxBackoff bound how often a lone command
	// is sent again after a redirection, and the waits in between
	// (defaults 16, 10 ms, 500 ms). A transaction is retried by its owner.
	MaxTries               int
	MinBackoff, MaxBackoff time.Duration
}

func (o PoolOptions) pool(t route.Target) *redis.Pool {
	if o.MaxIdle <= 0 {
		o.MaxIdle = 8
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 5 * time.Minute
	}
	ro := route.Options{MaxTries: o.MaxTries, MinBackoff: o.MinBackoff, MaxBackoff: o.MaxBackoff}
	return &redis.Pool{
		DialContext: func(ctx context.Context) (redis.Conn, error) { return route.Dial(ctx, t, ro) },
		MaxIdle:     o.MaxIdle,
		MaxActive:   o.MaxActive,
		Wait:        o.MaxActive > 0,
		IdleTimeout: o.IdleTimeout,
	}
}

// DefaultRoleMaxAge is how long a role read from a server is trusted.
const DefaultRoleMaxAge = time.Second

// commonJudge is what every mode makes of replies that say the server ran
// nothing for now.
func commonJudge(reply redis.Error) (route.Verdict, bool) {
	switch firstWord(reply) {
	case "LOADING", "BUSY", "MASTERDOWN":
		return route.Wait, true
	}
	return route.Keep, false
}

func firstWord(e redis.Error) string {
	s := string(e)
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			return s[:i]
		}
	}
	return s
}
