// Package route provides a redigo connection that sends each batch of
// commands to the server a [Target] names at that moment: the master of a
// Redis Cluster slot, the master a set of Sentinels names, or the listed
// server whose INFO says role:master. It is what package topology builds
// its pools on.
//
// A [Conn] holds one connection to one server. Before each batch that
// starts on a clean connection (no reply outstanding, no WATCH or MULTI
// open) it asks the Target where requests go now and moves there when that
// changed. Every error reply is shown to the Target, which says whether it
// means that the server ran nothing and the request belongs elsewhere
// (MOVED, READONLY) or later (ASK, TRYAGAIN, CLUSTERDOWN). Then:
//
//   - a batch outside a transaction (no WATCH or MULTI in it or open
//     before it) is sent again, whole, where the Target now says, after a
//     backoff when asked, within the caller's context and a bound on tries;
//   - any other batch in which nothing was written (reads, WATCH, a MULTI
//     … EXEC that EXEC refused) fails with an error wrapping
//     [txn.ErrNotRun], so that the transaction's owner runs it again from
//     its WATCH ([txn.Runner.Run] does). A WATCH or MULTI open on the old
//     server is dropped with its connection;
//   - a batch in which something was written returns its replies as they
//     are, error replies in place, as any connection would.
//
// Whether a batch wrote is judged command by command: a command outside
// MULTI that is not a known read and whose reply is not an error wrote; an
// EXEC whose reply is an array wrote.
//
// Commands are buffered by Send and written at the next Do, Flush or
// Receive, so that a batch goes out whole to one server. The Conn sends
// nothing of its own: what a Target sends (CLUSTER SLOTS, ROLE, INFO)
// travels on the Target's connections.
package route
