// Package topology builds the redigo pools that the engine takes when its
// data does not live on one plain Redis server: a Redis Cluster, a master
// watched by Redis Sentinel, or a Redis 2.4 primary with replicas that an
// operator promotes by hand.
//
// Every pool it returns is an ordinary *redis.Pool, so it goes wherever
// the engine takes one (one pool per lane). Its connections find the
// right server by themselves:
//
//   - [Cluster.Pool] reaches the master of one hash slot: that of a key's
//     hash tag. All the engine's keys of a namespace (or of a lane) share
//     the tag "{ns}", so one pool serves them all. The slot map comes from
//     CLUSTER SLOTS and is reloaded after a MOVED reply or an unreachable
//     node.
//   - [Sentinel.Pool] reaches the master the sentinels name; it follows
//     +switch-master, and checks with ROLE, at most once per RoleMaxAge,
//     that the server it writes to is still a master.
//   - [Replicated.Pool] reaches the one listed server whose INFO (sent
//     with no argument, as Redis 2.4 requires) says role:master, read
//     again in the background once RoleMaxAge old. While none does, or more than one does,
//     nothing is sent and every request fails with an error wrapping
//     [ErrNotMaster] or [ErrSeveralMasters]: a Redis 2.4 replica accepts
//     writes and throws them away at its next resync. After an operator's
//     SLAVEOF NO ONE on a listed replica, requests go there within
//     RoleMaxAge.
//
// # Redirections and retries
//
// A reply that means the server ran nothing and the request belongs
// elsewhere or later (MOVED, ASK, TRYAGAIN, CLUSTERDOWN in a cluster;
// READONLY from a replica; LOADING) is never shown to the engine as a
// reply. A command or pipeline outside a transaction is sent again, whole,
// where it now belongs, after a backoff for ASK, TRYAGAIN, CLUSTERDOWN and LOADING,
// within the caller's context. A batch that is part of a transaction
// fails with an error wrapping txn.ErrNotRun (package
// github.com/bucketq/bucketq/txn), after which the engine runs the whole
// transaction again from its WATCH, on the new server; never half of one.
// A batch that had already written something when a redirection came back
// (a slot moved between two commands of one round trip) returns its
// replies as they are, as a lost connection would leave the outcome to the
// engine's recovery.
//
// During a slot migration, a key already moved answers ASK. The pools do
// not follow ASK with ASKING: a transaction's keys may be split between
// the two nodes, and reads on either would see half the data. They wait
// instead, and the transaction runs on the new node once the migration
// ends (MOVED).
//
// # Commands sent
//
// The connections handed to the engine send only the engine's commands:
// the Redis 2.4 set. The modes add, on connections of their own: CLUSTER
// SLOTS (Cluster); SENTINEL get-master-addr-by-name and SUBSCRIBE
// +switch-master to sentinels, and ROLE (INFO replication on servers
// older than 2.8.12) to the master (Sentinel); INFO with no argument
// (Replicated, a 2.4 command). Give those connections their own dial
// function (DialControl) to let the 2.4 guard (package redis24, option
// ForMode) tell them apart.
package topology
