package chaos

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine"
	"github.com/gomodule/redigo/redis"
)

// lane is one lane of the chaos namespace: its server, an admin pool on
// it, its keys and a client of it.
type lane struct {
	srv    *redisServer
	admin  *redis.Pool
	keys   buckets.Keys
	client *engine.Client
	pool   *redis.Pool // the client's
}

// startLanes sets up the lanes: without shards, the one lane on h.redis
// (h.admin, h.client); with n >= 2 shards, lane 0 on h.redis and a
// redis-server of its own (the same options) for each other lane, and
// every process is told the lanes' addresses: with connection cuts, each
// server's own cutting proxy (seeded per lane), so that a cut hits one
// lane's connections while the others' go on.
func (h *harness) startLanes(rbin string, n int) error {
	keys, err := buckets.NewLaneKeys(h.ns, 0)
	if err != nil {
		return err
	}
	h.lanes = []*lane{{srv: h.redis, admin: h.admin, keys: keys, client: h.client, pool: h.clientPool}}
	if n < 2 {
		return nil
	}
	addrs := []string{h.procAddr}
	for k := 1; k < n; k++ {
		srv, err := startRedis(rbin, filepath.Join(h.dir, fmt.Sprintf("redis-%d", k)), redisOptions{
			appendOnly: h.sc.Restarts > 0, timeout: h.sc.ServerTimeout, bin24: h.opts.Redis24})
		if err != nil {
			return err
		}
		keys, err := buckets.NewLaneKeys(h.ns, k)
		if err != nil {
			return err
		}
		l := &lane{srv: srv, admin: srv.AdminPool(), keys: keys}
		l.pool = clientPool(srv.Addr)
		h.lanes = append(h.lanes, l)
		addr := srv.Addr
		if h.sc.Cuts != nil {
			px, err := newProxy(srv.Addr, *h.sc.Cuts, h.seedFor(fmt.Sprintf("proxy-%d", k)))
			if err != nil {
				return err
			}
			h.proxies = append(h.proxies, px)
			addr = px.Addr()
		}
		addrs = append(addrs, addr)
	}
	var pools []*redis.Pool
	for _, l := range h.lanes {
		pools = append(pools, l.pool)
	}
	sc, err := engine.NewClient(engine.Config{Namespace: h.ns, MaxPayload: MaxPayload}, pools...)
	if err != nil {
		return err
	}
	for _, l := range h.lanes {
		l.client = sc // routes each call by id to the id's lane
	}
	h.laneAddrs = strings.Join(addrs, ",")
	h.logf("%d lanes on servers %s", n, h.laneAddrs)
	return nil
}

// stopLanes stops the servers of lanes 1 and up (lane 0's is h.redis).
func (h *harness) stopLanes() {
	for _, l := range h.lanes[1:] {
		l.pool.Close()
		l.admin.Close()
		l.srv.Stop(syscall.SIGKILL)
	}
}

// enableCuts turns every cutting proxy's cuts on or off.
func (h *harness) enableCuts(on bool) {
	for _, px := range h.proxies {
		px.enabled.Store(on)
	}
}

// closeProxies closes every cutting proxy.
func (h *harness) closeProxies() {
	for _, px := range h.proxies {
		px.Close()
	}
}

// cuts sums the cuts of every proxy: by kind, and their total.
func (h *harness) cuts() (map[string]int, int) {
	out := map[string]int{}
	total := 0
	for _, px := range h.proxies {
		m, n := px.Cuts()
		for k, v := range m {
			out[k] += v
		}
		total += n
	}
	return out, total
}

// clientPool is the harness's own pool for API calls on a server.
func clientPool(addr string) *redis.Pool {
	return &redis.Pool{MaxIdle: 4, IdleTimeout: 500 * time.Millisecond,
		Dial: func() (redis.Conn, error) {
			return redis.Dial("tcp", addr, redis.DialConnectTimeout(2*time.Second),
				redis.DialReadTimeout(10*time.Second), redis.DialWriteTimeout(10*time.Second))
		},
		TestOnBorrow: func(c redis.Conn, _ time.Time) error { _, err := c.Do("PING"); return err }}
}

// laneOf is the lane of task id.
func (h *harness) laneOf(id string) *lane { return h.lanes[h.lanes[0].client.LaneOf(id)] }

// shardedAdmin is an Inspector over every lane's admin pool, for the
// namespace check and the dead letters.
func (h *harness) shardedAdmin() (*engine.Inspector, error) {
	var pools []*redis.Pool
	for _, l := range h.lanes {
		pools = append(pools, l.admin)
	}
	return engine.NewInspector(engine.Config{Namespace: h.ns, MaxPayload: MaxPayload}, pools...)
}
