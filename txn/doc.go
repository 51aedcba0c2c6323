// Package txn runs Redis optimistic transactions: WATCH some keys, read
// them, then queue writes between MULTI and EXEC, and start again when EXEC
// answers nil because a watched key changed.
//
// # Retry contract
//
// The function given to [Run] may run several times: once per attempt. It
// must read what it needs through the [Tx] it is given and decide again
// from scratch each time; it must not keep effects outside Redis that
// cannot be repeated. Attempts are bounded ([Runner.MaxAttempts]) and
// separated by a jittered, growing backoff; when they are used up Run
// returns [ErrConflict]. Every conflict is counted ([Runner.Conflicts]).
//
// # Redis 2.4 caveats
//
// At Redis 2.4 a command that the server rejects while it is being queued
// (unknown name, wrong number of arguments) is dropped, and EXEC still runs
// the rest: there is no EXECABORT before 2.6.5. Run therefore checks every
// queued command against the Redis 2.4 table and argument forms (package
// redis24) before it sends MULTI, and it checks every element of the EXEC
// reply: a runtime error (a key of the wrong type, say) is one element, and
// the commands after it still ran. Such an element is reported as an
// [*ExecError] naming the command.
//
// This package knows nothing about tasks; the engine's packages build on
// it. Package engine is the stable API of this module.
package txn
