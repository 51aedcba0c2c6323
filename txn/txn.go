package txn

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/redis24"
	"github.com/gomodule/redigo/redis"
)

// Defaults used by a zero [Runner].
const (
	DefaultMaxAttempts = 32
	DefaultMinBackoff  = 200 * time.Microsecond
	DefaultMaxBackoff  = 50 * time.Millisecond
)

// Runner runs optimistic transactions: one at a time ([Runner.Run]),
// several in flight on one connection ([Runner.Pipeline]), or one that
// starts from a watch a committed transaction left behind ([Tx.Hold],
// [Held.Exec]). Its one backoff policy spaces the attempts of Run, and its
// conflict count covers all three. The zero value is ready to use with the
// defaults above. A Runner may be used by many goroutines at once.
type Runner struct {
	// MaxAttempts bounds how often Run calls its function; zero means
	// DefaultMaxAttempts.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the wait between attempts, which
	// doubles from MinBackoff and is drawn at random below the bound (full
	// jitter); zero means the defaults.
	MinBackoff, MaxBackoff time.Duration
	// Fence, when set (before first use), makes every transaction
	// conditional on a key's value (see [Fence]).
	Fence *Fence

	conflicts atomic.Int64
	mode      atomic.Int32 // what the server does with a refused queued command (queued.go)
}

// Conflicts reports how many times EXEC found a watched key changed, in
// every kind of transaction this Runner ran.
func (r *Runner) Conflicts() int64 { return r.conflicts.Load() }

// Run is [Runner.Run] on a new Runner with the default settings: it reads
// the server's version each time (one INFO), since a shared Runner would
// keep the first server's for every connection. Keep a Runner per server
// to read it once.
func Run(ctx context.Context, conn redis.Conn, watch []string, fn func(*Tx) error) ([]interface{}, error) {
	var r Runner
	return r.Run(ctx, conn, watch, fn)
}

// Run WATCHes the keys in watch, calls fn to read through tx and queue
// writes with [Tx.Queue], then sends MULTI, the queued commands and EXEC in
// one round trip. It returns the EXEC reply, one element per queued command.
//
// When EXEC answers nil (a watched key changed) Run waits a jittered
// backoff and calls fn again, up to MaxAttempts, after which it returns an
// error wrapping [ErrConflict]; an attempt that failed with an error
// wrapping [ErrNotRun] is run again the same way (the error is returned,
// wrapped, when the attempts are used up); fn may therefore run several times and
// must decide from what it reads each time. If fn returns an error, Run
// unwatches and returns that error unchanged (one wrapping ErrNotRun, as
// a read that no server ran returns, is an attempt to run again). If fn
// queues nothing, Run unwatches and returns (nil, nil).
//
// Every queued command is checked against Redis 2.4 before MULTI is sent;
// a refused one fails the attempt before anything is written. A command
// that fails while queueing is returned as an [*ExecError] and nothing was
// written (on servers older than 2.6.5 too: see the package doc); one that
// fails inside EXEC is returned as an [*ExecError] with the replies,
// because the other commands ran.
//
// Every round trip is bounded by ctx: when ctx ends during one, the
// connection is closed (a pool then discards it) and the error wraps
// ctx.Err().
func (r *Runner) Run(ctx context.Context, conn redis.Conn, watch []string, fn func(*Tx) error) ([]interface{}, error) {
	attempts := r.MaxAttempts
	if attempts <= 0 {
		attempts = DefaultMaxAttempts
	}
	if r.Fence != nil {
		watch, fn = r.Fence.wrapRun(watch, fn)
	}
	unwatch := false // a hold's WATCH from a conflicting attempt is on conn
	var notRun error // the last attempt's error wrapping ErrNotRun
	for attempt := 0; attempt < attempts; attempt++ {
		if attempt > 0 {
			if err := r.sleep(ctx, attempt); err != nil {
				return nil, withNotRun(err, notRun)
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, withNotRun(err, notRun)
		}
		if _, err := r.checkQueued(ctx, conn); err != nil {
			if !errors.Is(err, ErrNotRun) {
				return nil, err
			}
			// No server ran the version look (a routing layer's
			// refusal): an attempt like any other that ran nothing.
			notRun = tellNotRun(ctx, err)
			continue
		}
		tx := &Tx{ctx: ctx, conn: conn, r: r}
		if unwatch {
			// Travels with the attempt's first read.
			if err := tx.send("UNWATCH"); err != nil {
				return nil, err
			}
			tx.hidden++
		}
		replies, err := tx.run(watch, fn)
		if errors.Is(err, errNilExec) {
			r.conflicts.Add(1)
			unwatch, notRun = tx.hold != nil, nil
			continue
		}
		if errors.Is(err, ErrNotRun) {
			// Nothing ran: the connection sends the next attempt where
			// the keys live now. A hold's WATCH may have been sent.
			notRun = tellNotRun(ctx, err)
			unwatch = tx.hold != nil
			continue
		}
		return replies, err
	}
	if notRun != nil {
		return nil, fmt.Errorf("txn: %d attempts: %w", attempts, notRun)
	}
	if unwatch {
		// The last attempt's hold left a WATCH; give it up.
		if _, err := Do(ctx, conn, "UNWATCH"); err != nil {
			return nil, fmt.Errorf("txn: %d attempts: %w (UNWATCH: %w)", attempts, ErrConflict, err)
		}
	}
	return nil, fmt.Errorf("txn: %d attempts: %w", attempts, ErrConflict)
}

// tellNotRun tells the OnNotRun function of ctx, if any, of err, an
// attempt that no server ran, and returns err. An attempt cut short by
// ctx's own end is not told: it is not tried again, and its error (a
// deadline) would hide the reason the earlier attempts gave.
func tellNotRun(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err
	}
	if f, ok := ctx.Value(notRunKey{}).(func(error)); ok {
		f(err)
	}
	return err
}

