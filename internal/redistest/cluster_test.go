package redistest_test

import (
	"testing"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// The cluster's nodes keep an append-only file, so that a node killed and
// restarted has its data, but leave its fsync to the kernel: a killed
// process loses nothing the kernel holds. With appendfsync always every
// write waits for the disk in the node's main thread, and a disk that is
// busy with something else stalls the node past cluster-node-timeout: the
// others then declare it failed and the cluster goes down (CLUSTERDOWN)
// or fails it over in the middle of a test that never asked for it.
func TestClusterNodesLeaveFsyncToTheKernel(t *testing.T) {
	c := redistest.StartCluster(t)
	for _, n := range c.Nodes {
		for key, want := range map[string]string{"appendonly": "yes", "appendfsync": "no"} {
			got, err := redis.Strings(n.Do(t, "CONFIG", "GET", key), nil)
			if err != nil || len(got) != 2 || got[1] != want {
				t.Errorf("%s: CONFIG GET %s = %q, %v; want %s", n.Addr, key, got, err, want)
			}
		}
	}
}
