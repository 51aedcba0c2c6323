package buckets

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// CompactVersion is the storage version a namespace's format mark
// (Keys.Format) holds once every process on it reads compact storage:
// version 4 task records and inline entries.
const CompactVersion = 4

// FormatRecheck is how often a store that follows the format mark
// (Store.Auto) and found none looks for it again, unless its
// FormatRecheck says otherwise: an operator sets the mark with `engine
// storage compact` once every process runs this release.
const FormatRecheck = time.Minute

// FormatLookTimeout bounds one look at the format mark within the
// caller's deadline: a look that cannot be answered (no master, a
// failover) must not take the time of the enqueue or heartbeat it comes
// before. A look that fails is tried again after the recheck interval.
const FormatLookTimeout = time.Second

// What a store that follows the format mark (Store.Auto) knows of it.
const (
	formatUnknown int32 = iota // not read yet, or the last read failed
	formatLegacy               // the namespace is in use and not marked
	formatCompact              // marked, or new and marked by this store
)

// formatRecheck is the store's interval between looks at an unmarked
// namespace.
func (s *Store) formatRecheck() time.Duration {
	if s.FormatRecheck > 0 {
		return s.FormatRecheck
	}
	return FormatRecheck
}

// compact reports whether the store writes version 4 records.
func (s *Store) compact() bool {
	return s.Compact || s.Auto && s.format.Load() == formatCompact || compactRecords.Load()
}

// inlines reports whether the store schedules inline entries.
func (s *Store) inlines() bool {
	return s.Inline || s.Auto && s.format.Load() == formatCompact
}

// WritesCompact reports whether the store writes compact storage now
// (Compact, or Auto and the namespace's mark allows it).
func (s *Store) WritesCompact() bool { return s.compact() }

