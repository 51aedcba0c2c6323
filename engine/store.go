package engine

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
	"github.com/bucketq/bucketq/txn"
)

// store is every call a worker makes to Redis: redisStore in production,
// a map in a unit test. No connection crosses it: calls that must follow
// each other on one connection (a claim, and the results recorded with
// the watch it left) name the same lane; a nil lane is a pooled
// connection for that one call. There is one way to pop, one to claim and
// one to record results; the store picks the transaction. A key of the
// wrong type that a call meets is set aside by the store (its error
// says so, buckets.IsWrongType); engine check repairs the rest.
type store interface {
	// Beat writes the worker's heartbeat: all of it when full, otherwise
	// only its TTLs (and its info).
	Beat(ctx context.Context, l *lane, b beat) error
	PausedQueues(ctx context.Context, l *lane) ([]string, error)
	QueueLimits(ctx context.Context, l *lane, qs []string) ([]buckets.Limits, error)
	// Levels lists each queue's places above level 1 in use.
	Levels(ctx context.Context, l *lane) (map[string][]string, error)
	// Pop moves up to n ready tasks of place p into the in-flight list.
	// A keyed level's place (ending in '#') takes them from its key whose
	// turn it is: the result names the key's place, and, when no key's
	// turn has come, when the next one's does (Unix ms).
	Pop(ctx context.Context, l *lane, p string, n int) (popRes, error)
	// Claim claims ids popped from place p together, in one transaction
	// (cs[i] is id i's claim state, kept across tries). With hold the
	// claim leaves its watch on l for the runs' results (Finish with
	// held); cs[i].Held() says which runs it covers.
	Claim(ctx context.Context, l *lane, p string, ids []string, cs []buckets.ClaimState, hold bool) ([]*buckets.Record, []buckets.ClaimResult, error)
	// Finish records the results of runs in one transaction: with the
	// watch their claim left on l, without reading, when held is set and
	// the watch still holds (then the pop in req rides behind it);
	// otherwise, or when a record changed since the claim, reading each
	// record first.
	Finish(ctx context.Context, l *lane, req finishReq) (finishRes, error)
	// Abandon clears a running record that was deleted or corrupted.
	Abandon(ctx context.Context, l *lane, r *buckets.Record) (buckets.AbandonResult, error)
	// Requeue gives tasks of the in-flight list back to their queues.
	Requeue(ctx context.Context, l *lane, ids []string, why buckets.Reason) (buckets.RequeueResult, error)
	// RecoverLost gives back up to limit in-flight ids that no slot of
	// the process holds (held).
	RecoverLost(ctx context.Context, l *lane, limit int, held func() map[string]int) (buckets.RequeueResult, error)
	// RecoverAll gives back every task of the worker's in-flight list.
	RecoverAll(ctx context.Context, l *lane) (buckets.RequeueResult, error)
	// Forget deletes the worker's keys (when its heartbeat is gone, with
	// requireDead).
	Forget(ctx context.Context, l *lane, requireDead bool) (bool, error)
	// SetAside renames keys that are not of type want out of the way,
	// logging each, on a pooled connection and under a deadline of its own
	// (it runs on the way out of a failed call, whose ctx may have ended).
	SetAside(ctx context.Context, want string, keys ...string)
	// PlaceAgain applies the placement repairs the store keeps.
	PlaceAgain(ctx context.Context, l *lane) (int, error)
	// Unplaced counts the placement repairs the store keeps.
	Unplaced() int
}

// beat is one heartbeat (store.Beat).
type beat struct {
	full   bool
	ttl    int64 // seconds
	info   []byte
	served []buckets.Served
}

// popRes is what a pop took.
type popRes struct {
	place string   // the place the ids came from (a key's, for a keyed level)
	ids   []string // oldest first
	next  int64    // keyed level with no key in turn: when one's turn comes (Unix ms; 0: none)
}

// finishReq is a group of results to record (store.Finish).
type finishReq struct {
	items []finishItem
	// held: the lane holds the watch of the claim of every item's run.
	held bool
	// pop, popN: with the watch held, pop up to popN tasks of place pop
	// behind the EXEC, in the same round trip (popN 0: none).
	pop  string
	popN int
}

