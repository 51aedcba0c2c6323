package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/bucketq/bucketq/internal/safetext"
	"github.com/bucketq/bucketq/redis24"
	"github.com/bucketq/bucketq/topology"
	"github.com/gomodule/redigo/redis"
)

// Redis modes (redis.mode).
const (
	modeSingle   = "single"   // one server at redis.addr, or the master among it and redis.replicas
	modeCluster  = "cluster"  // a Redis Cluster; redis.addr and redis.seeds are seed nodes
	modeSentinel = "sentinel" // the master that redis.sentinel.addrs name for redis.sentinel.master_name
)

var redisModes = []string{modeSingle, modeCluster, modeSentinel}

// RedisModeSettings says how the engine finds the server it writes to:
// part of RedisSettings (redis.mode, redis.replicas, redis.seeds,
// redis.sentinel.*, redis.role_max_age).
type RedisModeSettings struct {
	Mode     string
	Replicas []string // single: replicas of addr, Redis 2.4 style
	Seeds    []string // cluster: more seed nodes besides addr
	Sentinel struct {
		Addrs      []string
		MasterName string
		Password   string
	}
	RoleMaxAge time.Duration

	namespace string // the hash tag of the engine's keys, for cluster mode
}

// redisModeSettings are the keys of RedisModeSettings.
var redisModeSettings = []setting{
	{"redis.mode", func(s *Settings) any { return &s.Redis.Mode }},
	{"redis.replicas", func(s *Settings) any { return &s.Redis.Replicas }},
	{"redis.seeds", func(s *Settings) any { return &s.Redis.Seeds }},
	{"redis.sentinel.addrs", func(s *Settings) any { return &s.Redis.Sentinel.Addrs }},
	{"redis.sentinel.master_name", func(s *Settings) any { return &s.Redis.Sentinel.MasterName }},
	{"redis.sentinel.password", func(s *Settings) any { return &s.Redis.Sentinel.Password }},
	{"redis.role_max_age", func(s *Settings) any { return &s.Redis.RoleMaxAge }},
}

// redisModeDefaults sets the defaults of the mode settings.
func redisModeDefaults(s *Settings) {
	s.Redis.Mode = modeSingle
	s.Redis.Replicas, s.Redis.Seeds, s.Redis.Sentinel.Addrs = []string{}, []string{}, []string{}
	s.Redis.RoleMaxAge = topology.DefaultRoleMaxAge
}

// redisSettings is s.Redis as newPool needs it: with the namespace, whose
// hash tag picks the cluster slot.
func (s *Settings) redisSettings() RedisSettings {
	rs := s.Redis
	rs.namespace = s.Engine.Namespace
	return rs
}

// validateRedisMode judges the mode settings.
func (s *Settings) validateRedisMode(bad func(key, format string, args ...any)) {
	r := &s.Redis
	if !slices.Contains(redisModes, r.Mode) {
		bad("redis.mode", "%s: want single, cluster or sentinel", safetext.Quote(r.Mode))
		return
	}
	addrs := func(key string, list []string) {
		seen := map[string]bool{}
		for _, a := range list {
			if _, port, err := net.SplitHostPort(a); err != nil || a == "" || !validPort(port) {
				bad(key, "%s: want host:port", showAddr(a))
			} else if seen[a] {
				bad(key, "%s listed twice", showAddr(a))
			}
			seen[a] = true
		}
	}
	addrs("redis.replicas", r.Replicas)
	addrs("redis.seeds", r.Seeds)
	addrs("redis.sentinel.addrs", r.Sentinel.Addrs)
	if slices.Contains(r.Replicas, r.Addr) {
		bad("redis.replicas", "%s is redis.addr: list only the other servers", r.Addr)
	}
	if r.RoleMaxAge <= 0 {
		bad("redis.role_max_age", "%v: want a positive duration, e.g. 1s", r.RoleMaxAge)
	}
	only := func(key string, set bool, mode string) {
		if set && r.Mode != mode {
			bad(key, "is for redis.mode %s, and redis.mode is %s", mode, r.Mode)
		}
	}
	only("redis.replicas", len(r.Replicas) > 0, modeSingle)
	only("redis.seeds", len(r.Seeds) > 0, modeCluster)
	only("redis.sentinel.addrs", len(r.Sentinel.Addrs) > 0, modeSentinel)
	only("redis.sentinel.master_name", r.Sentinel.MasterName != "", modeSentinel)
	only("redis.sentinel.password", r.Sentinel.Password != "", modeSentinel)
	switch r.Mode {
	case modeCluster:
		if r.DB != 0 {
			bad("redis.db", "%d: a Redis Cluster has database 0 only", r.DB)
		}
	case modeSentinel:
		if len(r.Sentinel.Addrs) == 0 {
			bad("redis.sentinel.addrs", "empty: redis.mode sentinel needs the sentinels' host:port")
		}
		if r.Sentinel.MasterName == "" {
			bad("redis.sentinel.master_name", "empty: redis.mode sentinel needs the name the sentinels monitor the master under")
		}
	}
}

