package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
	"github.com/jonboulle/clockwork"
)

// Dispatcher moves due buckets to their queues' ready lists. Any number of
// dispatchers may run against one namespace, in one process or many: each
// move is an optimistic transaction over the buckets it reads, so each
// task reaches a ready list exactly once. Over a backlog deeper than one
// round they take turns (buckets.Store.TakeTurn): one moves while the
// others stand by, instead of voiding each other's moves.
//
// It sleeps until the earliest bucket is due, and is woken early through
// the wake list when a producer schedules an earlier task; it never polls
// on a fixed interval. It never makes a task ready before its due time on
// its own clock.
type dispatcher struct {
	pool  *redis.Pool
	cfg   Config
	store *buckets.Store
	log   *slog.Logger

	moves      mover // d.store in production
	moved      atomic.Int64
	garbageLog rateLimit
	// unsettled are moves whose EXEC reply was lost, not yet settled
	// (SettleMove): touched only by Run's goroutine.
	unsettled []buckets.UncertainMove
	// windows is how many lookahead windows of the due buckets a round
	// picks its own from at random (see spread): touched only by Run's
	// goroutine.
	windows int

	// The dispatch turn (buckets.TakeTurn), touched only by Run's
	// goroutine: id names this dispatcher in it; backlog says the last
	// round left more due than it moved, so the next takes the turn
	// first; holding says this dispatcher holds it, to be renewed at
	// renewAt.
	id      string
	backlog bool
	holding bool
	renewAt time.Time
	turnLog rateLimit
}

// The dispatch turn's timing. A turn lasts turnTTL seconds unless its
// holder renews it, which it does every turnRenew while it works: a
// holder that dies delays what it was moving by at most turnTTL (2 to 3 s
// at a 2.4 server, which expires keys at whole seconds). A dispatcher
// turned away looks again after turnWait at the latest, so a turn whose
// holder died is taken over once it ends.
const (
	turnTTL   = 2
	turnRenew = 500 * time.Millisecond
	turnWait  = turnTTL*time.Second + 500*time.Millisecond
)

// maxWindows bounds Dispatcher.windows.
const maxWindows = 16

// mover is the dispatcher's transactions: *buckets.Store in production,
// wrapped by tests.
type mover interface {
	MoveDue(ctx context.Context, conns []redis.Conn, o buckets.MoveOpts) (buckets.MoveResult, error)
	NextDue(ctx context.Context, conn redis.Conn) (int64, bool, error)
	SettleMove(ctx context.Context, conn redis.Conn, u buckets.UncertainMove) (buckets.SettleResult, error)
}

// NewDispatcher returns a Dispatcher over pool.
func newDispatcher(pool *redis.Pool, cfg Config) (*dispatcher, error) {
	if pool == nil {
		return nil, fmt.Errorf("engine: NewDispatcher: nil pool: %w", ErrInvalid)
	}
	cfg, st, err := cfg.prepare(pool)
	if err != nil {
		return nil, err
	}
	return &dispatcher{pool: pool, cfg: cfg, store: st, moves: st, log: cfg.Logger.With(keyComponent, "dispatcher"), id: newID()}, nil
}

// Moved reports how many tasks this dispatcher made ready.
func (d *dispatcher) Moved() int64 { return d.moved.Load() }

// Conflicts reports how many of its transactions found a bucket changed
// under them and were retried.
func (d *dispatcher) Conflicts() int64 { return d.store.Conflicts() }

