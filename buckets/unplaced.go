package buckets

import (
	"context"
	"errors"
	"fmt"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// placementFix is what completing a placement that failed inside EXEC
// takes: the keys of the wrong type to set aside (each with the type its
// command needed), then the failed commands that place tasks, again.
type placementFix struct {
	aside []wrongKey
	retry cmdList
}

type wrongKey struct{ want, key string }

// tasks is how many tasks the fix's commands place (for the log): the ids
// pushed into a ready list or a bucket, and the index entries that are
// inline entries (a bucket's entry names a bucket, whose ids its push
// counts, or which held them already).
func (f placementFix) tasks() int {
	n := 0
	for _, c := range f.retry {
		if c.Name != "ZADD" {
			n += len(c.Args) - 1
			continue
		}
		for i := 2; i < len(c.Args); i += 2 {
			if m, ok := c.Args[i].(string); ok {
				if _, inline := inlineEntry(m); inline {
					n++
				}
			}
		}
	}
	return n
}

// repairTries is how many connections repairPlacement tries a fix on: the
// caller's, then fresh ones from Store.Redial.
const repairTries = 3

// repairPlacement completes a transaction whose EXEC ran while some of its
// commands failed on keys of the wrong type (err is the *txn.ExecError,
// reps EXEC's replies). Each such key is set aside (SetAside) and the
// failed commands that place tasks run again in one MULTI/EXEC. It reports
// whether the transaction is now complete: false, with a nil error, when
// err is not such a failure or a command other than placement, tokens and
// counters failed.
//
// The tasks of such a transaction are in no list until the repair's EXEC
// runs, so a repair whose connection fails is not given up: it is tried
// again on fresh connections (Store.Redial, up to repairTries in all,
// within ctx), and one that still fails is kept, and reported with its
// error: PlaceAgain applies it later (the next transaction of this Store
// that places tasks, or the engine's periodic call). Only a crash of the
// process first leaves the tasks' records waiting in no list; `engine
// check --repair` finds and re-homes them.
//
// A fix whose EXEC reply was lost may run twice: an id pushed twice into
// a ready list is claimed once (Claim takes only a waiting or retrying
// record), as after SettleMove.
func (s *Store) repairPlacement(ctx context.Context, conn redis.Conn, reps []interface{}, err error) (bool, error) {
	var ee *txn.ExecError
	if !errors.As(err, &ee) || ee.Queued || len(reps) != len(ee.Commands) {
		return false, nil
	}
	var fix placementFix
	complete := true
	for i, rep := range reps {
		e, failed := rep.(redis.Error)
		if !failed {
			continue
		}
		c := ee.Commands[i]
		if !IsWrongType(e) {
			complete = false
			continue
		}
		key, _ := c.Args[0].(string)
		fix.aside = append(fix.aside, wrongKey{typeFor[c.Name], key})
		switch {
		case s.placement(c):
			fix.retry = append(fix.retry, c)
		case c.Name == "LPUSH", c.Name == "LTRIM", c.Name == "HINCRBY", c.Name == "HDEL":
			// a wake-up token or a counter: not worth a retry
		default:
			complete = false
		}
	}
	if len(fix.aside) == 0 {
		return complete, nil
	}
	if err := s.applyFixTries(ctx, conn, fix); err != nil {
		if len(fix.retry) > 0 {
			s.keepUnplaced(fix)
			return false, fmt.Errorf("%w (kept: placed again by the next try)", err)
		}
		return false, err
	}
	return complete, nil
}

// applyFixTries applies fix on conn, then, while that fails and ctx
// lasts, on fresh connections from Redial, repairTries times in all.
func (s *Store) applyFixTries(ctx context.Context, conn redis.Conn, fix placementFix) error {
	err := s.applyFix(ctx, conn, fix)
	for try := 1; err != nil && try < repairTries && s.Redial != nil && ctx.Err() == nil; try++ {
		c, rerr := s.Redial(ctx)
		if rerr != nil {
			err = rerr
			continue
		}
		err = s.applyFix(ctx, c, fix)
		c.Close()
	}
	return err
}

// applyFix sets fix's keys aside and runs its placing commands again in
// one MULTI/EXEC.
func (s *Store) applyFix(ctx context.Context, conn redis.Conn, fix placementFix) error {
	for _, k := range fix.aside {
		moved, err := s.SetAside(ctx, conn, k.want, k.key)
		if err != nil {
			return err
		}
		for _, m := range moved {
			if s.OnSetAside != nil {
				s.OnSetAside(m, s.Keys.Quarantine(m))
			}
		}
	}
	if len(fix.retry) == 0 {
		return nil
	}
	if _, err := s.exec(ctx, conn, fix.retry); err != nil {
		return fmt.Errorf("placing tasks again after setting keys aside: %w", err)
	}
	return nil
}

func (s *Store) keepUnplaced(fixes ...placementFix) {
	s.unplacedMu.Lock()
	s.unplaced = append(s.unplaced, fixes...)
	s.unplacedN.Store(int64(len(s.unplaced)))
	s.unplacedMu.Unlock()
}

// Unplaced reports how many repairs of placements this Store keeps
// because they failed on every try (see PlaceAgain).
func (s *Store) Unplaced() int { return int(s.unplacedN.Load()) }

// PlaceAgain applies, on conn, the repairs this Store keeps: placements
// whose EXEC ran while their push failed on a key of the wrong type, and
// whose repair then failed on every connection it tried (a cut connection,
// a deadline). Their tasks are in no list until then. It returns how many
// task ids it placed; the repairs it could not apply are kept for the next
// call. The Store calls it before each transaction that places tasks; a
// process that runs few of those (a reaper with nothing to recover, a
// dispatcher) calls it on its own, periodically.
func (s *Store) PlaceAgain(ctx context.Context, conn redis.Conn) (int, error) {
	s.unplacedMu.Lock()
	fixes := s.unplaced
	s.unplaced = nil
	s.unplacedN.Store(0)
	s.unplacedMu.Unlock()
	placed := 0
	defer func() {
		if placed > 0 && s.OnPlacedAgain != nil {
			s.OnPlacedAgain(placed)
		}
	}()
	for i, f := range fixes {
		if err := s.applyFix(ctx, conn, f); err != nil {
			s.keepUnplaced(fixes[i:]...)
			return placed, fmt.Errorf("buckets: place again (%d repairs kept): %w", len(fixes)-i, err)
		}
		placed += f.tasks()
	}
	return placed, nil
}