// withNotRun adds to err, the end of Run's context, the error of the last
// attempt when nothing of it ran, so that the caller learns both why it
// stopped and that nothing was written.
func withNotRun(err, notRun error) error {
	if notRun == nil {
		return err
	}
	if errors.Is(notRun, err) {
		// The attempt itself ended with the context (a routing layer's
		// backoff), and says both already.
		return notRun
	}
	return fmt.Errorf("%w (after %w)", err, notRun)
}

// run is one attempt.
func (tx *Tx) run(watch []string, fn func(*Tx) error) ([]interface{}, error) {
	if len(watch) > 0 {
		if err := tx.Watch(watch...); err != nil {
			return nil, err
		}
	}
	if err := fn(tx); err != nil {
		_ = tx.unwatch()
		return nil, err
	}
	tx.done = true
	if len(tx.queued) == 0 {
		if tx.hold != nil {
			// Nothing to write: the hold starts now (the attempt's own
			// watch stays with it).
			if err := tx.send("WATCH", watchCmd(tx.hold.keys).Args...); err != nil {
				return nil, err
			}
			tx.hidden++
			if _, err := tx.Flush(); err != nil {
				return nil, err
			}
			tx.hold.active = true
			return nil, nil
		}
		return nil, tx.unwatch()
	}
	var after []Cmd
	if tx.hold != nil {
		after = []Cmd{watchCmd(tx.hold.keys)}
	}
	if err := check(tx.queued, after); err != nil {
		_ = tx.unwatch()
		return nil, err
	}
	all, err := tx.commit(after)
	if err != nil {
		return nil, err
	}
	replies, err := execReplies(tx.queued, all[:len(all)-len(after)])
	if tx.hold != nil {
		if err != nil {
			if !errors.Is(err, errNilExec) {
				// The WATCH is on conn; a conflict's retry unwatches it.
				_ = tx.unwatch()
			}
			return replies, err
		}
		if e, ok := all[len(all)-1].(redis.Error); ok {
			return replies, fmt.Errorf("txn: WATCH after EXEC: %w", e)
		}
		tx.hold.active = true
	}
	return replies, err
}

