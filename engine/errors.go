package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/txn"
)

// Sentinel errors; test for them with errors.Is. They are the engine's
// own values: errors of the layers below are translated at the boundary,
// so a caller needs no other package to recognise a refusal.
var (
	// ErrNotFound: Cancel, Lookup or a dead-letter call named a task that
	// does not exist (never did, or its record expired).
	ErrNotFound = errors.New("engine: task not found")
	// ErrAlreadyRunning: Cancel of a task a worker has started.
	ErrAlreadyRunning = errors.New("engine: task already running")
	// ErrAlreadyDone: Cancel of a task that succeeded, died or was
	// cancelled already.
	ErrAlreadyDone = errors.New("engine: task already finished")
	// ErrTooLarge: something over its size limit: a payload over
	// Config.MaxPayload, a batch of several tasks over 4 MiB, a result over
	// Config.MaxResult (SetResult; nothing is recorded, and returning the
	// error fails the run), a chain of more than 64 steps or a group of
	// more than 1,000 members. Nothing was written.
	ErrTooLarge = errors.New("engine: too large")
	// ErrInvalid: an argument no call accepts: an empty or malformed
	// queue name, task type, namespace or task id (not 1 to 128
	// printable ASCII bytes without spaces), or an option or Config field
	// out of range. Nothing was written. Cancel's and Lookup's errors for
	// a malformed id also match ErrNotFound (no task can have it).
	ErrInvalid = errors.New("engine: invalid argument")
	// ErrTaskExists: Enqueue or EnqueueBatch named, with TaskID, an id
	// that is taken; nothing was written. The error is a
	// *ExistsError listing the ids. An id stays taken while its
	// record exists: until Config.DoneRetention after the task succeeded
	// or was cancelled, until Config.DeadRetention (or ActionDelete) after
	// it died, and for as long as it waits or runs.
	ErrTaskExists = errors.New("engine: task id already exists")
	// ErrUncertain: the connection failed after the write was sent, so
	// it may or may not have happened. Retry with the same TaskID: if the
	// first try was written the retry returns ErrTaskExists, otherwise it
	// writes the task; either way there is exactly one. (Without TaskID a
	// retry may enqueue the task twice, never zero times.)
	ErrUncertain = errors.New("engine: outcome unknown, the connection failed after the write was sent")
	// ErrNoHandler: a Mux has no handler for the task's type. Workers
	// retry such tasks or send them to the dead letters, per
	// Config.UnknownType.
	ErrNoHandler = errors.New("engine: no handler for task type")
	// ErrClosed: the Server was shut down already.
	ErrClosed = errors.New("engine: closed")
	// ErrFull: Redis refused the write because its memory is at
	// maxmemory; nothing was written. Retry later (the same TaskID keeps
	// it to one task); the engine's own parts back off and resume by
	// themselves once memory is freed.
	ErrFull = errors.New("engine: Redis is out of memory (maxmemory); nothing was written")
	// ErrEviction: Server.Run refused to start because Redis may evict
	// any key when full (an allkeys-* maxmemory-policy with a limit set),
	// task records included. See Config.AllowEviction.
	ErrEviction = errors.New("engine: Redis may evict task records")
)

// ExistsError is the error of an Enqueue refused because what it names is
// taken; nothing was written. Without Key, its TaskID ids exist (some of
// them, for a batch) and errors.Is(err, ErrTaskExists) holds; with Key,
// the unique key (Unique, UniqueKey) is held by the task IDs[0] and
// errors.Is(err, ErrDuplicate) holds.
type ExistsError struct {
	IDs []string // the ids that exist, in the order given; or the key's holder
	Key string   // the unique key: "d:<digest>" for Unique, "k:<key>" for UniqueKey
}

func (e *ExistsError) Error() string {
	if e.Key != "" && len(e.IDs) == 1 {
		return fmt.Sprintf("engine: unique key %q is held by task %s; nothing was enqueued", e.Key, e.IDs[0])
	}
	if len(e.IDs) == 1 {
		return fmt.Sprintf("engine: task id %q already exists; nothing was enqueued", e.IDs[0])
	}
	return fmt.Sprintf("engine: task ids %q already exist; nothing was enqueued", e.IDs)
}

// Is reports whether target is ErrTaskExists (no Key) or ErrDuplicate
// (a Key).
func (e *ExistsError) Is(target error) bool {
	if e.Key != "" {
		return target == ErrDuplicate
	}
	return target == ErrTaskExists
}

// engineError is an error the engine reports: its own message, the
// engine sentinel it matches (if any), and the error underneath (for
// errors.Is/As on context and network errors; not part of the message).
type engineError struct {
	msg   string
	kind  error
	cause error
}

func (e *engineError) Error() string        { return e.msg }
func (e *engineError) Is(target error) bool { return e.kind != nil && target == e.kind }
func (e *engineError) Unwrap() error        { return e.cause }

// storeKinds maps the store's sentinels to the engine's.
var storeKinds = []struct{ from, to error }{
	{buckets.ErrNotFound, ErrNotFound},
	{buckets.ErrAlreadyRunning, ErrAlreadyRunning},
	{buckets.ErrAlreadyDone, ErrAlreadyDone},
	{buckets.ErrTooLarge, ErrTooLarge},
	{buckets.ErrInvalid, ErrInvalid},
	{buckets.ErrExists, ErrTaskExists},
	{buckets.ErrReserved, ErrInvalid},
	{buckets.ErrUncertain, ErrUncertain},
	{txn.ErrFull, ErrFull},
}

func kindOf(err error) error {
	for _, k := range storeKinds {
		if errors.Is(err, k.from) {
			return k.to
		}
	}
	return nil
}

// failed reports that op failed because of err, an error of the store or
// the connection: "engine: <op>: <what went wrong>", matching the engine
// sentinel for err and, through Unwrap, err itself (so a context's or the
// network's error is still recognised). What went wrong is told without
// the inner layers' names.
func failed(op string, err error) error {
	if err == nil {
		return nil
	}
	var ee *engineError
	var xe *ExistsError
	if errors.As(err, &ee) || errors.As(err, &xe) {
		return err
	}
	kind := kindOf(err)
	why := stripLayers(err.Error())
	switch {
	case errors.Is(err, buckets.ErrUncertain):
		why = "the connection failed after the write was sent, so it may or may not have happened (retry with the same TaskID): " + rootCause(err)
	case errors.Is(err, buckets.ErrMalformed):
		why = "malformed data in Redis: " + why
	}
	return &engineError{msg: "engine: " + op + ": " + why, kind: kind, cause: err}
}

// refused reports a refusal in a sentence of its own, matching kind.
func refused(kind, cause error, format string, args ...any) error {
	return &engineError{msg: "engine: " + fmt.Sprintf(format, args...), kind: kind, cause: cause}
}

// rootCause is the message of the innermost error err wraps (the
// network's or the server's own words), or a context's.
func rootCause(err error) string {
	for _, c := range []error{context.DeadlineExceeded, context.Canceled} {
		if errors.Is(err, c) {
			return c.Error()
		}
	}
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err.Error()
		}
		err = next
	}
}

// stripLayers removes the inner packages' prefixes from a message.
func stripLayers(s string) string {
	for _, p := range []string{"buckets: ", "txn: "} {
		s = strings.ReplaceAll(s, p, "")
	}
	return s
}