// finishItem is one run's result.
type finishItem struct {
	buckets.FinishItem                 // for the way that reads the record
	rec                *buckets.Record // the record as claimed, for the held way
	waited             bool            // the claim found the task waited for (ClaimState.Waited)
}

// finishRes is what Finish did: a result per item, whose Err is the
// item's own (ErrLeaseLost, ErrNotFound, ErrMalformed, a key of the wrong
// type; nothing written for it).
type finishRes struct {
	results []buckets.FinishResult
	// held: recorded with the claim's watch, without reading.
	held bool
	// sent: the transaction may have run (when Finish returns an error).
	sent bool
	// popped: the ids the pop took; popLost: its replies were lost (a
	// pop that ran is then the recoverer's).
	popped  []string
	popLost bool
}

// lane is one connection a worker's loop keeps for its store calls,
// replaced after a failure (rconn.Holder), with the watch a claim left on
// it until a Finish uses it. Only the store looks inside.
type lane struct {
	h    rconn.Holder
	held *txn.Held
}

// close gives the connection back to the pool, which unwatches a watch
// left unused.
func (l *lane) close() {
	l.held = nil
	l.h.Close()
}

// redisStore is the worker's store over a *buckets.Store.
type redisStore struct {
	st      *buckets.Store
	log     *slog.Logger
	lanes   func() *lane // a lane on the worker's pool
	id      string       // the worker process
	now     func() int64 // Unix ms
	doneTTL int64
	// deadline is the lease deadline a claim writes for a record.
	deadline func(*buckets.Record) int64
	// maxRecoveries bounds the recoveries of a task before it is dead.
	maxRecoveries int
}

var _ store = (*redisStore)(nil)

// do runs f on l's connection (a pooled one for a nil l). A failure that
// may leave the connection in an unknown state drops it: the lane's next
// call gets a tested one.
func (s *redisStore) do(ctx context.Context, l *lane, f func(c *rconn.Holder) error) error {
	if l == nil {
		l = s.lanes()
		defer l.close()
	}
	if _, err := l.h.Get(ctx); err != nil {
		return err
	}
	err := f(&l.h)
	if err != nil && !settled(err) {
		l.held = nil
		l.h.Drop()
	}
	return err
}

// settled reports whether err is an answer of the server, after which the
// connection is in a known state.
func settled(err error) bool {
	return buckets.IsServerError(err) || errors.Is(err, buckets.ErrWatchLost) || errors.Is(err, buckets.ErrLeaseLost) ||
		errors.Is(err, buckets.ErrNotFound) || errors.Is(err, buckets.ErrMalformed) || errors.Is(err, txn.ErrConflict)
}

func (s *redisStore) Beat(ctx context.Context, l *lane, b beat) error {
	return s.do(ctx, l, func(c *rconn.Holder) error {
		if b.full {
			return s.st.Beat(ctx, c.Conn(), s.id, b.ttl, b.info, b.served...)
		}
		return s.st.Refresh(ctx, c.Conn(), s.id, b.ttl, b.info, b.served...)
	})
}

func (s *redisStore) PausedQueues(ctx context.Context, l *lane) (qs []string, err error) {
	err = s.do(ctx, l, func(c *rconn.Holder) error {
		qs, err = s.st.PausedQueues(ctx, c.Conn())
		return err
	})
	return qs, err
}

func (s *redisStore) QueueLimits(ctx context.Context, l *lane, qs []string) (lim []buckets.Limits, err error) {
	err = s.do(ctx, l, func(c *rconn.Holder) error {
		lim, err = s.st.QueueLimits(ctx, c.Conn(), qs)
		return err
	})
	return lim, err
}

func (s *redisStore) Levels(ctx context.Context, l *lane) (lv map[string][]string, err error) {
	err = s.do(ctx, l, func(c *rconn.Holder) error {
		lv, err = s.st.Levels(ctx, c.Conn())
		return err
	})
	if buckets.IsWrongType(err) {
		s.SetAside(ctx, "set", s.st.Keys.Levels())
	}
	return lv, err
}

