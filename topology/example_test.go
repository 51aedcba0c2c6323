package topology_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/topology"
)

// All the engine's keys of a namespace carry its hash tag, so they share
// one slot, and one cluster pool serves them.
func ExampleSlot() {
	fmt.Println(topology.Slot("{bq}") == topology.Slot("{bq}:t:0f8c"))
	fmt.Println(topology.Slot("{bq}") == topology.Slot("{other}"))
	// Output:
	// true
	// false
}

// An engine on a Redis Cluster: the pool reaches the master of the
// namespace's slot and follows it when it moves.
func ExampleNewCluster() {
	c, err := topology.NewCluster(topology.ClusterOptions{Seeds: []string{"10.0.0.1:7000", "10.0.0.2:7000"}})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	cfg := engine.Config{Namespace: "bq"}
	client, err := engine.NewClient(cfg, c.Pool("{"+cfg.Namespace+"}"))
	if err != nil {
		panic(err)
	}
	_ = client // enqueue as on a lone server
}

// An engine behind Redis Sentinel: the pool reaches the master the
// sentinels name and follows failovers.
func ExampleNewSentinel() {
	s, err := topology.NewSentinel(topology.SentinelOptions{
		Sentinels:  []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"},
		MasterName: "bq",
	})
	if err != nil {
		panic(err)
	}
	defer s.Close()
	srv, err := engine.NewServer(engine.Config{Namespace: "bq"}, engine.NewMux(), engine.AllRoles, s.Pool())
	if err != nil {
		panic(err)
	}
	_ = srv // srv.Run(ctx)
}

// Redis 2.4 replication without Sentinel: writes go only to the listed
// server that says role:master. Here no listed server answers, so nothing
// is written, and the error says why.
func ExampleNewReplicated() {
	r, err := topology.NewReplicated(topology.ReplicatedOptions{
		Servers:      []string{"127.0.0.1:1", "127.0.0.1:2"}, // the primary and a replica; nothing listens there
		CheckTimeout: 500 * time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = r.Master(ctx)
	fmt.Println(errors.Is(err, topology.ErrNotMaster))
	// Output:
	// true
}