// commit sends MULTI, the queued commands, EXEC and after, and returns
// the replies of MULTI, the queued commands, EXEC and after. On a server
// that runs the rest of a transaction after refusing a queued command
// (checkQueued), it reads the replies of MULTI and the queued commands
// before EXEC and DISCARDs when any was refused: nothing is written then.
// There, an EXEC that failed (Redis 2.4 refuses EXEC itself at maxmemory,
// and the transaction stays open, with after queued in it) is followed by
// DISCARD, and the error is returned.
func (tx *Tx) commit(after []Cmd) ([]interface{}, error) {
	// Sends left unread before MULTI: a WATCH with no read after it.
	pre := tx.hidden + tx.sent
	tx.hidden, tx.sent = 0, 0
	var all []interface{}
	legacy := tx.r.mode.Load() != modeAborts
	if legacy {
		before, multi, err := openMulti(tx.ctx, tx.conn, pre, tx.queued)
		if err == nil {
			err = readsOK(before)
			if err != nil {
				err = discardAfter(tx.ctx, tx.conn, err)
			}
		}
		if err != nil {
			return nil, err
		}
		if err := tx.conn.Send("EXEC"); err != nil {
			return nil, fmt.Errorf("txn: send EXEC: %w", err)
		}
		if err := sendAll(tx.conn, after); err != nil {
			return nil, err
		}
		rest, err := values(Do(tx.ctx, tx.conn, ""))
		if err != nil {
			return nil, fmt.Errorf("txn: EXEC: %w", err)
		}
		if len(rest) != 1+len(after) {
			return nil, fmt.Errorf("txn: EXEC: %d replies for %d commands", len(rest), 1+len(after))
		}
		all = append(multi, rest...)
	} else {
		if err := sendMulti(tx.conn, tx.queued); err != nil {
			return nil, err
		}
		if err := sendAll(tx.conn, after); err != nil {
			return nil, err
		}
		var err error
		if all, err = values(Do(tx.ctx, tx.conn, "")); err != nil {
			return nil, fmt.Errorf("txn: MULTI/EXEC: %w", err)
		}
		// Replies: those of sends left unread, then MULTI's OK, one
		// QUEUED per command, EXEC's reply, and after's.
		if len(all) != pre+len(tx.queued)+2+len(after) {
			return nil, fmt.Errorf("txn: MULTI/EXEC: %d replies for %d commands", len(all), len(tx.queued))
		}
		if err := readsOK(all[:pre]); err != nil {
			return nil, err
		}
		all = all[pre:]
	}
	if legacy && execFailed(all[len(tx.queued)+1]) {
		// Redis 2.4 refused EXEC (at maxmemory) and kept the transaction
		// open, with after queued in it.
		_, err := execReplies(tx.queued, all[:len(tx.queued)+2])
		return nil, discardAfter(tx.ctx, tx.conn, err)
	}
	return all, nil
}

// readsOK reports the first error among the replies of commands sent
// before MULTI.
func readsOK(reps []interface{}) error {
	for _, rep := range reps {
		if e, ok := rep.(redis.Error); ok {
			return fmt.Errorf("txn: read before MULTI: %w", e)
		}
	}
	return nil
}

// check checks commands against Redis 2.4 before MULTI is sent: 2.4 drops
// a command it refuses while queueing and runs the rest.
func check(queued, after []Cmd) error {
	for i, c := range queued {
		if err := redis24.Check(c.Name, c.Args...); err != nil {
			return fmt.Errorf("txn: command %d (%s) refused before MULTI: %w", i, c.Name, err)
		}
	}
	for _, c := range after {
		if err := redis24.Check(c.Name, c.Args...); err != nil {
			return fmt.Errorf("txn: %s after EXEC refused before MULTI: %w", c.Name, err)
		}
	}
	return nil
}

