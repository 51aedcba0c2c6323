package sentinel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/bucketq/bucketq/internal/redisinfo"
	"github.com/gomodule/redigo/redis"
)

// Role is a server's replication role.
type Role string

// Roles as Redis names them (INFO's role field and ROLE's first element).
const (
	RoleMaster   Role = "master"
	RoleSlave    Role = "slave"
	RoleSentinel Role = "sentinel"
)

// ErrNotMaster is returned by [RoleChecker.CheckWritable], [Client.Get]
// and [Client.Discover] when the server is not a master: writing to it
// would fail, or, on Redis 2.4, be lost at the replica's next resync.
var ErrNotMaster = errors.New("sentinel: server is not a master")

// InfoRole reads the role field of INFO, sent with no argument, which works
// on every Redis version from 2.4 on.
func InfoRole(ctx context.Context, conn redis.Conn) (Role, error) {
	s, err := redis.String(redis.DoContext(conn, ctx, "INFO"))
	if err != nil {
		return "", fmt.Errorf("sentinel: INFO: %w", err)
	}
	return parseInfoRole(s)
}

func parseInfoRole(info string) (Role, error) {
	v, ok := redisinfo.Field(info, "role")
	if !ok {
		return "", errors.New("sentinel: INFO has no role field")
	}
	switch r := Role(v); r {
	case RoleMaster, RoleSlave:
		return r, nil
	default:
		return "", fmt.Errorf("sentinel: INFO: unknown role %q", v)
	}
}

// QueryRole asks a modern server its role with ROLE (2.8.12 and later) and
// falls back to INFO replication when ROLE is refused. Sentinel mode only:
// Redis 2.4 has neither; use [InfoRole] there.
func QueryRole(ctx context.Context, conn redis.Conn) (Role, error) {
	reply, err := redis.Values(redis.DoContext(conn, ctx, "ROLE"))
	if err == nil {
		if len(reply) == 0 {
			return "", errors.New("sentinel: ROLE: empty reply")
		}
		r, err := redis.String(reply[0], nil)
		if err != nil {
			return "", fmt.Errorf("sentinel: ROLE: %w", err)
		}
		return Role(r), nil
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return "", fmt.Errorf("sentinel: ROLE: %w", err)
	}
	s, err := redis.String(redis.DoContext(conn, ctx, "INFO", "replication"))
	if err != nil {
		return "", fmt.Errorf("sentinel: INFO replication: %w", err)
	}
	return parseInfoRole(s)
}

// DefaultMaxAge is how long a [RoleChecker] trusts a role it read.
const DefaultMaxAge = time.Second

// RoleChecker tells whether the server behind a pool is a master, reading
// INFO (no argument, as Redis 2.4 requires) at most once per MaxAge. After
// an operator promotes a replica with SLAVEOF NO ONE, writes are allowed
// again within MaxAge; after a master is made a replica, writes are refused
// within MaxAge. It is safe for concurrent use.
type RoleChecker struct {
	pool   *redis.Pool
	maxAge time.Duration
	now    func() time.Time

	mu      sync.Mutex
	role    Role
	checked time.Time
}

// NewRoleChecker returns a RoleChecker for the server of pool, which it
// does not close. maxAge <= 0 means DefaultMaxAge.
func NewRoleChecker(pool *redis.Pool, maxAge time.Duration) *RoleChecker {
	if maxAge <= 0 {
		maxAge = DefaultMaxAge
	}
	return &RoleChecker{pool: pool, maxAge: maxAge, now: time.Now}
}

// Role reads the server's role now, with INFO.
func (rc *RoleChecker) Role(ctx context.Context) (Role, error) {
	conn, err := rc.pool.GetContext(ctx)
	if err != nil {
		return "", fmt.Errorf("sentinel: role check: %w", err)
	}
	defer conn.Close()
	role, err := InfoRole(ctx, conn)
	if err != nil {
		return "", err
	}
	rc.mu.Lock()
	rc.role, rc.checked = role, rc.now()
	rc.mu.Unlock()
	return role, nil
}

// CheckWritable returns nil when the server is a master, an error wrapping
// ErrNotMaster when it is a replica, or the error of the INFO that failed.
// It reads INFO again once the last reading is MaxAge old.
func (rc *RoleChecker) CheckWritable(ctx context.Context) error {
	rc.mu.Lock()
	role, fresh := rc.role, rc.role != "" && rc.now().Sub(rc.checked) < rc.maxAge
	rc.mu.Unlock()
	if !fresh {
		var err error
		if role, err = rc.Role(ctx); err != nil {
			return err
		}
	}
	if role != RoleMaster {
		return fmt.Errorf("%w: INFO says role:%s", ErrNotMaster, role)
	}
	return nil
}