func (s *redisStore) Pop(ctx context.Context, l *lane, p string, n int) (r popRes, err error) {
	err = s.do(ctx, l, func(c *rconn.Holder) error {
		if lvl, keyed := strings.CutSuffix(p, "#"); keyed {
			r.place, r.ids, r.next, err = s.st.PopKey(ctx, c.Conn(), lvl, s.id, n, s.now())
			return err
		}
		r.place = p
		r.ids, err = s.st.PopMany(ctx, c.Conn(), p, s.id, n)
		return err
	})
	if buckets.IsWrongType(err) {
		k := s.st.Keys
		if lvl, keyed := strings.CutSuffix(p, "#"); keyed {
			s.SetAside(ctx, "zset", k.Rotation(lvl))
			lists := []string{k.Inflight(s.id)}
			if r.place != "" {
				lists = append(lists, k.Ready(r.place))
			}
			s.SetAside(ctx, "list", lists...)
		} else {
			s.SetAside(ctx, "list", k.Ready(p), k.Inflight(s.id))
		}
	}
	return r, err
}

func (s *redisStore) Claim(ctx context.Context, l *lane, p string, ids []string, cs []buckets.ClaimState, hold bool) (recs []*buckets.Record, res []buckets.ClaimResult, err error) {
	err = s.do(ctx, l, func(c *rconn.Holder) error {
		if len(ids) == 1 {
			rec, r, err := s.st.Claim(ctx, c.Conn(), s.id, p, ids[0], s.now(), s.deadline, hold, &cs[0])
			if err == nil {
				recs, res = []*buckets.Record{rec}, []buckets.ClaimResult{r}
			}
			return err
		}
		recs, res, err = s.st.ClaimBatch(ctx, c.Conn(), s.id, p, ids, s.now(), s.deadline, cs, hold)
		return err
	})
	if buckets.IsWrongType(err) {
		s.setAsideRunKeys(ctx, p)
	}
	if err == nil && hold {
		l.held = nil
		for i := range cs {
			if h := cs[i].Held(); h != nil {
				l.held = h
				break
			}
		}
	}
	return recs, res, err
}

func (s *redisStore) Finish(ctx context.Context, l *lane, req finishReq) (out finishRes, err error) {
	held := l.held
	l.held = nil // used up either way
	if req.held && held != nil && held.Conn() == l.h.Conn() && held.Conn().Err() == nil {
		out.sent = true
		err = s.do(ctx, l, func(*rconn.Holder) error { return s.finishHeld(ctx, held, req, &out) })
		if !errors.Is(err, buckets.ErrWatchLost) {
			out.held = err == nil
			return out, err
		}
		// A record or mark changed since the claim: the way that reads
		// them. A pop sent behind the EXEC ran all the same.
		out.results, out.sent = nil, false
	}
	err = s.do(ctx, l, func(c *rconn.Holder) error {
		out.sent = true
		if len(req.items) == 1 {
			it := req.items[0]
			r, o, err := s.st.Finish(ctx, c.Conn(), s.id, it.ID, it.Run, it.Now, s.doneTTL, it.Decide)
			if err != nil && !itemErr(err) {
				return err
			}
			out.results = []buckets.FinishResult{{Rec: r, Out: o, Err: err}}
			return nil
		}
		items := make([]buckets.FinishItem, len(req.items))
		for i, it := range req.items {
			items[i] = it.FinishItem
		}
		out.results, err = s.st.FinishGroup(ctx, c.Conn(), s.id, items, s.doneTTL)
		return err
	})
	for i, r := range out.results {
		if buckets.IsWrongType(r.Err) {
			s.setAsideRunKeys(ctx, req.items[i].rec.Queue)
			break
		}
	}
	return out, err
}

// finishHeld records req with the watch held, and its pop behind it.
func (s *redisStore) finishHeld(ctx context.Context, held *txn.Held, req finishReq, out *finishRes) error {
	var pop []txn.Cmd
	if req.popN > 0 {
		pop = s.st.PopsNext(req.pop, s.id, req.popN)
	}
	var (
		after []interface{}
		err   error
	)
	if len(req.items) == 1 {
		it := req.items[0]
		var r *buckets.Record
		var o buckets.Outcome
		r, o, after, err = s.st.FinishHeld(ctx, held, s.id, it.rec, it.waited, it.Now, s.doneTTL, it.Decide, pop)
		if err == nil {
			out.results = []buckets.FinishResult{{Rec: r, Out: o}}
		}
	} else {
		items := make([]buckets.HeldItem, len(req.items))
		for i, it := range req.items {
			items[i] = buckets.HeldItem{Rec: it.rec, Waited: it.waited, Now: it.Now, Decide: it.Decide}
		}
		out.results, after, err = s.st.FinishGroupHeld(ctx, held, s.id, items, s.doneTTL, pop)
	}
	if pop != nil {
		out.popLost = len(after) != len(pop)
		// An error reply of a pop (a ready list of the wrong type) is the
		// fetching loop's to find and set aside.
		out.popped, _ = buckets.Popped(req.pop, after)
	}
	return err
}