// sendMulti sends MULTI, the queued commands and EXEC without flushing.
func sendMulti(conn redis.Conn, queued []Cmd) error {
	if err := conn.Send("MULTI"); err != nil {
		return fmt.Errorf("txn: send MULTI: %w", err)
	}
	if err := sendAll(conn, queued); err != nil {
		return err
	}
	if err := conn.Send("EXEC"); err != nil {
		return fmt.Errorf("txn: send EXEC: %w", err)
	}
	return nil
}

func sendAll(conn redis.Conn, cmds []Cmd) error {
	for _, c := range cmds {
		if err := conn.Send(c.Name, c.Args...); err != nil {
			return fmt.Errorf("txn: send %s: %w", c.Name, err)
		}
	}
	return nil
}

func watchCmd(keys []string) Cmd {
	args := make([]interface{}, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	return Cmd{Name: "WATCH", Args: args}
}

// errNilExec is what execReplies returns when EXEC answered nil: a watched
// key changed, and nothing was written.
var errNilExec = fmt.Errorf("txn: EXEC answered nil: %w", ErrConflict)

// execReplies judges the replies to MULTI, the queued commands and EXEC
// (len(queued)+2 of them) and returns EXEC's reply, one element per
// command. It returns errNilExec when a watched key changed, an
// *ExecError for a command refused while queueing or failed inside EXEC
// (with the replies, since at 2.4 the others ran), or another error.
func execReplies(queued []Cmd, all []interface{}) ([]interface{}, error) {
	if len(all) != len(queued)+2 {
		return nil, fmt.Errorf("txn: MULTI/EXEC: %d replies for %d commands", len(all), len(queued))
	}
	if e, ok := all[0].(redis.Error); ok {
		return nil, fmt.Errorf("txn: MULTI: %w", e)
	}
	var queueErr *ExecError
	for i, q := range all[1 : len(all)-1] {
		if e, ok := q.(redis.Error); ok {
			queueErr = &ExecError{Index: i, Command: queued[i].Name, Queued: true, Err: replyError(e), Commands: queued}
			break
		}
	}
	switch exec := all[len(all)-1].(type) {
	case nil:
		if queueErr != nil {
			return nil, queueErr
		}
		return nil, errNilExec
	case redis.Error:
		// 2.6.5 and later abort the whole transaction (EXECABORT) after a
		// queueing error; report the command that caused it.
		if queueErr != nil {
			return nil, queueErr
		}
		return nil, fmt.Errorf("txn: EXEC: %w", replyError(exec))
	case []interface{}:
		if queueErr != nil {
			return exec, queueErr
		}
		for i, rep := range exec {
			if e, ok := rep.(redis.Error); ok {
				name := "?"
				if i < len(queued) {
					name = queued[i].Name
				}
				return exec, &ExecError{Index: i, Command: name, Err: replyError(e), Commands: queued}
			}
		}
		if len(exec) != len(queued) {
			return exec, fmt.Errorf("txn: EXEC answered %d replies for %d commands", len(exec), len(queued))
		}
		return exec, nil
	default:
		return nil, fmt.Errorf("txn: EXEC: unexpected reply %T", exec)
	}
}

// backoff is the policy's wait before attempt (from 1): doubling from
// MinBackoff up to MaxBackoff, drawn at random below that bound.
func (r *Runner) backoff(attempt int) time.Duration {
	lo, hi := r.MinBackoff, r.MaxBackoff
	if lo <= 0 {
		lo = DefaultMinBackoff
	}
	if hi <= 0 {
		hi = DefaultMaxBackoff
	}
	d := lo << min(attempt-1, 20)
	if d > hi || d <= 0 {
		d = hi
	}
	return time.Duration(rand.Int64N(int64(d)) + 1)
}

func (r *Runner) sleep(ctx context.Context, attempt int) error {
	t := time.NewTimer(r.backoff(attempt))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Do is one round trip bounded by ctx, and by the round-trip bound
// ctx carries (WithRoundTrip; DefaultRoundTrip when it names none):
// whichever ends first bounds the read. A read cut short by ctx's
// deadline is reported as context.DeadlineExceeded, one cut short by the
// round-trip bound as a timeout of the connection (ErrRoundTrip when the
// command went through redis.DoContext); a connection whose read was cut
// short is closed (a pool discards it). The blocking commands (BLPOP and
// the like, whose wait the server bounds) are bounded by ctx alone.
//
// A command that answers at once is sent with the read deadline set on
// the connection itself (redis.DoWithTimeout): no goroutine and no
// allocation per round trip (redis.DoContext starts one to watch ctx: two
// goroutine switches, a third of a short transaction's latency). ctx
// cancelled without its deadline passing is then noticed before the
// command is sent, not during its read, which the bound still limits.
// The write is at most inlineMax bytes of arguments (or what is left in
// the connection's buffer after Sends, which wrote the rest themselves),
// so it fits the socket's send buffer. A blocking command, a larger one,
// or a connection that takes no timeout goes through redis.DoContext,
// which also returns as soon as ctx is cancelled.
func Do(ctx context.Context, conn redis.Conn, name string, args ...interface{}) (interface{}, error) {
	if blocking(name) {
		rep, err := redis.DoContext(conn, ctx, name, args...)
		return rep, ctxErr(ctx, err)
	}
	dl, own := ctx.Deadline()
	bound := time.Now().Add(roundTrip(ctx))
	if !own || bound.Before(dl) {
		dl, own = bound, false
	}
	// A context that already ended goes to redis.DoContext below, which
	// closes the connection: commands Sent before this call must not go
	// out later with a pool's flush.
	if d := time.Until(dl); d > 0 && ctx.Err() == nil && argsSize(args) <= inlineMax {
		if _, ok := conn.(redis.ConnWithTimeout); ok {
			rep, err := redis.DoWithTimeout(conn, d, name, args...)
			if err != errNoTimeout {
				return rep, ctxErr(ctx, err)
			}
			// A pooled connection whose own connection cannot take a
			// timeout says so before sending anything.
		}
	}
	if own {
		rep, err := redis.DoContext(conn, ctx, name, args...)
		return rep, ctxErr(ctx, err)
	}
	bctx, cancel := context.WithDeadline(ctx, dl)
	defer cancel()
	rep, err := redis.DoContext(conn, bctx, name, args...)
	if err != nil && ctx.Err() == nil && bctx.Err() != nil {
		return nil, fmt.Errorf("txn: %s: %w", name, ErrRoundTrip)
	}
	return rep, ctxErr(ctx, err)
}

// DefaultRoundTrip bounds a round trip sent under a context that names no
// bound of its own (WithRoundTrip), when its deadline is later or it has
// none: a server that stopped answering fails the call instead of holding
// it for as long as the connection stays open.
const DefaultRoundTrip = 15 * time.Second

// ErrRoundTrip is a round trip that got no reply within its bound (see
// Do) while its context still ran.
var ErrRoundTrip = errors.New("no reply within the round-trip bound")

type roundTripKey struct{}

type notRunKey struct{}

// OnNotRun returns a context under which [Runner.Run] calls f with the
// error of each attempt that the server ran none of, before it tries
// again: a caller waiting on such a transaction can say why it is slow
// while it still runs. f must be quick and safe for use by several
// goroutines.
func OnNotRun(ctx context.Context, f func(error)) context.Context {
	return context.WithValue(ctx, notRunKey{}, f)
}

// WithRoundTrip returns a context whose round trips (Do, and every
// transaction and pipeline sent under it or a context derived from it)
// are each bounded by d, besides ctx's own deadline. d <= 0 means
// DefaultRoundTrip.
func WithRoundTrip(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, roundTripKey{}, d)
}

func roundTrip(ctx context.Context) time.Duration {
	if d, ok := ctx.Value(roundTripKey{}).(time.Duration); ok && d > 0 {
		return d
	}
	return DefaultRoundTrip
}

// errNoTimeout is redigo's error for a connection without
// redis.ConnWithTimeout (a pool's connection reports it, sending nothing,
// when the connection it wraps has none).
var errNoTimeout = func() error {
	_, err := redis.DoWithTimeout(struct{ redis.Conn }{}, 0, "")
	return err
}()

// inlineMax bounds the arguments of a command sent on the caller's
// goroutine: its write then fits a socket's send buffer, so the
// connection's write timeout is never what bounds it.
const inlineMax = 16 << 10

// argsSize is the bytes of args' strings and byte slices, stopping once
// past inlineMax.
func argsSize(args []interface{}) int {
	n := 0
	for _, a := range args {
		switch v := a.(type) {
		case string:
			n += len(v)
		case []byte:
			n += len(v)
		default:
			n += 8
		}
		if n > inlineMax {
			break
		}
	}
	return n
}

// blocking reports whether a command may wait on the server for data.
func blocking(name string) bool {
	switch strings.ToUpper(name) {
	case "BLPOP", "BRPOP", "BRPOPLPUSH", "SUBSCRIBE", "PSUBSCRIBE", "MONITOR", "SYNC":
		return true
	}
	return false
}

// ctxErr makes an error caused by ctx's end match ctx.Err() with
// errors.Is, whichever way redigo reported it.
func ctxErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if _, isReply := err.(redis.Error); isReply {
		return err
	}
	cerr := ctx.Err()
	if cerr == nil {
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			// The read deadline (set from ctx's) fired a moment before
			// ctx's own timer.
			cerr = context.DeadlineExceeded
		}
	}
	if cerr == nil || errors.Is(err, cerr) {
		return err
	}
	return fmt.Errorf("%w: %w", cerr, err)
}

