package route

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// Verdict is what a [Target] makes of an error reply.
type Verdict int

// Verdicts of [Target.Judge].
const (
	// Keep: an ordinary error reply, shown to the caller.
	Keep Verdict = iota
	// Follow: the server ran nothing and the request belongs elsewhere;
	// the Target has learned where (or will find out in Addr).
	Follow
	// Wait: the server ran nothing; the same request may succeed after a
	// backoff (a slot being migrated, a cluster electing a master, a
	// server loading its data).
	Wait
)

// Target says where a [Conn]'s requests go.
type Target interface {
	// Addr returns the address requests go to now. It is called before
	// every batch that starts on a clean connection, so it must be cheap
	// when nothing changed; it may do I/O bounded by ctx.
	Addr(ctx context.Context) (string, error)
	// Dial opens a connection to addr.
	Dial(ctx context.Context, addr string) (redis.Conn, error)
	// Judge classifies an error reply that the server at addr gave, and
	// may update the Target (reload a slot map, ask sentinels again).
	Judge(ctx context.Context, reply redis.Error, addr string) Verdict
}

// Defaults of [Options].
const (
	DefaultMaxTries   = 16
	DefaultMinBackoff = 10 * time.Millisecond
	DefaultMaxBackoff = 500 * time.Millisecond
)

// Options bounds a [Conn]'s retries. Zero fields take the defaults.
type Options struct {
	// MaxTries bounds the sends of one lone command.
	MaxTries int
	// MinBackoff and MaxBackoff bound the jittered, doubling wait after a
	// Wait verdict or an unreachable server; it grows while such answers
	// follow one another and starts again after a batch that got none.
	MinBackoff, MaxBackoff time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxTries <= 0 {
		o.MaxTries = DefaultMaxTries
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(DefaultMaxBackoff, o.MinBackoff)
	}
	return o
}

// NotRunError is a request that no server ran: the Target judged an error
// reply as a redirection, or the server to send it to could not be
// reached. It matches [txn.ErrNotRun] with errors.Is, and the server's
// reply (a redis.Error) with errors.As when there was one.
type NotRunError struct {
	Addr string // the server that answered, or could not be reached
	Err  error  // its error reply, or the dial error
}

func (e *NotRunError) Error() string {
	if e.Addr == "" {
		return fmt.Sprintf("route: nothing was sent: %v", e.Err)
	}
	return fmt.Sprintf("route: %s ran nothing of the request: %v", e.Addr, e.Err)
}

// Unwrap returns txn.ErrNotRun and the cause.
func (e *NotRunError) Unwrap() []error { return []error{txn.ErrNotRun, e.Err} }

type cmd struct {
	name string
	args []interface{}
}

// Conn is a redigo connection whose batches go where a [Target] says. It
// implements redis.Conn, redis.ConnWithContext and redis.ConnWithTimeout.
// Like any redigo connection it is not safe for concurrent use.
type Conn struct {
	t    Target
	opts Options

	c                 redis.Conn // nil until routed, or after a drop
	addr              string
	stale             bool // a redirection was seen: ask the Target again
	watching, inMulti bool
	buf               []cmd    // sent, not yet written
	wire              []string // written, replies not yet read
	waits             int      // consecutive Wait verdicts and failed dials

	// c and err are written under mu, so that Close, which may be called
	// from another goroutine to end a blocked call, sees them whole.
	mu     sync.Mutex
	err    error // the connection is unusable
	closed bool
}

var (
	_ redis.ConnWithContext = (*Conn)(nil)
	_ redis.ConnWithTimeout = (*Conn)(nil)
)

// Dial returns a Conn connected to where t says now. When that server
// cannot be reached or the Target knows none (a failover under way), the
// Conn is returned anyway, unconnected: its first request tries again, and
// is retried as any request that no server ran.
func Dial(ctx context.Context, t Target, opts Options) (*Conn, error) {
	rc := &Conn{t: t, opts: opts.withDefaults()}
	if err := rc.route(ctx); err != nil {
		var nr *NotRunError
		if !errors.As(err, &nr) || ctx.Err() != nil {
			return nil, err
		}
	}
	return rc, nil
}

// Addr returns the address of the server the Conn is connected to ("" if
// none).
func (rc *Conn) Addr() string { return rc.addr }

// route connects to the Target's address when the Conn is not connected
// there. Called only with no reply outstanding.
func (rc *Conn) route(ctx context.Context) error {
	if rc.c != nil && rc.c.Err() != nil {
		return rc.c.Err()
	}
	addr, err := rc.t.Addr(ctx)
	if err != nil {
		return &NotRunError{Addr: rc.addr, Err: err}
	}
	if rc.c != nil && !rc.stale && addr == rc.addr {
		return nil
	}
	rc.drop()
	c, err := rc.t.Dial(ctx, addr)
	if err != nil {
		return &NotRunError{Addr: addr, Err: err}
	}
	rc.mu.Lock()
	if rc.closed {
		rc.mu.Unlock()
		c.Close()
		return errClosed
	}
	rc.c, rc.addr, rc.stale = c, addr, false
	rc.mu.Unlock()
	return nil
}