// Run moves due buckets until ctx ends, then returns nil. Redis errors are
// logged and retried with backoff; Run returns an error only for a setup
// it cannot use.
func (d *dispatcher) Run(ctx context.Context) error {
	wake, look := make(chan struct{}, 1), make(chan struct{}, 1)
	var g sync.WaitGroup
	wctx, stopWaker := context.WithCancel(ctx)
	g.Go(func() { d.waker(wctx, wake, look) })
	defer func() {
		stopWaker()
		g.Wait()
	}()
	defer d.settleOnExit(ctx)
	defer d.endTurnOnExit(ctx)

	lanes := make([]*rconn.Holder, d.cfg.Advanced.DispatchLanes)
	for i := range lanes {
		lanes[i] = &rconn.Holder{Pool: d.pool}
		defer lanes[i].Close()
	}
	var bo, conflictBo rconn.Backoff
	// Two timers: recheck on real time (how long Redis-side state such as
	// another dispatcher's turn or an unwoken far bucket may go unread),
	// due on the engine's Clock (the next bucket's time), so a test that
	// drives the Clock drives the moves.
	recheck := time.NewTimer(time.Hour)
	recheck.Stop()
	defer recheck.Stop()
	clock := d.cfg.Advanced.Clock
	var due clockwork.Timer // set while a bucket's time is awaited
	stopDue := func() {
		if due != nil {
			due.Stop()
			due = nil
		}
	}
	defer stopDue()
	// dueAt is due's channel, nil (never ready) while due is unset.
	dueAt := func() <-chan time.Time {
		if due == nil {
			return nil
		}
		return due.Chan()
	}
	d.log.Info("dispatcher started", "namespace", d.cfg.Namespace, "resolution", d.cfg.Advanced.Resolution)
	for {
		next, err := d.round(ctx, lanes)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			for _, h := range lanes {
				h.Drop()
			}
			if !bo.Wait(ctx, d.log, "dispatch", err) {
				return nil
			}
			continue
		}
		bo.Reset()
		if next == conflicted {
			// Another dispatcher moved what this round read: back off
			// before reading again, so that dispatchers over one backlog
			// do not keep voiding each other's rounds.
			if !conflictWait(ctx, &conflictBo) {
				return nil
			}
			continue
		}
		conflictBo.Reset()
		if next == 0 {
			continue // more is due now
		}
		// Read the index again by IndexRecheck at the latest: enqueues
		// send no wake for buckets past buckets.WakeHorizon. Turned away
		// by another dispatcher's turn, look again by turnWait: the
		// holder may have died.
		limit := buckets.IndexRecheck
		if next == turnedAway {
			limit, next = turnWait, -1
		}
		recheck.Reset(limit)
		if next > 0 {
			due = clock.NewTimer(time.UnixMilli(next).Sub(clock.Now()))
		}
		for waiting := true; waiting; {
			select {
			case <-ctx.Done():
				d.log.Info("dispatcher stopped", "moved", d.moved.Load())
				return nil
			case <-wake:
				waiting = false
			case <-recheck.C:
				waiting = false
			case <-dueAt():
				waiting = false
			case <-look:
				// The idle wait ran out with no token: one may have been
				// lost. One read of the index says whether to move now,
				// or until when to sleep.
				at, ok := d.idleLook(ctx, lanes[0])
				waiting = ok
				if ok && at > 0 && (next < 0 || at < next) {
					next = at
					stopDue()
					due = clock.NewTimer(time.UnixMilli(next).Sub(clock.Now()))
				}
			}
		}
		recheck.Stop()
		stopDue()
	}
}

// idleLook reads when the earliest bucket is due, after an idle wait with
// no token. It returns ok when nothing is due now: then at is that
// bucket's time (Unix ms), or -1 when nothing is scheduled. A failed read
// is not ok: the round that follows reads again and backs off.
func (d *dispatcher) idleLook(ctx context.Context, h *rconn.Holder) (at int64, ok bool) {
	if len(d.unsettled) > 0 {
		return 0, false
	}
	conn, err := h.Get(ctx)
	if err != nil {
		return 0, false
	}
	next, found, err := d.moves.NextDue(ctx, conn)
	switch {
	case err != nil:
		h.Drop()
		return 0, false
	case !found:
		return -1, true
	case next <= ms(d.cfg.Advanced.Clock.Now()):
		return 0, false
	}
	return next, true
}

// conflicted is round's answer when every transaction of the round found
// its buckets changed under it: read again after a pause.
const conflicted = -2

// turnedAway is round's answer when another dispatcher holds the turn:
// wait for a wake-up, or turnWait at most.
const turnedAway = -3

// conflictWait pauses after a round that moved nothing for conflicts: the
// first pause is short (the other dispatcher is usually done by then),
// then it grows as rconn.Backoff's does.
func conflictWait(ctx context.Context, bo *rconn.Backoff) bool {
	return bo.Wait(ctx, discardLog, "dispatch round (conflicts)", nil) && rconn.Sleep(ctx, time.Millisecond)
}

// spread adapts d.windows to what a round that asked for window found.
// A lone dispatcher meets no conflicts and always reads the earliest due
// buckets (one window). Several over a backlog deeper than a window meet
// each other's WATCHes: each conflict doubles the windows they pick from,
// up to maxWindows, so that they soon work on different buckets. An empty
// window (MoveDue then read the earliest) or one that was not full (the
// last) shows where the backlog ends, and the windows shrink to it.
func (d *dispatcher) spread(window int, res buckets.MoveResult) {
	switch {
	case res.Window != window:
		d.windows = max(1, window)
	case !res.WindowFull:
		d.windows = max(1, min(d.windows, window+1))
	case res.Conflicts > 0:
		d.windows = min(maxWindows, 2*max(1, d.windows))
	}
}

