package buckets

import (
	"context"
	"fmt"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// DueBuckets returns up to limit index members whose bucket time is at or
// before now (Unix ms, the dispatcher's clock), earliest first:
// ZRANGEBYSCORE sched -inf now LIMIT 0 limit. It reads outside any
// transaction: Move watches the buckets themselves.
func (s *Store) DueBuckets(conn redis.Conn, now int64, limit int) ([]string, error) {
	ms, err := redis.Strings(conn.Do("ZRANGEBYSCORE", s.Keys.Schedule(), "-inf", now, "LIMIT", 0, limit))
	if err != nil {
		return nil, fmt.Errorf("buckets: due buckets: %w", err)
	}
	return ms, nil
}

// NextDue returns the earliest bucket time in the index (ZRANGE sched 0 0
// WITHSCORES), and false when the index is empty.
func (s *Store) NextDue(conn redis.Conn) (int64, bool, error) {
	rep, err := redis.Values(conn.Do("ZRANGE", s.Keys.Schedule(), 0, 0, "WITHSCORES"))
	if err != nil {
		return 0, false, fmt.Errorf("buckets: next due: %w", err)
	}
	if len(rep) < 2 {
		return 0, false, nil
	}
	f, err := redis.Float64(rep[1], nil)
	if err != nil {
		return 0, false, fmt.Errorf("buckets: next due score: %w", err)
	}
	return int64(f), true, nil
}

// MoveResult says what one Move did.
type MoveResult struct {
	Tasks       int      // task ids made ready
	Buckets     int      // buckets emptied and removed from the index
	Partial     bool     // a bucket was larger than its share and was moved in part
	Stale       int      // index members whose bucket was missing or empty, removed
	Quarantined []string // keys of the wrong type renamed under bad:
}

// Move moves the buckets named by members (as DueBuckets returns them) to
// their queues' ready lists in one optimistic transaction, at most
// maxTasks ids in all. A bucket larger than its share moves in part; the
// rest stays in the bucket and in the index for the next call.
//
// WATCH   b:<q>:<ts> ...                 every bucket named
// read    LRANGE b 0 share (pipelined), TYPE q:<q> per queue
// queue   LPUSH q:<q> ids..., LPUSH/LTRIM n:<q>  (per queue, bucket order kept)
//
//	HINCRBY st:<q> scheduled -n
//	DEL b ...; ZREM sched member ...      (buckets taken whole)
//	LTRIM b n -1                          (a bucket taken in part)
//	RENAME key bad:key; ZREM              (a key of the wrong type)
//
// Why it is exact: any push into a watched bucket (a producer whose clock
// is behind ours, say) or another dispatcher's move of it makes EXEC
// answer nil, and the read is done again. The index is not watched: a
// producer adding a member for a new bucket does not conflict, and the
// member removal names only the buckets taken whole, so a bucket added
// meanwhile keeps its index entry. A crash anywhere before EXEC leaves
// everything in its bucket; EXEC applies all of it.
func (s *Store) Move(ctx context.Context, conn redis.Conn, members []string, maxTasks int) (MoveResult, error) {
	type bucket struct {
		member string
		q      string
		key    string
	}
	var (
		bs      []bucket
		badMems []interface{}
	)
	for _, m := range members {
		q, ts, err := ParseMember(m)
		if err != nil {
			badMems = append(badMems, m)
			continue
		}
		bs = append(bs, bucket{member: m, q: q, key: s.Keys.Bucket(q, ts)})
	}
	watch := make([]string, len(bs))
	for i, b := range bs {
		watch[i] = b.key
	}
	share := max(1, maxTasks/max(1, len(bs)))
	var res MoveResult
	_, err := s.runner().Run(ctx, conn, watch, func(tx *txn.Tx) error {
		res = MoveResult{Stale: len(badMems)}
		var queues []string
		seen := map[string]bool{}
		for _, b := range bs {
			if err := tx.Send("LRANGE", b.key, 0, share); err != nil {
				return err
			}
			if !seen[b.q] {
				seen[b.q] = true
				queues = append(queues, b.q)
			}
		}
		for _, q := range queues {
			if err := tx.Send("TYPE", s.Keys.Ready(q)); err != nil {
				return err
			}
		}
		reps, err := tx.Flush()
		if err != nil {
			return err
		}
		for i, q := range queues {
			t, _ := redis.String(reps[len(bs)+i], nil)
			if t != "list" && t != "none" {
				key := s.Keys.Ready(q)
				tx.Queue("RENAME", key, s.Keys.Quarantine(key))
				res.Quarantined = append(res.Quarantined, key)
			}
		}
		ready := map[string][]string{}
		var del, zrem []interface{}
		zrem = append(zrem, s.Keys.Schedule())
		zrem = append(zrem, badMems...)
		for i, b := range bs {
			ids, err := redis.Strings(reps[i], nil)
			if err != nil {
				// Not a list: set it aside so that it stops hiding
				// the buckets behind it.
				tx.Queue("RENAME", b.key, s.Keys.Quarantine(b.key))
				zrem = append(zrem, b.member)
				res.Quarantined = append(res.Quarantined, b.key)
				continue
			}
			if len(ids) == 0 {
				zrem = append(zrem, b.member)
				res.Stale++
				continue
			}
			if len(ids) > share {
				ids = ids[:share]
				tx.Queue("LTRIM", b.key, share, -1)
				res.Partial = true
			} else {
				del = append(del, b.key)
				zrem = append(zrem, b.member)
				res.Buckets++
			}
			ready[b.q] = append(ready[b.q], ids...)
			res.Tasks += len(ids)
		}
		for _, q := range queues {
			if ids := ready[q]; len(ids) > 0 {
				s.pushReady(tx, q, ids, false)
				tx.Queue("HINCRBY", s.Keys.Stats(q), StatScheduled, -len(ids))
			}
		}
		if len(del) > 0 {
			tx.Queue("DEL", del...)
		}
		if len(zrem) > 1 {
			tx.Queue("ZREM", zrem...)
		}
		return nil
	})
	if err != nil {
		return MoveResult{}, fmt.Errorf("buckets: move %d buckets: %w", len(members), err)
	}
	return res, nil
}