var errClosed = errors.New("route: connection closed")

// fail makes the connection unusable with err, closing the server
// connection.
func (rc *Conn) fail(err error) error {
	rc.mu.Lock()
	if rc.err == nil {
		rc.err = err
	}
	c := rc.c
	rc.mu.Unlock()
	if c != nil {
		c.Close()
	}
	return err
}

// broken returns the error of a server connection that failed. Nothing
// may be written to it then: when a call on it ended with its context,
// redigo's writer may still be using it.
func (rc *Conn) broken() error {
	if rc.c != nil {
		return rc.c.Err()
	}
	return nil
}

// drop closes the server connection, and with it any WATCH or MULTI open
// on it.
func (rc *Conn) drop() {
	rc.mu.Lock()
	c := rc.c
	rc.c = nil
	rc.mu.Unlock()
	if c != nil {
		c.Close()
	}
	rc.watching, rc.inMulti = false, false
	rc.wire = nil
}

// Close implements redis.Conn. It may be called while another goroutine
// waits in a call on the Conn: closing the server connection ends the wait.
func (rc *Conn) Close() error {
	rc.mu.Lock()
	rc.closed = true
	if rc.err == nil {
		rc.err = errClosed
	}
	c := rc.c
	rc.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.Close()
}

// Err implements redis.Conn: the error that made the connection unusable,
// nil while it can still be used (also when it is between servers).
func (rc *Conn) Err() error {
	rc.mu.Lock()
	err, c := rc.err, rc.c
	rc.mu.Unlock()
	if err != nil {
		return err
	}
	if c != nil {
		return c.Err()
	}
	return nil
}

// usable returns the error that made the connection unusable.
func (rc *Conn) usable() error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.err
}

// Send implements redis.Conn: the command is written with the batch, at
// the next Do, Flush or Receive.
func (rc *Conn) Send(name string, args ...interface{}) error {
	if err := rc.usable(); err != nil {
		return err
	}
	rc.buf = append(rc.buf, cmd{name, args})
	return nil
}

// write writes the buffered commands but the last keep (0 or 1), which it
// returns for the caller to send with Do, routing first when the
// connection is clean. The transaction state follows every command.
func (rc *Conn) write(ctx context.Context, keep int) ([]cmd, error) {
	if err := rc.usable(); err != nil {
		rc.buf = nil
		return nil, err
	}
	if len(rc.buf) == 0 {
		return nil, nil
	}
	if err := rc.broken(); err != nil {
		rc.buf = nil
		return nil, err
	}
	if len(rc.wire) == 0 && (rc.c == nil || (!rc.watching && !rc.inMulti)) {
		if err := rc.route(ctx); err != nil {
			rc.buf = nil
			return nil, err
		}
	}
	buf := rc.buf
	rc.buf = nil
	for i, c := range buf {
		if i < len(buf)-keep {
			if err := rc.c.Send(c.name, c.args...); err != nil {
				// Part of the batch may be written: the connection is done.
				return nil, rc.fail(fmt.Errorf("route: send %s: %w", c.name, err))
			}
		}
		rc.wire = append(rc.wire, c.name)
		switch strings.ToUpper(c.name) {
		case "WATCH":
			rc.watching = true
		case "UNWATCH":
			rc.watching = false
		case "MULTI":
			rc.inMulti = true
		case "EXEC", "DISCARD":
			rc.watching, rc.inMulti = false, false
		}
	}
	return buf[len(buf)-keep:], nil
}

// Flush implements redis.Conn.
func (rc *Conn) Flush() error {
	ctx, cancel := context.WithTimeout(context.Background(), rc.opts.MaxBackoff+5*time.Second)
	defer cancel()
	if _, err := rc.write(ctx, 0); err != nil {
		return err
	}
	if rc.c == nil {
		return nil
	}
	if err := rc.broken(); err != nil {
		return err
	}
	return rc.c.Flush()
}

// Do implements redis.Conn.
func (rc *Conn) Do(name string, args ...interface{}) (interface{}, error) {
	return rc.DoContext(context.Background(), name, args...)
}

// DoContext implements redis.ConnWithContext.
func (rc *Conn) DoContext(ctx context.Context, name string, args ...interface{}) (interface{}, error) {
	return rc.do(ctx, func(c redis.Conn, name string, args []interface{}) (interface{}, error) {
		return redis.DoContext(c, ctx, name, args...)
	}, name, args)
}

