// Package buckets knows the engine's Redis key schema and sends every
// command that touches those keys: enqueueing into per-timestamp bucket
// lists, moving due buckets to ready lists, claiming, acknowledging,
// retrying, recovering and dead-lettering tasks. Each operation that
// changes more than one key is one MULTI/EXEC (package txn), WATCHing what
// it reads first; each carries a comment that lists what it watches, what
// it queues and what a crash between any two of its steps leaves behind.
//
// Only Redis 2.4 commands and argument forms are used. The schema is
// described in docs/design.md; [Keys] is the one place that formats a key.
//
// Package engine is the stable API of this module; this package may change
// with it.
package buckets
