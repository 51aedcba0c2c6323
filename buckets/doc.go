// Package buckets is the storage layer of package engine: it knows the
// engine's Redis key schema and sends every command that touches those
// keys: enqueueing into per-timestamp bucket lists, moving due buckets to
// ready lists, claiming, acknowledging, retrying, recovering and
// dead-lettering tasks.
//
// It is for package engine, not a stable API: it exports what engine
// needs and changes with it. Programs use package engine; programs that
// want optimistic transactions on old Redis for their own keys use
// package txn.
//
// Each operation that changes more than one key is one MULTI/EXEC built
// on package txn (plain, pipelined or under a held watch); this package
// never sends WATCH, MULTI or EXEC itself. Each carries a comment that
// lists what it watches, what it queues and what a crash between any two
// of its steps leaves behind. Every method that talks to Redis takes a
// context first, which bounds each of its round trips.
//
// Only Redis 2.4 commands and argument forms are used. The schema is
// described in docs/design.md; [Keys] is the one place that formats a key.
//
// A task record has one encoding ([Record.Encode], [DecodeRecord]), and a
// task alone in its bucket is scheduled by an index entry that names it
// (an inline entry, [InlineMember]); both are the format, not options. A
// record starts with the magic byte 'B' and the version byte 4: a later
// release that changes the encoding recognises a record of this one by
// those two bytes, and DecodeRecord refuses a record of any other version
// with an error naming that version (wrapping [ErrMalformed], so that a
// worker buries it as undecodable).
package buckets
