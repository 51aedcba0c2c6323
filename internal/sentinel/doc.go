// Package sentinel finds and follows the master of a replicated Redis
// deployment, and tells a master from a replica before anything is written.
//
// [Client] asks a list of Redis Sentinels for the master of a named set
// (SENTINEL get-master-addr-by-name), verifies with ROLE (or INFO
// replication on servers older than 2.8.12) that the server it was given is
// a master, follows failovers by subscribing to +switch-master on a
// sentinel ([Client.Run]), and checks the role again on every connection it
// hands out for writing ([Client.Get]).
//
// Redis 2.4 has no Sentinel. For it, [RoleChecker] reads INFO, with no
// argument since 2.4's INFO takes none, and reports role:master or
// role:slave, so that a writer can refuse to write to a replica (a 2.4
// replica accepts writes and loses them at the next resync) and follow an
// operator's SLAVEOF NO ONE within its MaxAge.
//
// Commands sent: SENTINEL get-master-addr-by-name and SUBSCRIBE
// +switch-master to sentinels, ROLE (and INFO replication as a fallback) to
// the master, all only by a Client, that is in Sentinel mode; INFO with no
// argument, a 2.4 command, by a RoleChecker.
package sentinel
