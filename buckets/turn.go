package buckets

import (
	"context"
	"fmt"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// The dispatch turn. Any number of dispatchers may move due buckets at
// once: each move is guarded by the WATCH of the buckets it reads, so the
// turn is never needed for correctness. It is for speed. Dispatchers that
// work one large backlog together read the same due buckets and void each
// other's transactions, and every voided one was work for the client and
// the server for nothing. So a dispatcher that finds more due than one
// round moves takes the turn, and while one holds it the others stand by.
//
// The turn is a string key holding its holder's id, with a TTL of a few
// seconds that its holder renews while it works: a holder that dies
// leaves a turn that ends on its own. A dispatcher turned away sets a
// mark (also with a TTL) in the same transaction that read the turn, under
// the turn's WATCH; the holder ends its turn and reads the mark in one
// transaction. So either the turned-away dispatcher's mark is seen by the
// holder's end (which then looks at the index once more), or the end came
// first, the mark's EXEC fails on the WATCH, and the turned-away
// dispatcher reads a free turn and takes it: a producer's wake-up taken by
// a dispatcher that was turned away is never lost.

// TakeTurn takes the dispatch turn for dispatcher id, or renews it when
// id holds it, for ttl seconds (at least 1). When another holds it, it
// marks that a dispatcher was turned away (for the holder's EndTurn) and
// returns false:
//
// watch   turn
// read    GET turn
// queue   SETEX turn ttl id            (free, or id's)
// queue   SETEX turn:missed ttl 1      (held by another)
//
// A crash before EXEC changes nothing; after it, the turn or the mark
// ends with its TTL. A turn key of the wrong type is an error (the caller
// moves without a turn).
func (s *Store) TakeTurn(ctx context.Context, conn redis.Conn, id string, ttl int) (bool, error) {
	ttl = max(ttl, 1)
	taken := false
	_, err := s.runner.Run(ctx, conn, []string{s.Keys.Turn()}, func(tx *txn.Tx) error {
		holder, err := redis.String(tx.Do("GET", s.Keys.Turn()))
		if err != nil && err != redis.ErrNil {
			return err
		}
		taken = holder == "" || holder == id
		if taken {
			tx.Queue("SETEX", s.Keys.Turn(), ttl, id)
		} else {
			tx.Queue("SETEX", s.Keys.TurnMissed(), ttl, "1")
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("buckets: take the dispatch turn: %w", err)
	}
	return taken, nil
}

// EndTurn gives up dispatcher id's turn and reports whether a dispatcher
// was turned away while it was held (the caller then reads the index once
// more: that dispatcher may have been woken for a bucket this turn's
// last round did not see):
//
// watch   turn
// read    GET turn
// queue   DEL turn; GET turn:missed; DEL turn:missed      (id's turn)
//
// When the turn is no longer id's (it ended with its TTL, and maybe
// another took it), nothing is written and missed is false: the mark is
// then for the present holder. A crash before EXEC leaves the turn to end
// with its TTL.
func (s *Store) EndTurn(ctx context.Context, conn redis.Conn, id string) (missed bool, err error) {
	ours := false
	reps, err := s.runner.Run(ctx, conn, []string{s.Keys.Turn()}, func(tx *txn.Tx) error {
		holder, err := redis.String(tx.Do("GET", s.Keys.Turn()))
		if err != nil && err != redis.ErrNil {
			return err
		}
		ours = holder == id
		if ours {
			tx.Queue("DEL", s.Keys.Turn())
			tx.Queue("GET", s.Keys.TurnMissed())
			tx.Queue("DEL", s.Keys.TurnMissed())
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("buckets: end the dispatch turn: %w", err)
	}
	if !ours || len(reps) < 2 {
		return false, nil
	}
	return reps[1] != nil, nil
}
