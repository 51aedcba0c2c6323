package engine

import (
	"errors"

	"github.com/bucketq/bucketq/buckets"
)

// Sentinel errors; test for them with errors.Is.
var (
	// ErrNotFound: Cancel, Lookup or a dead-letter call named a task that
	// does not exist (never did, or its record expired).
	ErrNotFound = buckets.ErrNotFound
	// ErrAlreadyRunning: Cancel of a task a worker has started.
	ErrAlreadyRunning = buckets.ErrAlreadyRunning
	// ErrAlreadyDone: Cancel of a task that succeeded, died or was
	// cancelled already.
	ErrAlreadyDone = buckets.ErrAlreadyDone
	// ErrNotDead: RetryDead or PurgeDead named a task that is not a dead
	// letter.
	ErrNotDead = buckets.ErrNotDead
	// ErrPayloadTooLarge: Enqueue with a payload over Config.MaxPayload.
	ErrPayloadTooLarge = buckets.ErrTooLarge
	// ErrInvalidName: an empty or malformed queue name or task type, or a
	// bad namespace.
	ErrInvalidName = buckets.ErrInvalidName
	// ErrInvalidOption: an Enqueue option or a Config field out of range.
	ErrInvalidOption = errors.New("engine: invalid option")
	// ErrNoHandler: a Mux has no handler for the task's type. Workers
	// retry such tasks or send them to the dead letters, per
	// Config.UnknownType.
	ErrNoHandler = errors.New("engine: no handler for task type")
	// ErrClosed: the Server or Worker was shut down already.
	ErrClosed = errors.New("engine: closed")
	// ErrLeaseLost: a worker finished a task that had been recovered
	// elsewhere after its lease ran out; the result was not recorded.
	ErrLeaseLost = buckets.ErrLeaseLost
)
