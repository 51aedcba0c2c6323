// Package cluster routes commands and optimistic transactions to the nodes
// of a Redis Cluster.
//
// A [Router] learns which master serves each of the 16384 hash slots with
// CLUSTER SLOTS, keeps one redigo pool per node, and hands out connections
// to the master of a slot ([Router.Get], [Router.GetForKey]). [Router.Do]
// runs one command and follows MOVED, ASK and TRYAGAIN replies;
// [Router.Txn] runs a whole WATCH … MULTI … EXEC transaction on the node of
// its slot and runs it again, whole, after a redirection, never half of it.
//
// The commands this package adds to those of its callers are CLUSTER SLOTS
// (to learn the map), ASKING (before each command sent to a node that is
// importing a slot, after an ASK reply) and, after an ASK reply to a
// transaction, one EXISTS over the transaction's keys on the node that is
// migrating the slot, to learn whether they have all left it. They are sent
// only by a Router, that is only when Cluster mode is configured; a plain
// Redis 2.4 server never sees them.
//
// Every round trip is bounded by the caller's context (redigo's DoContext
// and ReceiveContext, which close the connection when the context ends).
package cluster
