package engine

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// Lanes. A namespace lives on one Redis (one pool, one lane) or is spread
// over several (one pool per lane, in lane order: NewClient, NewServer,
// NewInspector). A lane is the unit of every transaction: its keys share
// one hash tag ("{ns}:" for lane 0, "{ns:k}:" for lane k), so it lives on
// one server (and in one Redis Cluster slot), and no transaction spans
// two lanes. Lanes that live on the same server take the same
// *redis.Pool: they share its connections, and a Server shares one
// blocking wait among them. The number of lanes is fixed for the life of
// the namespace (task ids and unique keys hash to lanes), while a lane
// moves to another server by replication (docs/scaling.md).

// ErrShardMapVersion: a lane's map key names a newer shard-map version
// than this process was configured with (AdvancedConfig.MapVersion): an
// operator moved the lane, and this process runs with an old map. Nothing
// was written to the lane.
var ErrShardMapVersion = txn.ErrFenced

// laneSpec says which lane a Config's parts serve.
type laneSpec struct {
	index int
	hub   *waitHub // the idle workers' shared wait on the lane's server, if shared
}

// maxLanes bounds the number of lanes.
const maxLanes = 4096

// checkPools validates the pools of a namespace's lanes.
func checkPools(pools []*redis.Pool) error {
	if len(pools) == 0 || len(pools) > maxLanes {
		return fmt.Errorf("engine: %d pools: want 1 to %d (one per lane): %w", len(pools), maxLanes, ErrInvalid)
	}
	for i, p := range pools {
		if p == nil {
			return fmt.Errorf("engine: lane %d has a nil pool: %w", i, ErrInvalid)
		}
	}
	return nil
}

// laneConfig returns cfg for the parts of lane k.
func laneConfig(cfg Config, k int) Config {
	cfg.lane = laneSpec{index: k}
	return cfg
}

// laneSep separates a generated task id from its lane.
const laneSep = "~"

// LaneOf returns the lane of task id in a namespace of lanes lanes, as
// every sharded call routes it: a generated id ends with "~k", its lane;
// a generated id without it (22 base62 digits, or a canonical UUID from an
// earlier release: an id generated before the namespace had lanes) is in
// lane 0; any other id (chosen with TaskID) hashes to a lane. A caller
// may pick a lane for its own id by ending it with "~k". A reply task
// ("<id>~r<run>.<finished>", ReplyTo) is in the lane of <id>.
func laneOf(id string, lanes int) int {
	if lanes <= 1 {
		return 0
	}
	id = replyParent(id)
	if i := strings.LastIndex(id, laneSep); i >= 0 {
		if k, err := strconv.Atoi(id[i+1:]); err == nil && k >= 0 && k < lanes && strconv.Itoa(k) == id[i+1:] {
			return k
		}
	}
	if generatedID(id) {
		return 0
	}
	return hashLane(id, lanes)
}

// replyParent strips the suffixes "~r<run>.<finished>" that name the reply
// task of a task (ReplyTo), written in the lane of the task it
// answers: the lane of a reply task is its parent's.
func replyParent(id string) string {
	for {
		i := strings.LastIndex(id, laneSep+"r")
		if i <= 0 {
			return id
		}
		run, fin, ok := strings.Cut(id[i+2:], ".")
		if !ok || !digits(run) || !digits(fin) {
			return id
		}
		id = id[:i]
	}
}

func digits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// hashLane maps a string to a lane: FNV-1a, the same in every process.
func hashLane(s string, lanes int) int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return int(h.Sum64() % uint64(lanes))
}

// laneTaskID returns a new id in lane k of lanes lanes for a task created
// at Unix millisecond created (buckets.NewID).
func laneTaskID(k, lanes int, created int64) string {
	id := buckets.NewID(created)
	if lanes <= 1 {
		return id
	}
	return id + laneSep + strconv.Itoa(k)
}

// ShardKey picks the task's lane in a sharded client by hashing key, so
// that the tasks of one key (one customer's, say) share a lane, and run in
// the order of their due times within their queue as any tasks of one
// lane do. Without it, tasks without an id or a unique key are spread
// round-robin. While the key's lane is unreachable the task goes to
// another lane (see Client). A Client with one lane ignores it.
func ShardKey(key string) Option {
	return optionFunc(func(o *taskOptions) error {
		if key == "" || len(key) > 1024 {
			return fmt.Errorf("engine: ShardKey: want 1 to 1024 bytes, not %d: %w", len(key), ErrInvalid)
		}
		o.shardKey = key
		return nil
	})
}