// validPort reports whether port is a number from 1 to 65535.
func validPort(port string) bool {
	n, err := strconv.Atoi(port)
	return err == nil && n > 0 && n < 1<<16
}

// modePool returns the pool of a mode other than a lone server, or nil
// for a lone server (redis.mode single without replicas).
func modePool(rs RedisSettings, size int, census *redis24.Census) (*redis.Pool, error) {
	if rs.Mode == modeSingle && len(rs.Replicas) == 0 || rs.Mode == "" {
		return nil, nil
	}
	data, err := addrDialer(rs, census)
	if err != nil {
		return nil, err
	}
	po := topology.PoolOptions{MaxIdle: size, MaxActive: size, IdleTimeout: 5 * time.Minute}
	var (
		pool   *redis.Pool
		closer io.Closer
	)
	switch rs.Mode {
	case modeSingle:
		control, err := addrDialer(rs, census)
		if err != nil {
			return nil, err
		}
		r, err := topology.NewReplicated(topology.ReplicatedOptions{Servers: append([]string{rs.Addr}, rs.Replicas...),
			Dial: data, DialControl: control, RoleMaxAge: rs.RoleMaxAge, Pool: po})
		if err != nil {
			return nil, err
		}
		pool, closer = r.Pool(), r
	case modeCluster:
		control, err := addrDialer(rs, census, redis24.ForMode(redis24.ModeCluster))
		if err != nil {
			return nil, err
		}
		c, err := topology.NewCluster(topology.ClusterOptions{Seeds: append([]string{rs.Addr}, rs.Seeds...),
			Dial: data, DialControl: control, Pool: po})
		if err != nil {
			return nil, err
		}
		pool, closer = c.Pool("{"+rs.namespace+"}"), c
	case modeSentinel:
		control, err := addrDialer(rs, census, redis24.ForMode(redis24.ModeSentinel))
		if err != nil {
			return nil, err
		}
		srs := rs
		srs.User, srs.Password, srs.DB = "", rs.Sentinel.Password, 0
		sentinels, err := addrDialer(srs, census, redis24.ForMode(redis24.ModeSentinel))
		if err != nil {
			return nil, err
		}
		s, err := topology.NewSentinel(topology.SentinelOptions{Sentinels: rs.Sentinel.Addrs, MasterName: rs.Sentinel.MasterName,
			Dial: data, DialControl: control, DialSentinel: sentinels, RoleMaxAge: rs.RoleMaxAge, Pool: po})
		if err != nil {
			return nil, err
		}
		pool, closer = s.Pool(), s
	default:
		return nil, fmt.Errorf("redis.mode %q: want single, cluster or sentinel", rs.Mode)
	}
	// As newPool's: idle connections are PINGed when older than a minute.
	pool.TestOnBorrow = func(c redis.Conn, t time.Time) error {
		if time.Since(t) < time.Minute {
			return nil
		}
		_, err := c.Do("PING")
		return err
	}
	topologies.Lock()
	topologies.of[pool] = closer
	topologies.Unlock()
	return pool, nil
}

// topologies are the topologies behind the pools newPool made, by pool.
var topologies = struct {
	sync.Mutex
	of map[*redis.Pool]io.Closer
}{of: map[*redis.Pool]io.Closer{}}

// closePool closes a pool made by newPool, and the topology behind it
// (its slot-map connections, its sentinel follower).
func closePool(p *redis.Pool) {
	topologies.Lock()
	c := topologies.of[p]
	delete(topologies.of, p)
	topologies.Unlock()
	if c != nil {
		_ = c.Close() // closes p too
		return
	}
	_ = p.Close()
}

// addrDialer is dialer for any address, with extra guard options.
func addrDialer(rs RedisSettings, census *redis24.Census, extra ...redis24.Option) (topology.Dialer, error) {
	var mu sync.Mutex
	dials := map[string]func(context.Context) (redis.Conn, error){}
	if _, err := dialer(rs, census, extra...); err != nil {
		return nil, err // a bad TLS setting, reported now
	}
	return func(ctx context.Context, addr string) (redis.Conn, error) {
		mu.Lock()
		d, ok := dials[addr]
		if !ok {
			a := rs
			a.Addr = addr
			var err error
			if d, err = dialer(a, census, extra...); err != nil {
				mu.Unlock()
				return nil, err
			}
			dials[addr] = d
		}
		mu.Unlock()
		return d(ctx)
	}, nil
}
