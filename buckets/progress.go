package buckets

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// MaxProgressNote bounds a progress note, in bytes.
const MaxProgressNote = 256

// Progress is what a running handler last reported of its work: a number
// (its meaning is the handler's: a percentage, items done), a short note
// and when (Unix ms on the reporting worker's clock). It is stored apart
// from the record (Keys.Progress), so reporting it never races with the
// transactions that change the record.
type Progress struct {
	Value float64
	Note  string
	At    int64
}

// progressVersion is the first byte of a stored progress.
const progressVersion = 1

// Encode returns the stored form of p: the version byte, the uvarint of
// At, the 8 bytes of Value (IEEE 754, big-endian), then the note.
func (p Progress) Encode() []byte {
	b := make([]byte, 0, 1+binary.MaxVarintLen64+8+len(p.Note))
	b = append(b, progressVersion)
	b = binary.AppendUvarint(b, uint64(max(p.At, 0)))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(p.Value))
	return append(b, p.Note...)
}

// DecodeProgress parses a stored progress; anything Encode cannot have
// made (another version, a value that is not finite, a note too long or
// not UTF-8) is an error matching ErrMalformed.
func DecodeProgress(b []byte) (Progress, error) {
	if len(b) < 1 || b[0] != progressVersion {
		return Progress{}, fmt.Errorf("buckets: progress: unknown version: %w", ErrMalformed)
	}
	at, n := binary.Uvarint(b[1:])
	if n <= 0 || n != uvarintLen(at) || at > 1<<53 || len(b) < 1+n+8 {
		return Progress{}, fmt.Errorf("buckets: progress: truncated: %w", ErrMalformed)
	}
	rest := b[1+n:]
	v := math.Float64frombits(binary.BigEndian.Uint64(rest))
	note := rest[8:]
	if math.IsNaN(v) || math.IsInf(v, 0) || len(note) > MaxProgressNote || !utf8.Valid(note) {
		return Progress{}, fmt.Errorf("buckets: progress: bad value or note: %w", ErrMalformed)
	}
	return Progress{Value: v, Note: string(note), At: int64(at)}, nil
}

// ProgressWrite is one task's progress to store, for ttl seconds.
type ProgressWrite struct {
	ID       string
	Progress Progress
	TTL      int64
}

// SetProgresses stores the progress of several tasks, each for its ttl
// seconds (at least 1): one SETEX each, pipelined in one round trip, no
// transaction (each is one key, and nothing else depends on it). A full
// Redis refuses them.
func (s *Store) SetProgresses(ctx context.Context, conn redis.Conn, ws []ProgressWrite) error {
	cmds := make([]txn.Cmd, len(ws))
	for i, w := range ws {
		cmds[i] = txn.Cmd{Name: "SETEX", Args: []interface{}{s.Keys.Progress(w.ID), max(w.TTL, 1), w.Progress.Encode()}}
	}
	reps, err := pipeline(ctx, conn, cmds)
	if err == nil {
		for _, rep := range reps {
			if e := asError(rep); e != nil {
				err = e
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("buckets: progress of %d tasks: %w", len(ws), err)
	}
	return nil
}

// Progresses reads the progress of each of ids (one MGET); nil where a
// task has none or it cannot be read.
func (s *Store) Progresses(ctx context.Context, conn redis.Conn, ids []string) ([]*Progress, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	args := make([]interface{}, len(ids))
	for i, id := range ids {
		args[i] = s.Keys.Progress(id)
	}
	raws, err := redis.ByteSlices(do(ctx, conn, "MGET", args...))
	if err != nil {
		return nil, fmt.Errorf("buckets: read progress: %w", err)
	}
	out := make([]*Progress, len(ids))
	for i, raw := range raws {
		if raw == nil {
			continue
		}
		if p, err := DecodeProgress(raw); err == nil {
			out[i] = &p
		}
	}
	return out, nil
}
