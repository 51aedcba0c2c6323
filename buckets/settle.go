package buckets

import (
	"context"
	"errors"
	"fmt"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// SettleResult says what settling an uncertain move did.
type SettleResult struct {
	Pushed   int      // ids placed in a ready list again
	SetAside []string // ready lists of the wrong type renamed under bad:
}

// SettleMove completes a move whose EXEC may have run unseen (see
// MoveResult.Uncertain): Redis has no rollback, so if its push into a
// ready list failed on a key of the wrong type (written between the
// move's TYPE read and its EXEC) while its DEL/LTRIM of the buckets ran,
// its tasks are in no list. Run it on a connection other than the one
// that failed. One optimistic transaction:
//
//	WATCH   b:<q>:<ts> ... q:<q> ...        the move's buckets (the guards of
//	                                        inline entries), ready lists
//	read    LRANGE b 0 n-1 per bucket (n ids the move took from it; ZSCORE
//	        sched entry for an inline entry),
//	        TYPE q:<q>, EXISTS bad:q:<q> per queue, GET t:<id> per id
//	queue   per queue whose ready list is not a list now, or was set
//	        aside (its quarantine key exists: it was not a list recently,
//	        so the push may have failed), for the ids of the buckets that
//	        no longer begin with them (the EXEC ran) and whose record is
//	        waiting or retrying (or malformed, or of the wrong type:
//	        Claim buries those with the reason, as after a move):
//	        RENAME q:<q> bad:q:<q> (not a list)
//	        LPUSH q:<q> ids...; LPUSH n:<q> tokens; LTRIM n:<q>
//
// A bucket that still begins with the ids the move took was not moved:
// the next round moves it. A ready list that is a list with no quarantine
// key took the push. Either way nothing is written.
//
// The ids may be in the ready list already (the push did succeed, before
// the list was made a non-list, or another dispatcher moved the buckets
// after our EXEC failed to arrive): a duplicate is harmless, as Claim takes
// only a waiting or retrying record, so the second copy finds it running
// or finished and is dropped. The rare exception: if the first copy ran
// and failed, its record is retrying and due later, and the second copy
// makes it run before its due time (early, never lost; Claim does not
// check Due, since a task made ready early on purpose, by RetryNow say,
// keeps its old Due).
//
// An error reply to any of the reads (a server still loading after a
// restart answers LOADING) ends the settle with nothing written: it
// tells nothing of a list's type or a record's state (settleReadError).
//
// The records are not watched: a record that leaves waiting meanwhile
// (cancelled, claimed from a copy) is dropped by Claim, and one that
// becomes waiting again was placed by whoever changed it. A crash before
// EXEC leaves the tasks homeless, as the lost move did: `engine check
// --repair` finds their records waiting in no list and places them.
func (s *Store) SettleMove(ctx context.Context, conn redis.Conn, u UncertainMove) (SettleResult, error) {
	var queues []string
	seenQ := map[string]bool{}
	var watch []string
	var ids []string
	for _, b := range u.Buckets {
		watch = append(watch, b.Key)
		if !seenQ[b.Queue] {
			seenQ[b.Queue] = true
			queues = append(queues, b.Queue)
		}
		ids = append(ids, b.IDs...)
	}
	for _, q := range queues {
		watch = append(watch, s.Keys.Ready(q))
	}
	var res SettleResult
	_, err := s.runner.Run(ctx, conn, watch, func(tx *txn.Tx) error {
		res = SettleResult{}
		for _, b := range u.Buckets {
			if b.Inline {
				if err := tx.Send("ZSCORE", s.Keys.Schedule(), b.Member); err != nil {
					return err
				}
				continue
			}
			if err := tx.Send("LRANGE", b.Key, 0, len(b.IDs)-1); err != nil {
				return err
			}
		}
		for _, q := range queues {
			if err := tx.Send("TYPE", s.Keys.Ready(q)); err != nil {
				return err
			}
			if err := tx.Send("EXISTS", s.Keys.Quarantine(s.Keys.Ready(q))); err != nil {
				return err
			}
		}
		for _, id := range ids {
			if err := tx.Send("GET", s.Keys.Task(id)); err != nil {
				return err
			}
		}
		reps, err := tx.Flush()
		if err != nil {
			return err
		}
		nb, nq := len(u.Buckets), len(queues)
		if len(reps) != nb+2*nq+len(ids) {
			return fmt.Errorf("%d replies to %d reads", len(reps), nb+2*nq+len(ids))
		}
		if err := settleReadError(reps[nb:], 2*nq); err != nil {
			return err
		}
		typ := map[string]string{}
		suspect := map[string]bool{}
		for i, q := range queues {
			t, _ := redis.String(reps[nb+2*i], nil)
			bad, _ := redis.Int(reps[nb+2*i+1], nil)
			typ[q] = t
			suspect[q] = (t != "list" && t != "none") || bad == 1
		}
		recs := reps[nb+2*nq:]
		push := map[string][]string{}
		j := 0
		for i, b := range u.Buckets {
			r := recs[j : j+len(b.IDs)]
			j += len(b.IDs)
			if !suspect[b.Queue] || stillThere(b, reps[i]) {
				continue
			}
			for k, id := range b.IDs {
				if needsPlace(id, r[k]) {
					push[b.Queue] = append(push[b.Queue], id)
				}
			}
		}
		for _, q := range queues {
			if len(push[q]) == 0 {
				continue
			}
			if t := typ[q]; t != "list" && t != "none" {
				tx.Queue("RENAME", s.Keys.Ready(q), s.Keys.Quarantine(s.Keys.Ready(q)))
				res.SetAside = append(res.SetAside, s.Keys.Ready(q))
			}
			s.pushReady(tx, q, push[q], false)
			res.Pushed += len(push[q])
		}
		return nil
	})
	if err != nil {
		return SettleResult{}, fmt.Errorf("buckets: settle move of %d buckets: %w", len(u.Buckets), err)
	}
	for _, k := range res.SetAside {
		if s.OnSetAside != nil {
			s.OnSetAside(k, s.Keys.Quarantine(k))
		}
	}
	return res, nil
}

// stillThere reports whether what a move took from b is still there, so
// the move did not commit: a bucket's LRANGE reply begins with b's ids
// (ids are unique, so a bucket emptied by the move and filled again holds
// other ids), or an inline entry's ZSCORE found it in the index (an entry
// removed is never added again: the task's next schedule is a retry, in
// a bucket list).
func stillThere(b MovedBucket, rep interface{}) bool {
	if b.Inline {
		_, ok := rep.([]byte)
		return ok
	}
	ids := b.IDs
	got, err := redis.Strings(rep, nil)
	if err != nil || len(got) < len(ids) {
		return false
	}
	for i, id := range ids {
		if got[i] != id {
			return false
		}
	}
	return true
}

// needsPlace reports whether an id whose record GET answered rep must be
// in a ready list: its record is waiting or retrying, or it cannot be read
// (malformed or of the wrong type), which Claim turns into a dead letter
// saying why, as it would have after the move. A missing record is most
// likely a task that ran from the pushed copy and was deleted on success:
// a copy would only make a dead letter for a task that is done.
// settleReadError is the first error reply among SettleMove's reads of
// the queues (the first nq of reps: TYPE and EXISTS per queue) and of the
// records (the rest), a record's WRONGTYPE excepted (Claim buries such a
// record with the reason). A server that answers with an error (one
// restarting answers LOADING) says nothing of a list's type or a record's
// state: taken as "not a list" and "not readable", it made the settle push
// the ids of an enqueue whose EXEC never ran into a ready list, with no
// record behind them.
func settleReadError(reps []interface{}, nq int) error {
	for i, rep := range reps {
		e, ok := rep.(redis.Error)
		if !ok || (i >= nq && IsWrongType(e)) {
			continue
		}
		return fmt.Errorf("read %d of the settle: %w", i, e)
	}
	return nil
}

func needsPlace(id string, rep interface{}) bool {
	raw, err := redis.Bytes(rep, nil)
	if errors.Is(err, redis.ErrNil) {
		return false
	}
	if err != nil {
		return true
	}
	r, err := DecodeRecord(id, raw)
	if err != nil {
		return true
	}
	return r.State == StateWaiting || r.State == StateRetry
}

// SettleEnqueue is SettleMove for an enqueue of due tasks into queue q
// whose EXEC reply was lost: no bucket was emptied (the key of bucket time
// 0 never exists, so the "still there" test never holds), and the ids whose
// records were written and wait are pushed again when q's ready list is,
// or just was, of the wrong type.
func (s *Store) SettleEnqueue(ctx context.Context, conn redis.Conn, q string, ids []string) (SettleResult, error) {
	return s.SettleMove(ctx, conn, UncertainMove{Buckets: []MovedBucket{{Queue: q, Key: s.Keys.Bucket(q, 0), IDs: ids}}})
}
