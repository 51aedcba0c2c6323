package txn

import (
	"errors"
	"fmt"
)

// ErrConflict means that a watched key changed before EXEC, so nothing was
// written. [Runner.Run] retries a conflict and returns an error wrapping
// ErrConflict only when its attempts are used up; [Held.Exec] and the
// steps of [Runner.Pipeline] return it at once, and the caller decides
// whether to start again.
var ErrConflict = errors.New("txn: a watched key changed before EXEC")

// ErrNotRun marks an error after which the server is known to have run
// none of the commands it was sent, writes included: a Redis Cluster
// redirection (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) or a write refused
// because the server is no longer a master. Connections that route
// requests to a cluster or a replicated set (package topology) wrap such
// errors with it. [Runner.Run] runs the whole attempt again after one, as
// after a conflict, on the same connection, which sends it where it now
// belongs; Pipeline steps and held transactions return it to the caller.
var ErrNotRun = errors.New("txn: the server ran none of the request")

// ErrNotHeld is returned by [Held.Exec] for a Held whose transaction did
// not commit, or that was already used or released.
var ErrNotHeld = errors.New("txn: no watch is held")

// ExecError reports a command of a transaction that failed: one refused
// while queueing (Queued true: nothing of the transaction was written) or
// one that failed inside EXEC (the other commands still ran).
type ExecError struct {
	Index   int    // position of the command among the queued ones, from 0
	Command string // the command's name
	Queued  bool   // refused while queueing rather than failed inside EXEC
	Err     error  // the server's error reply
	// Commands are every command the transaction queued, in order, so
	// that a caller can repair what failed (the replies come with the
	// error: element i answers Commands[i]).
	Commands []Cmd
}

func (e *ExecError) Error() string {
	when := "inside EXEC"
	if e.Queued {
		when = "while queueing"
	}
	return fmt.Sprintf("txn: command %d (%s) failed %s: %v", e.Index, e.Command, when, e.Err)
}

// Unwrap returns the server's error.
func (e *ExecError) Unwrap() error { return e.Err }