// DoWithTimeout implements redis.ConnWithTimeout: the read waits up to
// timeout, whatever the connection's own read timeout (a blocking pop
// needs that).
func (rc *Conn) DoWithTimeout(timeout time.Duration, name string, args ...interface{}) (interface{}, error) {
	ctx := context.Background()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return rc.do(ctx, func(c redis.Conn, name string, args []interface{}) (interface{}, error) {
		rep, err := redis.DoWithTimeout(c, timeout, name, args...)
		if err == errNoTimeout {
			// The server connection takes no per-call timeout, and said so
			// before sending anything: the batch is still to be sent, on
			// the context's deadline.
			return redis.DoContext(c, ctx, name, args...)
		}
		return rep, err
	}, name, args)
}

// errNoTimeout is redigo's error for a connection without
// redis.ConnWithTimeout, returned before anything is sent.
var errNoTimeout = func() error {
	_, err := redis.DoWithTimeout(struct{ redis.Conn }{}, 0, "")
	return err
}()

// doFunc is one redigo Do on the server connection.
type doFunc func(c redis.Conn, name string, args []interface{}) (interface{}, error)

// do runs one batch, the buffered commands and name (if not empty), and
// returns what redigo's Do does: every reply for name "", else the last
// reply and the first error reply. name itself goes to the server
// connection's Do, as the caller sent it. A batch outside a transaction
// that no server ran is sent again, whole, where the Target now says.
func (rc *Conn) do(ctx context.Context, do doFunc, name string, args []interface{}) (interface{}, error) {
	// A batch outside any transaction, whose every command is in it, may
	// be sent again whole when nothing of it ran.
	sent := append([]cmd(nil), rc.buf...)
	if name != "" {
		sent = append(sent, cmd{name, args})
	}
	lone := len(sent) > 0 && len(rc.wire) == 0 && !rc.watching && !rc.inMulti
	for _, c := range sent {
		lone = lone && !txnCommand(c.name)
	}
	for try := 1; ; try++ {
		rc.buf = append(rc.buf[:0], sent...)
		rep, v, wrote, err := rc.batch(ctx, do, name != "")
		if err != nil {
			var nr *NotRunError
			if errors.As(err, &nr) && ctx.Err() == nil {
				if werr := rc.backoff(ctx); werr != nil {
					return nil, fmt.Errorf("%w (after %w)", werr, err)
				}
				if lone && try < rc.opts.MaxTries {
					continue
				}
			}
			return rep, err
		}
		if v.verdict != Keep && !wrote {
			nr := &NotRunError{Addr: v.addr, Err: v.reply}
			if v.verdict == Wait {
				if werr := rc.backoff(ctx); werr != nil {
					return nil, fmt.Errorf("%w (after %w)", werr, nr)
				}
			}
			if lone && try < rc.opts.MaxTries {
				continue
			}
			return nil, nr
		}
		if v.reply != "" && name != "" {
			return rep, v.reply
		}
		return rep, nil
	}
}

type judged struct {
	verdict Verdict
	reply   redis.Error
	addr    string
}

// batch writes the buffer and reads every outstanding reply: all of them
// as an array when last is false, else through the server connection's Do
// with the last buffered command (its reply and the first error reply).
// The judged reply is the first error reply the Target judged, or, with
// last, the first error reply.
func (rc *Conn) batch(ctx context.Context, do doFunc, last bool) (interface{}, judged, bool, error) {
	keep := 0
	if last {
		keep = 1
	}
	kept, err := rc.write(ctx, keep)
	if err != nil {
		rc.waits++
		return nil, judged{}, false, err
	}
	if len(rc.wire) == 0 {
		return nil, judged{}, false, nil
	}
	if err := rc.broken(); err != nil {
		return nil, judged{}, false, err
	}
	names := rc.wire
	rc.wire = nil
	if last {
		rep, err := do(rc.c, kept[0].name, kept[0].args)
		e, isReply := err.(redis.Error)
		if err != nil && !isReply {
			return nil, judged{}, false, err
		}
		if !isReply {
			rc.waits = 0
			return rep, judged{}, false, nil
		}
		// Which command failed is not known: judge as if every command
		// that may write did, but the last one if it is the one that
		// failed alone.
		j := rc.judge(ctx, []interface{}{e})
		j.reply = e
		reps := make([]interface{}, len(names))
		for i := range reps[:len(reps)-1] {
			reps[i] = "OK"
			if isExec(names[i]) {
				reps[i] = []interface{}{} // it may have run
			}
		}
		reps[len(reps)-1] = e
		return rep, j, wrote(names, reps), nil
	}
	rep, err := do(rc.c, "", nil)
	if err != nil {
		return nil, judged{}, false, err
	}
	reps, err := redis.Values(rep, nil)
	if err != nil || len(reps) != len(names) {
		return nil, judged{}, false, rc.fail(fmt.Errorf("route: %d replies for %d commands (%v)", len(reps), len(names), err))
	}
	j := rc.judge(ctx, reps)
	return reps, j, wrote(names, reps), nil
}