// round moves what is due. It returns 0 when more may be due at once, the
// time (Unix ms) of the next bucket, -1 when nothing is scheduled, or
// conflicted.
func (d *dispatcher) round(ctx context.Context, lanes []*rconn.Holder) (int64, error) {
	if err := d.settle(ctx); err != nil {
		return 0, err
	}
	conns := make([]redis.Conn, len(lanes))
	for i, h := range lanes {
		c, err := h.Get(ctx)
		if err != nil {
			return 0, err
		}
		conns[i] = c
	}
	conn := conns[0]
	var gate func() (bool, error)
	if d.backlog || d.holding {
		ok, err := d.turn(ctx, conn)
		if err != nil {
			return 0, err
		}
		if !ok {
			return turnedAway, nil
		}
	} else {
		// A round that finds a backlog it did not expect (a full window:
		// every dispatcher woken at once for it reads the same one) takes
		// the turn before it moves anything.
		gate = func() (bool, error) { return d.turn(ctx, conn) }
	}
	now := ms(d.cfg.Advanced.Clock.Now())
	// Several dispatchers over one large backlog each read a window of
	// their own, at random, so that they seldom conflict (see spread).
	window := 0
	if d.windows > 1 {
		window = rand.IntN(d.windows)
	}
	res, err := d.moves.MoveDue(ctx, conns, buckets.MoveOpts{Now: now, Chunk: d.cfg.Advanced.DispatchBuckets,
		MaxTasks: d.cfg.Advanced.DispatchTasks, Lookahead: 8 * d.cfg.Advanced.DispatchBuckets, Window: window, Gate: gate})
	if len(res.Uncertain) > 0 {
		// Settle at once, on a fresh connection: the sooner it looks,
		// the likelier a ready list that refused the push is still of
		// the wrong type, or set aside, rather than put right by hand.
		d.unsettled = append(d.unsettled, res.Uncertain...)
		if serr := d.settle(ctx); serr != nil && err == nil {
			err = serr
		}
	}
	if err != nil {
		return 0, err
	}
	if res.Gated {
		d.backlog = true
		return turnedAway, nil
	}
	d.spread(window, res)
	d.backlog = res.Partial || (res.Conflicts > 0 && res.Tasks == 0)
	d.moved.Add(int64(res.Tasks))
	d.cfg.observeDispatch(res)
	if len(res.WrongType) > 0 {
		setAside(ctx, d.pool, d.store, d.store.Keys, d.log, "list", res.WrongType...)
	}
	for _, k := range res.Quarantined {
		d.log.Error("key of the wrong type set aside", "key", k, "moved_to", d.store.Keys.Quarantine(k))
	}
	if len(res.Garbage) > 0 && d.garbageLog.Allow() {
		d.log.Warn("index members that name no bucket removed", "members", res.Garbage, "count", len(res.Garbage))
	}
	if res.Conflicts > 0 && res.Tasks == 0 {
		d.log.Debug("dispatch conflicts; reading again after a pause", "conflicts", res.Conflicts)
		return conflicted, nil
	}
	if res.Tasks > 0 || res.Partial || res.Conflicts > 0 || res.Stale > 0 {
		return 0, nil
	}
	next, ok, err := d.moves.NextDue(ctx, conn)
	if err != nil {
		return 0, err
	}
	if ok && next <= now {
		return 0, nil
	}
	// Nothing is due: the backlog is done.
	if d.endTurn(ctx, conn) {
		return 0, nil
	}
	if !ok {
		return -1, nil
	}
	return next, nil
}

// turn takes the dispatch turn before a round over a backlog, or renews
// it, and reports false when another dispatcher holds it. A turn key of
// the wrong type is set aside, and this round moves without the turn: the
// turn saves work, and is never what keeps a task from moving.
func (d *dispatcher) turn(ctx context.Context, conn redis.Conn) (bool, error) {
	if d.holding && time.Now().Before(d.renewAt) {
		return true, nil
	}
	taken, err := d.store.TakeTurn(ctx, conn, d.id, turnTTL)
	if errors.Is(err, txn.ErrConflict) {
		// The turn kept changing under every attempt: other dispatchers
		// are taking and renewing it. Stand by as if turned away.
		d.holding = false
		return false, nil
	}
	if err != nil {
		if !buckets.IsServerError(err) {
			return false, err
		}
		if d.turnLog.Allow() {
			d.log.Warn("dispatch turn unreadable; moving without it", keyErr, err)
		}
		if buckets.IsWrongType(err) {
			setAside(ctx, d.pool, d.store, d.store.Keys, d.log, "string", d.store.Keys.Turn())
		}
		d.holding = false
		return true, nil
	}
	if !taken {
		if d.holding {
			d.log.Debug("dispatch turn lost to another dispatcher")
		}
		d.holding = false
		return false, nil
	}
	if !d.holding {
		d.log.Debug("dispatch turn taken")
	}
	d.holding, d.renewAt = true, time.Now().Add(turnRenew)
	return true, nil
}