func values(rep interface{}, err error) ([]interface{}, error) {
	if err != nil {
		return nil, err
	}
	if rep == nil {
		return nil, nil
	}
	return redis.Values(rep, nil)
}

// Cmd is one command: a name and its arguments.
type Cmd struct {
	Name string
	Args []interface{}
}

// Cmds is a list of commands to queue inside MULTI, built with
// [Cmds.Queue]: the writes of a [Step], or of a [Held.Exec].
type Cmds []Cmd

// Queue appends a command.
func (c *Cmds) Queue(name string, args ...interface{}) {
	*c = append(*c, Cmd{Name: name, Args: args})
}

// Tx is the view of one attempt of [Runner.Run]: reads go to the watched
// connection at once, writes are queued until MULTI. A Tx is not safe for
// concurrent use and is valid only during the call of the function it was
// given to.
type Tx struct {
	ctx     context.Context
	conn    redis.Conn
	r       *Runner
	hidden  int // pending replies of WATCH and UNWATCH, not returned by Flush
	sent    int // pending replies of Send
	sendErr error
	queued  Cmds
	hold    *Held
	done    bool // fn returned: no more reads
}

// Watch adds keys to the watched set. It may be called after reads, so a
// transaction can watch keys it only learns about by reading.
func (tx *Tx) Watch(keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	// Sent, not done: it travels with the first read.
	if err := tx.send("WATCH", watchCmd(keys).Args...); err != nil {
		return err
	}
	tx.hidden++
	return nil
}