// itemErr reports whether err, from reading one record, is the item's
// own: nothing was written for it, and the connection is fine.
func itemErr(err error) bool {
	return errors.Is(err, buckets.ErrLeaseLost) || errors.Is(err, buckets.ErrNotFound) ||
		errors.Is(err, buckets.ErrMalformed) || buckets.IsWrongType(err)
}

func (s *redisStore) Abandon(ctx context.Context, l *lane, r *buckets.Record) (res buckets.AbandonResult, err error) {
	err = s.do(ctx, l, func(c *rconn.Holder) error {
		res, err = s.st.Abandon(ctx, c.Conn(), s.id, r, s.now())
		return err
	})
	return res, err
}

func (s *redisStore) Requeue(ctx context.Context, l *lane, ids []string, why buckets.Reason) (res buckets.RequeueResult, err error) {
	err = s.do(ctx, l, func(c *rconn.Holder) error {
		res, err = s.st.Requeue(ctx, c.Conn(), s.id, ids, s.now(), why, s.maxRecoveries)
		return err
	})
	return res, err
}

func (s *redisStore) RecoverLost(ctx context.Context, l *lane, limit int, held func() map[string]int) (res buckets.RequeueResult, err error) {
	err = s.do(ctx, l, func(c *rconn.Holder) error {
		res, err = s.st.RecoverLost(ctx, c.Conn(), s.id, s.now(), limit, held)
		return err
	})
	if buckets.IsWrongType(err) {
		s.SetAside(ctx, "list", s.st.Keys.Inflight(s.id))
	}
	return res, err
}

func (s *redisStore) RecoverAll(ctx context.Context, l *lane) (res buckets.RequeueResult, err error) {
	err = s.do(ctx, l, func(c *rconn.Holder) error {
		res, err = s.st.RecoverAllInflight(ctx, c.Conn(), s.id, s.now(), false)
		return err
	})
	return res, err
}

func (s *redisStore) Forget(ctx context.Context, l *lane, requireDead bool) (ok bool, err error) {
	err = s.do(ctx, l, func(c *rconn.Holder) error {
		ok, err = s.st.Forget(ctx, c.Conn(), s.id, requireDead)
		return err
	})
	return ok, err
}

func (s *redisStore) PlaceAgain(ctx context.Context, l *lane) (n int, err error) {
	err = s.do(ctx, l, func(c *rconn.Holder) error {
		n, err = s.st.PlaceAgain(ctx, c.Conn())
		return err
	})
	return n, err
}

func (s *redisStore) Unplaced() int { return s.st.Unplaced() }

// setAside renames keys that are not of type want out of the way, on a
// pooled connection, and logs each: where the worker's calls repair a key
// of the wrong type they meet, in one way. It runs after the call's
// context may have ended: the repair is bounded on its own.
func (s *redisStore) SetAside(ctx context.Context, want string, keys ...string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), setAsideTimeout)
	defer cancel()
	var moved []string
	err := s.do(ctx, nil, func(c *rconn.Holder) error {
		var err error
		moved, err = s.st.SetAside(ctx, c.Conn(), want, keys...)
		return err
	})
	logSetAside(s.log, s.st.Keys, moved, err)
}

// setAsideTimeout bounds one setting aside.
const setAsideTimeout = 5 * time.Second

// setAsideRunKeys sets aside the keys a claim or a result of place p
// writes besides the record, if one has the wrong type: the in-flight
// list, the pending set, the queue's counters and limits.
func (s *redisStore) setAsideRunKeys(ctx context.Context, p string) {
	k := s.st.Keys
	s.SetAside(ctx, "list", k.Inflight(s.id))
	s.SetAside(ctx, "zset", k.Pending(s.id))
	s.SetAside(ctx, "hash", k.Stats(p))
	s.SetAside(ctx, "hash", k.Limit(buckets.QueueOf(p)))
}
