package buckets

import (
	"fmt"
	"strconv"

	"github.com/bucketq/bucketq/txn"
)

// NewLaneKeys returns the key schema of lane (logical shard) lane of
// namespace ns. Lane 0 is the namespace itself, "{ns}:", so that a
// namespace written before it had lanes is its lane 0; lane k > 0 is
// "{ns:k}:". Each lane's keys share one hash tag, so a lane lives on one
// server and in one Redis Cluster slot, and every transaction, which
// touches the keys of one lane only, stays on one server.
func NewLaneKeys(ns string, lane int) (Keys, error) {
	k, err := NewKeys(ns)
	if err != nil {
		return Keys{}, err
	}
	if lane < 0 {
		return Keys{}, fmt.Errorf("buckets: lane %d of namespace %q: want 0 or more: %w", lane, ns, ErrInvalid)
	}
	if lane > 0 {
		k.prefix = "{" + ns + ":" + strconv.Itoa(lane) + "}:"
	}
	return k, nil
}

// NewLaneStore is NewStore for lane lane of namespace ns (see
// NewLaneKeys); lane 0 is the same as NewStore(ns, resolutionMs).
func NewLaneStore(ns string, lane int, resolutionMs int64) (*Store, error) {
	st, err := NewStore(ns, resolutionMs)
	if err != nil {
		return nil, err
	}
	if st.Keys, err = NewLaneKeys(ns, lane); err != nil {
		return nil, err
	}
	return st, nil
}

// ShardMap is the lane's shard-map version: STRING, the integer version
// of the shard map that last moved the lane. A Store with a fence
// (SetMapFence) writes only while it is at most the Store's version, or
// does not exist.
func (k Keys) ShardMap() string { return k.prefix + "map" }

// SetMapFence makes every transaction of the Store conditional on the
// lane's shard-map key ([Keys.ShardMap]) holding an integer no greater
// than version, or not existing: otherwise it writes nothing and fails
// with an error matching txn.ErrFenced. It costs one more round trip for transactions run with
// WATCH and none for the dispatcher's pipelined moves. Call it before the
// Store is used.
func (s *Store) SetMapFence(version int64) {
	s.runner.Fence = &txn.Fence{Key: s.Keys.ShardMap(), Max: version}
}
