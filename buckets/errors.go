package buckets

import (
	"errors"
	"fmt"
)

// Sentinel errors. Package engine translates them into its own.
var (
	// ErrMalformed: a task record, id or index member that cannot be
	// decoded (DecodeRecord, ParseMember).
	ErrMalformed = errors.New("buckets: malformed data")
	// ErrInvalid: a namespace or queue name outside 1-64 of
	// A-Z a-z 0-9 _ . - (NewKeys, Record.Validate).
	ErrInvalid = errors.New("invalid name")
	// ErrNotFound: no task record with that id (Cancel, Lookup, dead-letter
	// operations).
	ErrNotFound = errors.New("task not found")
	// ErrAlreadyRunning: Cancel of a task a worker has started.
	ErrAlreadyRunning = errors.New("task is already running")
	// ErrAlreadyDone: Cancel of a task that finished, died or was
	// cancelled.
	ErrAlreadyDone = errors.New("task is already done")
	// ErrNotDead: a dead-letter operation on a task that is not dead.
	ErrNotDead = errors.New("task is not dead")
	// ErrLeaseLost: a worker acknowledged or failed a task that is no
	// longer its own (its lease ran out and it was recovered elsewhere).
	ErrLeaseLost = errors.New("task lease lost")
	// ErrTooLarge: an encoded task over the size limit (Record.Validate).
	ErrTooLarge = errors.New("task too large")
	// ErrExists: Enqueue named ids that have records (an *ExistsError
	// lists them); nothing was written.
	ErrExists = errors.New("task id exists")
	// ErrUncertain: Enqueue's connection failed after MULTI/EXEC was sent:
	// the tasks may or may not be written.
	ErrUncertain = errors.New("outcome unknown")
)

// ErrReserved: Enqueue named, as a chosen id, the id of a step or member
// of a workflow that exists (a *ReservedError names it); nothing was
// written.
var ErrReserved = errors.New("task id reserved")

// ReservedError is Enqueue's error when a chosen id is "<flow>~<i>" and
// workflow <flow> exists: the id is that workflow's, written by the
// workflow itself. It matches ErrReserved.
type ReservedError struct {
	ID   string // the id given
	Flow string // the workflow it belongs to
}

func (e *ReservedError) Error() string {
	return fmt.Sprintf("task id %q is reserved: it names a task of workflow %q", e.ID, e.Flow)
}

// Is reports whether target is ErrReserved.
func (e *ReservedError) Is(target error) bool { return target == ErrReserved }

// ExistsError is Enqueue's error when ids it was to write have records
// already; nothing was written. It matches ErrExists.
type ExistsError struct {
	IDs []string // the ids found, in the order given
}

func (e *ExistsError) Error() string { return fmt.Sprintf("task ids %q exist", e.IDs) }

// Is reports whether target is ErrExists.
func (e *ExistsError) Is(target error) bool { return target == ErrExists }

// ErrDuplicate: Enqueue of a task whose unique key is held by another
// task that can still run (a *DuplicateError names it); nothing was
// written.
var ErrDuplicate = errors.New("unique key held")

// DuplicateError is Enqueue's error when a task's unique key is held by a
// task that is waiting, retrying or running (or by another task of the
// same batch); nothing was written. It matches ErrDuplicate.
type DuplicateError struct {
	Key string // the unique key, as in Record.Unique
	ID  string // the task holding it
}

func (e *DuplicateError) Error() string {
	return fmt.Sprintf("unique key %q held by task %s", e.Key, e.ID)
}

// Is reports whether target is ErrDuplicate.
func (e *DuplicateError) Is(target error) bool { return target == ErrDuplicate }