// ResolveFormat decides, for a store that follows the namespace's format
// mark (Store.Auto), whether it writes compact storage, and reports
// whether it does. A store that does not follow the mark reports its
// Compact setting and sends nothing. Until it has an answer the store
// writes what every release reads, so a failure here costs memory, never
// a task; the caller may log the error and go on.
//
// It sends nothing once the store writes compact storage, nor within
// its recheck interval (Store.FormatRecheck) of its last look; a look takes
// at most FormatLookTimeout.
// The first look is one transaction:
//
//	watch   format queues w sched dead periodic
//	read    GET format; EXISTS queues; EXISTS w; EXISTS sched;
//	        EXISTS dead; EXISTS periodic
//	queue   SET format 4        (no mark, and none of the others exists)
//
// A namespace none of whose lasting keys exists is new: no process has
// enqueued to it (the set of queues keeps every queue ever enqueued to)
// or registered a worker, so no process of an earlier release works on
// it, and this store marks it. A namespace in use without the mark keeps
// the storage every release reads until an operator marks it (MarkFormat).
// A crash before EXEC writes nothing; after it, the mark stands, which is
// what the next look would have written. Later looks, while the
// namespace is not marked, are one GET.
func (s *Store) ResolveFormat(ctx context.Context, conn redis.Conn) (bool, error) {
	if !s.Auto || s.format.Load() == formatCompact {
		return s.compact(), nil
	}
	now := time.Now().UnixNano()
	next := s.formatNext.Load()
	if now < next || !s.formatNext.CompareAndSwap(next, now+int64(s.formatRecheck())) {
		return false, nil // looked lately, or another caller is looking now
	}
	ctx, cancel := context.WithTimeout(ctx, FormatLookTimeout)
	defer cancel()
	if s.format.Load() == formatLegacy {
		m, err := s.ReadFormat(ctx, conn)
		if err != nil {
			return false, err
		}
		return s.judgeFormat(m)
	}
	k := s.Keys
	lasting := []string{k.Queues(), k.Workers(), k.Schedule(), k.Dead(), k.Periodics()}
	var (
		m     FormatMark
		inUse bool // no mark, and one of lasting exists: earlier releases may work on it
	)
	_, err := s.runner.Run(ctx, conn, append([]string{k.Format()}, lasting...), func(tx *txn.Tx) error {
		m, inUse = FormatMark{}, false
		_ = tx.Send("GET", k.Format())
		for _, key := range lasting {
			_ = tx.Send("EXISTS", key)
		}
		reps, err := tx.Flush()
		if err != nil {
			return err
		}
		if e, ok := reps[0].(redis.Error); ok {
			return e
		}
		if reps[0] != nil {
			v, err := redis.String(reps[0], nil)
			m = parseFormat(v)
			return err
		}
		for _, r := range reps[1:] {
			if n, _ := redis.Int(r, nil); n != 0 {
				inUse = true
				return nil
			}
		}
		m = FormatMark{Version: CompactVersion, Set: true}
		tx.Queue("SET", k.Format(), strconv.Itoa(CompactVersion))
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("buckets: read the format mark %s: %w", k.Format(), err)
	}
	if inUse {
		s.format.Store(formatLegacy)
		return false, nil
	}
	return s.judgeFormat(m)
}

// judgeFormat applies a format mark read from the namespace: an absent
// or lower one keeps the storage every release reads, as does one that is
// not a version, which is an error naming it.
func (s *Store) judgeFormat(m FormatMark) (bool, error) {
	if m.Bad() {
		s.format.Store(formatLegacy)
		return false, fmt.Errorf("buckets: the format mark %s holds %q, not a storage version: writing the storage every release reads (`engine storage compact` sets it right)", s.Keys.Format(), m.Raw)
	}
	if m.Version < CompactVersion {
		s.format.Store(formatLegacy)
		return false, nil
	}
	s.format.Store(formatCompact)
	return true, nil
}

// FormatMark is what a namespace's format mark says.
type FormatMark struct {
	// Version is the storage version every process may write: 0 when
	// the namespace is not marked (the storage every release reads).
	Version int
	// Raw is the mark as stored, when it is not a version ("" otherwise).
	Raw string
	// Set: the mark exists.
	Set bool
}

// Bad reports a mark that exists and is not a version (Raw says what it
// holds).
func (m FormatMark) Bad() bool { return m.Set && m.Version == 0 }

// ReadFormat reads the namespace's format mark (one GET).
func (s *Store) ReadFormat(ctx context.Context, conn redis.Conn) (FormatMark, error) {
	v, err := redis.String(do(ctx, conn, "GET", s.Keys.Format()))
	if err == redis.ErrNil {
		return FormatMark{}, nil
	}
	if err != nil {
		return FormatMark{}, fmt.Errorf("buckets: read the format mark %s: %w", s.Keys.Format(), err)
	}
	return parseFormat(v), nil
}

// parseFormat reads a stored mark: a version from 1 up, or Raw.
func parseFormat(v string) FormatMark {
	if n, err := strconv.Atoi(v); err == nil && n >= 1 {
		return FormatMark{Version: n, Set: true}
	}
	return FormatMark{Raw: v, Set: true}
}

// MarkFormat sets the namespace's format mark: compact lets every store
// that follows it (Store.Auto) write compact storage, from its next look
// (within its recheck interval, Store.FormatRecheck); !compact removes the
// mark, so that stores started from then on write the storage every
// release reads (a running store that already writes compact storage goes
// on until it restarts).
// One SET or DEL.
func (s *Store) MarkFormat(ctx context.Context, conn redis.Conn, compact bool) error {
	var err error
	if compact {
		_, err = do(ctx, conn, "SET", s.Keys.Format(), strconv.Itoa(CompactVersion))
	} else {
		_, err = do(ctx, conn, "DEL", s.Keys.Format())
	}
	if err != nil {
		return fmt.Errorf("buckets: set the format mark %s: %w", s.Keys.Format(), err)
	}
	return nil
}
