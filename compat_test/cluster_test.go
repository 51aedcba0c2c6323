package compat_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/redis24"
	"github.com/bucketq/bucketq/topology"
	"github.com/gomodule/redigo/redis"
)

// clusterSide is a Redis Cluster the scenarios run on, seen from one
// namespace: the engine's pools reach the master of the namespace's slot
// through topology.Cluster, and so do the scenarios' admin connections.
type clusterSide struct {
	c    *redistest.Cluster
	ns   string
	adm  *topology.Cluster // unguarded, shared by the kind
	seed string
}

// clusters maps a stand-in Server (its Addr a seed node; one for the
// kind, one per scenario) to its cluster side.
var clusters sync.Map

func clusterOf(srv *redistest.Server) *clusterSide {
	if v, ok := clusters.Load(srv); ok {
		return v.(*clusterSide)
	}
	return nil
}

// forNamespace returns the stand-in Server of one scenario's namespace.
func (cs *clusterSide) forNamespace(ns string) *redistest.Server {
	srv := &redistest.Server{Addr: cs.seed, Kind: "cluster"}
	n := *cs
	n.ns = ns
	clusters.Store(srv, &n)
	return srv
}

// pool is newPool on the cluster: a topology.Cluster pool for the slot of
// the namespace, each connection guarded by redis24.Wrap and the fault
// seam, as on a single server.
func (cs *clusterSide) pool(t testing.TB, census *redis24.Census, f *faults, rep *violationReporter) *redis.Pool {
	if cs.ns == "" {
		t.Fatalf("cluster pool without a namespace")
	}
	tc, err := topology.NewCluster(topology.ClusterOptions{
		Seeds: cs.c.Addrs(),
		Dial: func(ctx context.Context, addr string) (redis.Conn, error) {
			c, err := dialServer(addr, "")
			if err != nil {
				return nil, err
			}
			return f.wrap(redis24.Wrap(c, redis24.OnViolation(rep.report), redis24.WithCensus(census))), nil
		},
		DialControl: func(ctx context.Context, addr string) (redis.Conn, error) {
			c, err := dialServer(addr, "")
			if err != nil {
				return nil, err
			}
			return redis24.Wrap(c, redis24.ForMode(redis24.ModeCluster), redis24.OnViolation(rep.report)), nil
		},
		Pool: topology.PoolOptions{MaxIdle: 16, IdleTimeout: time.Minute},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tc.Close() })
	return tc.Pool("{" + cs.ns + "}")
}

func (cs *clusterSide) admin(t testing.TB, ns string) redis.Conn {
	c, err := cs.adm.Pool("{" + ns + "}").GetContext(context.Background())
	if err != nil {
		t.Fatalf("admin connection to the cluster: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// childClusterFlag is the value of COMPAT_CHILD_CLUSTER for a scenario
// on srv: "1" on a cluster.
func childClusterFlag(srv *redistest.Server) string {
	if clusterOf(srv) != nil {
		return "1"
	}
	return ""
}

// childClusterPool is a child worker's pool on a cluster: the master of
// the namespace's slot, found from the seed node, each connection wrapped.
func childClusterPool(t testing.TB, seed, ns string, wrap func(redis.Conn) redis.Conn) *redis.Pool {
	tc, err := topology.NewCluster(topology.ClusterOptions{
		Seeds: []string{seed},
		Dial: func(ctx context.Context, addr string) (redis.Conn, error) {
			c, err := dialServer(addr, "")
			if err != nil {
				return nil, err
			}
			return wrap(c), nil
		},
		DialControl: func(ctx context.Context, addr string) (redis.Conn, error) {
			c, err := dialServer(addr, "")
			if err != nil {
				return nil, err
			}
			return redis24.Wrap(c, redis24.ForMode(redis24.ModeCluster)), nil
		},
		Pool: topology.PoolOptions{MaxIdle: 8},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tc.Pool("{" + ns + "}")
}

// TestConformanceCluster runs the conformance scenarios on a Redis Cluster
// of three masters with a replica each, through topology.Cluster pools,
// and checks the census as on a single server: the engine's connections
// send only Redis 2.4 commands (the slot map's CLUSTER SLOTS goes on
// connections of its own). Child worker processes reach the cluster
// through a cluster pool of their own.
func TestConformanceCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	adm, err := topology.NewCluster(topology.ClusterOptions{Seeds: c.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adm.Close() })
	stand := &redistest.Server{Addr: c.Nodes[0].Addr, Kind: "cluster"}
	clusters.Store(stand, &clusterSide{c: c, adm: adm, seed: c.Nodes[0].Addr})
	k := &kind{name: "cluster", shared: stand, census: redis24.NewCensus(), args: newArgCensus(),
		ran: map[string]bool{}, side: side7}
	if k.version, err = redis.String(c.Nodes[0].Do(t, "INFO", "server"), nil); err == nil {
		for _, line := range strings.Split(k.version, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				k.version = v
			}
		}
	}
	t.Run("scenarios", func(t *testing.T) {
		runScenarios(t, k)
	})
}