// judge shows the error replies to the Target until one is a redirection
// or a wait. A WATCH or MULTI open on the server is then dropped with its
// connection, and after a redirection the next batch connects again.
func (rc *Conn) judge(ctx context.Context, reps []interface{}) judged {
	j := judged{addr: rc.addr}
	for _, r := range reps {
		e, ok := r.(redis.Error)
		if !ok {
			continue
		}
		if v := rc.t.Judge(ctx, e, rc.addr); v != Keep {
			j.verdict, j.reply = v, e
			break
		}
	}
	if j.verdict == Keep {
		rc.waits = 0
		return j
	}
	if rc.watching || rc.inMulti {
		rc.drop()
	}
	if j.verdict == Follow {
		// Connect again even if the Target names the same address.
		rc.stale, rc.waits = true, 0
	} else {
		rc.waits++
	}
	return j
}

// backoff waits a jittered delay that doubles with each consecutive wait.
func (rc *Conn) backoff(ctx context.Context) error {
	d := rc.opts.MinBackoff << min(max(rc.waits-1, 0), 16)
	if d > rc.opts.MaxBackoff || d <= 0 {
		d = rc.opts.MaxBackoff
	}
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Receive implements redis.Conn.
func (rc *Conn) Receive() (interface{}, error) {
	return rc.receive(func(c redis.Conn) (interface{}, error) { return c.Receive() })
}

// ReceiveContext implements redis.ConnWithContext.
func (rc *Conn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return rc.receive(func(c redis.Conn) (interface{}, error) { return redis.ReceiveContext(c, ctx) })
}

// ReceiveWithTimeout implements redis.ConnWithTimeout.
func (rc *Conn) ReceiveWithTimeout(timeout time.Duration) (interface{}, error) {
	return rc.receive(func(c redis.Conn) (interface{}, error) { return redis.ReceiveWithTimeout(c, timeout) })
}

// receive reads one reply; buffered commands are written and flushed
// first. A redirection is noted (the next batch asks the Target again)
// and returned as it is.
func (rc *Conn) receive(read func(redis.Conn) (interface{}, error)) (interface{}, error) {
	if len(rc.buf) > 0 {
		if err := rc.Flush(); err != nil {
			return nil, err
		}
	}
	if err := rc.usable(); err != nil {
		return nil, err
	}
	if rc.c == nil {
		return nil, errors.New("route: receive with nothing sent")
	}
	if err := rc.broken(); err != nil {
		return nil, err
	}
	rep, err := read(rc.c)
	if len(rc.wire) > 0 {
		rc.wire = rc.wire[1:]
	}
	if e, ok := rep.(redis.Error); ok {
		rc.judge(context.Background(), []interface{}{e})
	}
	if e, ok := err.(redis.Error); ok {
		rc.judge(context.Background(), []interface{}{e})
	}
	return rep, err
}

// isExec reports whether name is EXEC.
func isExec(name string) bool {
	switch strings.ToUpper(name) {
	case "EXEC":
		return true
	}
	return false
}

// txnCommand reports commands that open or close a transaction: never sent
// again on their own.
func txnCommand(name string) bool {
	switch strings.ToUpper(name) {
	case "WATCH", "UNWATCH", "MULTI", "EXEC", "DISCARD":
		return true
	}
	return false
}

// wrote reports whether a batch changed data: an EXEC that ran, or a
// command outside MULTI that is not a known read and did not fail.
func wrote(names []string, reps []interface{}) bool {
	multi := false
	for i, n := range names {
		r := reps[i]
		switch strings.ToLower(n) {
		case "multi":
			multi = true
			continue
		case "exec":
			multi = false
			if _, ok := r.([]interface{}); ok {
				return true
			}
			continue
		case "discard":
			multi = false
			continue
		}
		if multi {
			continue
		}
		if _, failed := r.(redis.Error); failed {
			continue
		}
		if !reads[strings.ToLower(n)] {
			return true
		}
	}
	return false
}

// reads are commands that change no data.
var reads = func() map[string]bool {
	m := map[string]bool{}
	for _, n := range strings.Fields(`get mget strlen exists getbit getrange substr
		llen lrange lindex scard sismember smembers srandmember sinter sunion sdiff
		zrange zrangebyscore zrevrangebyscore zrevrange zcount zcard zscore zrank zrevrank
		hget hmget hlen hkeys hvals hgetall hexists type ttl keys randomkey dbsize
		info ping echo role watch unwatch lastsave`) {
		m[n] = true
	}
	return m
}()