// endTurn gives up the turn this dispatcher holds, once nothing is due.
// It reports whether to read the index once more: a dispatcher was
// turned away meanwhile (it may have been woken for a bucket this turn's
// last look did not see), or the end failed and that is not known.
func (d *dispatcher) endTurn(ctx context.Context, conn redis.Conn) bool {
	if !d.holding {
		return false
	}
	d.holding, d.backlog = false, false
	missed, err := d.store.EndTurn(ctx, conn, d.id)
	if err != nil {
		d.log.Debug("could not end the dispatch turn; it ends with its TTL", keyErr, err)
		return ctx.Err() == nil
	}
	return missed
}

// endTurnOnExit gives up the turn of a stopping dispatcher, so that the
// others need not wait for it to end.
func (d *dispatcher) endTurnOnExit(ctx context.Context) {
	if !d.holding {
		return
	}
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	conn, err := d.pool.GetContext(ectx)
	if err != nil {
		return
	}
	defer conn.Close()
	d.holding = false
	_, _ = d.store.EndTurn(ectx, conn, d.id)
}

// settle settles, on a fresh connection, the moves whose EXEC reply was
// lost (buckets.Store.SettleMove): one whose push into a ready list failed
// while its buckets were removed has its tasks placed again. A move not
// settled stays in d.unsettled, and the next round settles it before
// moving anything.
func (d *dispatcher) settle(ctx context.Context) error {
	placeAgain(ctx, d.pool, d.store, d.log)
	if len(d.unsettled) == 0 {
		return nil
	}
	conn, err := d.pool.GetContext(ctx)
	if err != nil {
		return fmt.Errorf("engine: settle %d moves: %w", len(d.unsettled), err)
	}
	defer conn.Close()
	for len(d.unsettled) > 0 {
		sr, err := d.moves.SettleMove(ctx, conn, d.unsettled[0])
		if err != nil {
			return fmt.Errorf("engine: settle %d moves: %w", len(d.unsettled), err)
		}
		for _, k := range sr.SetAside {
			d.log.Error("key of the wrong type set aside", "key", k, "moved_to", d.store.Keys.Quarantine(k))
		}
		if sr.Pushed > 0 {
			d.log.Warn("tasks of a move whose push failed unseen placed again", "tasks", sr.Pushed)
		}
		d.unsettled = d.unsettled[1:]
	}
	return nil
}

// settleOnExit gives the moves still unsettled when Run stops one bounded
// last try, past the end of ctx. Those it cannot settle are left for
// `engine check --repair`, which finds their tasks homeless.
func (d *dispatcher) settleOnExit(ctx context.Context) {
	if len(d.unsettled) == 0 {
		return
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if err := d.settle(sctx); err != nil {
		d.log.Error("moves whose reply was lost left unsettled; run engine check --repair", "moves", len(d.unsettled), keyErr, err)
	}
}

// settleTimeout bounds the last settling of a stopping dispatcher.
const settleTimeout = 5 * time.Second

// waker blocks on the wake list on its own connection and passes each
// token on (wake). It passes its idle timeout on too (look), so the main
// loop looks again even if a token was lost: one read of the index while
// nothing is due. A dispatcher of a Server whose lane shares its
// server with other lanes waits in their shared BLPOP instead
// (waitHub.subscribe), whose signals do not tell a token from a timeout:
// each is passed on as a wake (a full round).
func (d *dispatcher) waker(ctx context.Context, wake, look chan<- struct{}) {
	if h := d.cfg.lane.hub; h != nil {
		sig, cancel, err := h.subscribe(d.store.Keys.Wake())
		if err == nil {
			defer cancel()
			for {
				select {
				case <-ctx.Done():
					return
				case <-sig:
				}
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		}
		// The hub closed: the sharded server is stopping; wait on the
		// lane's own connection meanwhile.
	}
	b := &rconn.Blocker{Pool: d.pool}
	defer b.Close()
	var bo rconn.Backoff
	for ctx.Err() == nil {
		key, err := b.Pop(ctx, []string{d.store.Keys.Wake()}, d.cfg.Advanced.IdleWait)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if buckets.IsWrongType(err) {
				setAside(ctx, d.pool, d.store, d.store.Keys, d.log, "list", d.store.Keys.Wake())
			}
			if !bo.Wait(ctx, d.log, "dispatcher wake-up wait", err) {
				return
			}
			continue
		}
		bo.Reset()
		ch := wake
		if key == "" {
			ch = look
		}
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
