// Package txn runs Redis optimistic transactions on servers as old as
// Redis 2.4: WATCH some keys, read them, then queue writes between MULTI
// and EXEC, and start again when EXEC answers nil because a watched key
// changed. It depends only on redigo and on package redis24 (the 2.4
// command table), and knows nothing about what the keys hold.
//
// # Three shapes, one protocol
//
//   - [Run] and [Runner.Run]: one transaction. A function reads through a
//     [Tx] on the watched connection and queues writes; Run sends MULTI,
//     the writes and EXEC in one round trip and retries a conflict.
//   - [Runner.Pipeline]: several transactions in flight on one connection,
//     each [Step]'s EXEC travelling with the next one's WATCH and reads,
//     for batches of small transactions whose reads are known up front.
//   - [Tx.Hold] and [Held.Exec]: a committed transaction leaves a WATCH
//     on the connection, and a later one writes under it without reading
//     again, sending other commands behind its EXEC in the same round trip.
//
// Code built on txn never sends WATCH, MULTI, EXEC or UNWATCH itself (a
// [Tx] refuses them as reads): txn does, and it checks every reply to them.
//
// # Retry contract
//
// The function given to [Run] may run several times: once per attempt. It
// must read what it needs through the [Tx] it is given and decide again
// from scratch each time; it must not keep effects outside Redis that
// cannot be repeated. Attempts are bounded ([Runner.MaxAttempts]) and
// separated by the Runner's one backoff policy, jittered and growing; when
// they are used up Run returns an error wrapping [ErrConflict]. Pipeline
// steps and held transactions are not retried: they report ErrConflict
// and the caller chooses again. Every conflict is counted
// ([Runner.Conflicts]).
//
// # Contexts and connections
//
// Every round trip ([Do], and each one inside a transaction) is bounded by
// the context's deadline and by the round-trip bound the context carries
// ([WithRoundTrip], [DefaultRoundTrip] when it names none), whichever is
// first (or the connection's read timeout, if sooner). A command that
// answers at once is sent with that deadline set on the connection
// (redis.DoWithTimeout), which costs no goroutine per round trip, even
// under a context without a deadline; a blocking pop (bounded by the
// context alone: the server bounds its wait) goes through
// redis.DoContext, which also returns as soon as the context is
// cancelled. When a read is cut short, redigo closes the connection, so
// that a redis.Pool discards it instead of reusing a connection with a
// reply in flight. A read cut short by the context's deadline wraps
// ctx.Err(), so errors.Is(err, context.DeadlineExceeded) holds; one cut
// short by the round-trip bound is a timeout of the connection (or
// [ErrRoundTrip]), which a caller retries like a dropped connection. The
// connection must implement redis.ConnWithContext, as redigo's
// connections and pooled connections do, and preferably
// redis.ConnWithTimeout.
//
// # Redis 2.4 caveats
//
// At Redis 2.4 a command that the server rejects while it is being queued
// (unknown name, wrong number of arguments, or any write while memory is
// over maxmemory) is dropped, and EXEC still runs the rest: there is no
// EXECABORT before 2.6.5. txn therefore checks every queued command
// against the Redis 2.4 table and argument forms (package redis24) before
// it sends MULTI; and on a server older than 2.6.5 (a Runner reads the
// version once, with INFO; a server that does not say is taken for old)
// it reads the replies to MULTI and the queued commands before it sends
// EXEC, and sends DISCARD instead when any was refused. That costs one
// round trip per transaction there, and makes every transaction all or
// nothing on 2.4 as on later servers. 2.4 also refuses EXEC itself at
// maxmemory and keeps the transaction open; txn then DISCARDs, so no
// connection is handed back inside MULTI. A write refused for memory
// matches [ErrFull].
//
// txn checks every element of the EXEC reply: a runtime error (a key of
// the wrong type, say) is one element, and the commands after it still
// ran. Such an element is reported as an [*ExecError] naming the command,
// with the replies.
//
// Within this module, package buckets builds the task engine's
// transactions on txn, and package engine is the stable API.
package txn