func (tx *Tx) send(name string, args ...interface{}) error {
	if err := tx.conn.Send(name, args...); err != nil {
		tx.sendErr = fmt.Errorf("txn: send %s: %w", name, err)
		return tx.sendErr
	}
	return nil
}

// Do sends a read command on the watched connection and returns its reply,
// after the replies of any commands sent with [Tx.Send] (whose errors it
// also reports). Its round trip is bounded by Run's context.
func (tx *Tx) Do(name string, args ...interface{}) (interface{}, error) {
	if err := tx.checkRead(name); err != nil {
		return nil, err
	}
	if tx.sendErr != nil {
		return nil, tx.sendErr
	}
	tx.sent, tx.hidden = 0, 0
	rep, err := Do(tx.ctx, tx.conn, name, args...)
	if err != nil {
		return rep, fmt.Errorf("txn: %s: %w", name, err)
	}
	return rep, nil
}

// Send pipelines a read command; [Tx.Flush] returns the replies.
func (tx *Tx) Send(name string, args ...interface{}) error {
	if err := tx.checkRead(name); err != nil {
		return err
	}
	if err := tx.send(name, args...); err != nil {
		return err
	}
	tx.sent++
	return nil
}

// Flush sends the pipelined commands and returns their replies in order,
// in one round trip bounded by Run's context. An error reply of the server
// is returned as a redis.Error element, not as the error, so callers can
// judge each reply.
func (tx *Tx) Flush() ([]interface{}, error) {
	if tx.sendErr != nil {
		return nil, tx.sendErr
	}
	n, h := tx.sent, tx.hidden
	tx.sent, tx.hidden = 0, 0
	if n+h == 0 {
		return nil, nil
	}
	reps, err := values(Do(tx.ctx, tx.conn, ""))
	if err != nil {
		return nil, fmt.Errorf("txn: pipelined reads: %w", err)
	}
	if len(reps) != n+h {
		return nil, fmt.Errorf("txn: pipelined reads: %d replies for %d commands", len(reps), n+h)
	}
	for _, r := range reps[:h] {
		if e, ok := r.(redis.Error); ok {
			return nil, fmt.Errorf("txn: WATCH: %w", e)
		}
	}
	return reps[h:], nil
}

