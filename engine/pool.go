package engine

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
)

// NewPool returns a pool of connections to the Redis at addr, set up as
// docs/operations.md explains ("The redigo pool of a Go program") and
// sized for the parts cfg runs in one process. addr is "host:port" or a
// URL: "redis://[[user]:password@]host[:port][/db]", or "rediss://..." for
// TLS checked against the system's roots. AUTH takes the password alone
// (the Redis 2.4 form) unless a user name is given (Redis 6 and later).
// The caller closes the pool; the engine never does. A program that needs
// other settings (its own TLS roots, a connection wrapper) builds its own
// *redis.Pool instead.
func NewPool(addr string, cfg Config) (*redis.Pool, error) {
	u, err := parseRedisURL(addr)
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	size := cfg.Concurrency + cfg.Advanced.DispatchLanes + 4 // the reaper, heartbeats and a Client's calls
	raw := u.String()
	return &redis.Pool{
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialURLContext(ctx, raw,
				redis.DialConnectTimeout(5*time.Second),
				redis.DialReadTimeout(10*time.Second),
				redis.DialWriteTimeout(10*time.Second))
		},
		MaxIdle:     size,
		IdleTimeout: 5 * time.Minute,
		TestOnBorrow: func(c redis.Conn, idleSince time.Time) error {
			if time.Since(idleSince) < 5*time.Second {
				return nil
			}
			_, err := c.Do("PING")
			return err
		},
	}, nil
}

var dbPath = regexp.MustCompile(`^/?([0-9]*)$`)

// parseRedisURL checks addr up front, so that a mistake is reported when
// the pool is made rather than at every dial. Its errors never repeat a
// password.
func parseRedisURL(addr string) (*url.URL, error) {
	bad := func(what string, shown string) (*url.URL, error) {
		return nil, fmt.Errorf("engine: Redis address %s: %s", shown, what)
	}
	if addr == "" {
		return bad(`empty; want "host:port" or "redis://host:port/db"`, `""`)
	}
	if !strings.Contains(addr, "://") {
		addr = "redis://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL itself may hold a password
		}
		return bad(err.Error(), "(not shown: it does not parse)")
	}
	shown := fmt.Sprintf("%q", u.Redacted())
	switch {
	case u.Scheme != "redis" && u.Scheme != "rediss":
		return bad(fmt.Sprintf("scheme %q: want redis:// or rediss://", u.Scheme), shown)
	case u.Opaque != "" || u.Host == "":
		return bad("no host", shown)
	case !dbPath.MatchString(u.Path):
		return bad(fmt.Sprintf("path %q: want a database number, e.g. /0", u.Path), shown)
	case u.RawQuery != "" || u.Fragment != "":
		return bad("takes no query or fragment", shown)
	}
	return u, nil
}
