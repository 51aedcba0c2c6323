package buckets

import (
	"context"
	"errors"
	"fmt"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// holds reports whether a task record in state r holds its unique key:
// while it can still run.
func (r *Record) holds() bool {
	return r.Unique != "" && (r.State == StateWaiting || r.State == StateRetry || r.State == StateRunning)
}

// uniqueKeys lists the u: keys of recs, refusing two tasks of the batch
// with one key.
func (s *Store) uniqueKeys(recs []*Record) (keys []string, holders []*Record, err error) {
	seen := map[string]string{}
	for _, r := range recs {
		if r.Unique == "" {
			continue
		}
		if id, dup := seen[r.Unique]; dup {
			return nil, nil, &DuplicateError{Key: r.Unique, ID: id}
		}
		seen[r.Unique] = r.ID
		keys = append(keys, s.Keys.Unique(r.Unique))
		holders = append(holders, r)
	}
	return keys, holders, nil
}

// checkUnique runs inside Enqueue's transaction, with the u: keys of
// recs watched: it reads who holds each (GET u:<key>, pipelined), then
// watches those tasks' records and reads them (GET t:<holder>,
// pipelined). A key names a holder only while that record is waiting,
// retrying or running and carries the key; then it returns a
// *DuplicateError and Enqueue writes nothing. Otherwise Enqueue queues
// takeUnique.
func (s *Store) checkUnique(tx *txn.Tx, keys []string, recs []*Record) error {
	if len(keys) == 0 {
		return nil
	}
	reps, err := getAll(tx, keys)
	if err != nil {
		return err
	}
	var (
		holders []string
		of      []int
	)
	for i, rep := range reps {
		if e := asError(rep); e != nil {
			return fmt.Errorf("GET %s: %w", keys[i], e)
		}
		if b, ok := rep.([]byte); ok && len(b) > 0 {
			holders = append(holders, string(b))
			of = append(of, i)
		}
	}
	if len(holders) > 0 {
		tkeys := s.Keys.Tasks(holders)
		recReps, err := watchGetAll(tx, tkeys)
		if err != nil {
			return err
		}
		for j, rep := range recReps {
			if e := asError(rep); e != nil && !IsWrongType(e) {
				return fmt.Errorf("GET %s: %w", tkeys[j], e)
			}
			raw, _ := rep.([]byte)
			if raw == nil {
				continue // no record (or not a string): holds nothing
			}
			h, derr := DecodeRecord(holders[j], raw)
			if derr != nil {
				continue // a record that cannot run holds nothing
			}
			r := recs[of[j]]
			if h.holds() && h.Unique == r.Unique {
				return &DuplicateError{Key: r.Unique, ID: h.ID}
			}
		}
	}
	return nil
}

// takeUnique queues the taking of every key: SET u:<key> <id>, and
// EXPIRE u:<key> ttl when the task has one.
func (s *Store) takeUnique(tx queuer, keys []string, recs []*Record) {
	for i, r := range recs {
		tx.Queue("SET", keys[i], r.ID)
		if r.UniqueTTL > 0 {
			tx.Queue("EXPIRE", keys[i], r.UniqueTTL)
		}
	}
}

// UniqueHolder returns the id of the task holding unique key key, or ""
// when it is free (its holder ended, or the key expired or was never
// taken). It reads without a transaction: two reads, whose answer may be
// stale by the time it arrives.
func (s *Store) UniqueHolder(ctx context.Context, conn redis.Conn, key string) (string, error) {
	id, err := redis.String(do(ctx, conn, "GET", s.Keys.Unique(key)))
	if errors.Is(err, redis.ErrNil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("buckets: unique key %q: %w", key, err)
	}
	raw, err := redis.Bytes(do(ctx, conn, "GET", s.Keys.Task(id)))
	if errors.Is(err, redis.ErrNil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("buckets: unique key %q: holder %s: %w", key, id, err)
	}
	r, err := DecodeRecord(id, raw)
	if err != nil || !r.holds() || r.Unique != key {
		return "", nil
	}
	return id, nil
}

// uniqueFree reads, in a transaction, whether r's unique key is free or
// already r's own: WATCH u:<key>; GET; WATCH t:<holder>; GET.
func (s *Store) uniqueFree(tx *txn.Tx, r *Record) (bool, error) {
	k := s.Keys.Unique(r.Unique)
	if err := tx.Watch(k); err != nil {
		return false, err
	}
	id, err := redis.String(tx.Do("GET", k))
	if errors.Is(err, redis.ErrNil) || (err == nil && id == r.ID) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("GET %s: %w", k, err)
	}
	if err := tx.Watch(s.Keys.Task(id)); err != nil {
		return false, err
	}
	raw, err := redis.Bytes(tx.Do("GET", s.Keys.Task(id)))
	if errors.Is(err, redis.ErrNil) || IsWrongType(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	h, derr := DecodeRecord(id, raw)
	return derr != nil || !h.holds() || h.Unique != r.Unique, nil
}