// Queue adds a write to run between MULTI and EXEC.
func (tx *Tx) Queue(name string, args ...interface{}) {
	tx.queued.Queue(name, args...)
}

// QueueAll adds writes to run between MULTI and EXEC, in order, as
// Queue would one by one.
func (tx *Tx) QueueAll(cmds Cmds) {
	tx.queued = append(tx.queued, cmds...)
}

// Hold asks Run to WATCH keys again right after this attempt's EXEC, in
// the same round trip, and to leave that watch on the connection for a
// later transaction: [Held.Exec] then writes without reading again,
// because any change to the keys meanwhile makes its EXEC answer nil.
//
// The Held is usable only if Run returns nil and this attempt is the one
// that committed (fn may run again after a conflict: set the variable that
// keeps the Held afresh on each call). Until the Held is used or released,
// nothing else may run on the connection; a pooled connection closed
// before that is unwatched by the pool.
func (tx *Tx) Hold(keys ...string) *Held {
	tx.hold = &Held{r: tx.r, conn: tx.conn, keys: append([]string(nil), keys...)}
	if tx.r.Fence != nil {
		tx.hold.keys = append(tx.hold.keys, tx.r.Fence.Key)
	}
	return tx.hold
}

func (tx *Tx) checkRead(name string) error {
	if tx.done {
		return errors.New("txn: a read after the transaction function returned")
	}
	switch strings.ToUpper(name) {
	case "MULTI", "EXEC", "DISCARD", "WATCH", "UNWATCH":
		return fmt.Errorf("txn: %s is sent by Run, not by the transaction function (use Tx.Watch)", name)
	}
	return nil
}

// unwatch ends the attempt without MULTI. It also flushes sends left
// unread (a WATCH with no read after it) and reports the first failure
// among them. If the connection is broken the pool discards it, and the
// server forgets the WATCH with it.
func (tx *Tx) unwatch() error {
	tx.sent, tx.hidden = 0, 0
	if tx.sendErr != nil {
		return tx.sendErr
	}
	if _, err := Do(tx.ctx, tx.conn, "UNWATCH"); err != nil {
		return fmt.Errorf("txn: UNWATCH: %w", err)
	}
	return nil
}
