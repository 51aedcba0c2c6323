package main

import (
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/gomodule/redigo/redis"
)

// ShardSettings is the shards: section, the shard map: the namespace's
// lanes (logical shards) and the server each lives on. Empty Lanes: one
// lane on redis.addr, as without sharding.
type ShardSettings struct {
	// Version is the shard map's version (shards.version), raised by one
	// each time a lane moves to another server; 0 turns the map check
	// off (docs/scaling.md).
	Version int
	// Lanes lists, for lane k, the host:port of its server
	// (shards.lanes[k]); lanes of one server share its connections. The
	// other redis.* settings (password, TLS, timeouts) apply to each.
	Lanes []string
}

func init() {
	settings = append(settings,
		setting{"shards.lanes", func(s *Settings) any { return &s.Shards.Lanes }},
		setting{"shards.version", func(s *Settings) any { return &s.Shards.Version }},
	)
	slices.SortFunc(settings, func(a, b setting) int { return strings.Compare(a.key, b.key) })
}

// sharded reports whether the settings list lanes.
func (s *Settings) sharded() bool { return len(s.Shards.Lanes) > 0 }

// validateShards checks the shards: section.
func (s *Settings) validateShards(bad func(key, format string, args ...any)) {
	if len(s.Shards.Lanes) == 0 {
		s.Shards.Lanes = nil // "lanes: []" is the default
	}
	if s.Shards.Version < 0 {
		bad("shards.version", "%d: want 1 or more, or 0 for no map check", s.Shards.Version)
	}
	if len(s.Shards.Lanes) > 4096 {
		bad("shards.lanes", "%d lanes: want at most 4096", len(s.Shards.Lanes))
	}
	for i, addr := range s.Shards.Lanes {
		if _, _, err := net.SplitHostPort(addr); err != nil || addr == "" {
			bad(fmt.Sprintf("shards.lanes[%d]", i), "%s: want host:port", showAddr(addr))
		}
	}
	if s.sharded() && s.Redis.Mode != "" && s.Redis.Mode != modeSingle {
		bad("shards.lanes", "with redis.mode %s: the daemon's shard map lists single servers (mode single); a library user can give engine.NewClient and engine.NewServer one topology pool per lane", s.Redis.Mode)
	}
	if s.sharded() && len(s.Redis.Replicas) > 0 {
		bad("shards.lanes", "with redis.replicas: the replica list names one server's replicas, not each lane's; a library user can give engine.NewClient and engine.NewServer one topology.Replicated pool per lane")
	}
	if s.Shards.Version > 0 && !s.sharded() {
		bad("shards.version", "%d without shards.lanes: list the lanes' servers", s.Shards.Version)
	}
}

// lanePools opens the pools of the namespace's lanes: without shards one
// pool of size connections on redis.addr (per redis.mode), with shards one
// pool per distinct server of the shard map, lanes of one server sharing
// it, in lane order. It returns them with a function that closes them.
//
// A server's pool holds size connections for each lane it carries:
// every lane runs its own worker of concurrency handler slots, each
// holding a connection while its task runs, and its own dispatcher,
// reaper and heartbeat, so a pool sized for one lane would make the
// lanes' heartbeats wait behind their handlers.
func lanePools(set *Settings, size int) ([]*redis.Pool, func(), error) {
	if !set.sharded() {
		p, err := newPool(set.redisSettings(), size, nil)
		if err != nil {
			return nil, nil, err
		}
		return []*redis.Pool{p}, func() { closePool(p) }, nil
	}
	byAddr := map[string]*redis.Pool{}
	lanesOn := map[string]int{}
	for _, addr := range set.Shards.Lanes {
		lanesOn[addr]++
	}
	closeAll := func() {
		for _, p := range byAddr {
			closePool(p)
		}
	}
	var pools []*redis.Pool
	for _, addr := range set.Shards.Lanes {
		p := byAddr[addr]
		if p == nil {
			rs := set.redisSettings()
			rs.Addr = addr
			var err error
			if p, err = newPool(rs, lanesOn[addr]*size, nil); err != nil {
				closeAll()
				return nil, nil, err
			}
			byAddr[addr] = p
		}
		pools = append(pools, p)
	}
	return pools, closeAll, nil
}
