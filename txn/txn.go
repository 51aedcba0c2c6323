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

// Runner runs optimistic transactions with bounded, jittered retries. The
// zero value is ready to use with the defaults above. A Runner may be used
// by many goroutines at once.
type Runner struct {
	// MaxAttempts bounds how often the function runs; zero means
	// DefaultMaxAttempts.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the wait between attempts, which
	// doubles from MinBackoff and is drawn at random below the bound (full
	// jitter); zero means the defaults.
	MinBackoff, MaxBackoff time.Duration

	conflicts atomic.Int64
}

// Conflicts reports how many times EXEC found a watched key changed.
func (r *Runner) Conflicts() int64 { return r.conflicts.Load() }

// AddConflict counts a conflict found outside Run (a pipelined
// transaction judged with ExecReplies).
func (r *Runner) AddConflict() { r.conflicts.Add(1) }

var defaultRunner Runner

// Run is [Runner.Run] on a shared Runner with the default settings.
func Run(ctx context.Context, conn redis.Conn, watch []string, fn func(*Tx) error) ([]interface{}, error) {
	return defaultRunner.Run(ctx, conn, watch, fn)
}

// Run WATCHes the keys in watch, calls fn to read through tx and queue
// writes with [Tx.Queue], then sends MULTI, the queued commands and EXEC in
// one round trip. It returns the EXEC reply, one element per queued command.
//
// When EXEC answers nil (a watched key changed) Run waits a jittered
// backoff and calls fn again, up to MaxAttempts; fn may therefore run
// several times and must decide from what it reads each time. If fn
// returns an error, Run unwatches and returns that error unchanged. If fn
// queues nothing, Run unwatches and returns (nil, nil).
//
// Every queued command is checked against Redis 2.4 before MULTI is sent;
// a refused one fails the attempt before anything is written. A command
// that fails while queueing or inside EXEC is returned as an [*ExecError];
// the replies are returned with it, because at 2.4 the other commands ran.
func (r *Runner) Run(ctx context.Context, conn redis.Conn, watch []string, fn func(*Tx) error) ([]interface{}, error) {
	attempts := r.MaxAttempts
	if attempts <= 0 {
		attempts = DefaultMaxAttempts
	}
	for attempt := 0; attempt < attempts; attempt++ {
		if attempt > 0 {
			if err := r.sleep(ctx, attempt); err != nil {
				return nil, err
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		replies, err := r.once(conn, watch, fn)
		if errors.Is(err, ErrNilExec) {
			r.conflicts.Add(1)
			continue
		}
		return replies, err
	}
	return nil, ErrConflict
}

func (r *Runner) once(conn redis.Conn, watch []string, fn func(*Tx) error) ([]interface{}, error) {
	tx := &Tx{conn: conn}
	if len(watch) > 0 {
		if err := tx.Watch(watch...); err != nil {
			return nil, err
		}
	}
	if err := fn(tx); err != nil {
		_ = tx.unwatch()
		return nil, err
	}
	if len(tx.queued) == 0 {
		return nil, tx.unwatch()
	}
	if err := Check(append(tx.queued[:len(tx.queued):len(tx.queued)], tx.after...)); err != nil {
		_ = tx.unwatch()
		return nil, err
	}
	if err := SendMulti(conn, tx.queued); err != nil {
		return nil, err
	}
	for _, c := range tx.after {
		if err := conn.Send(c.Name, c.Args...); err != nil {
			return nil, fmt.Errorf("txn: send %s: %w", c.Name, err)
		}
	}
	all, err := redis.Values(conn.Do(""))
	if err != nil {
		return nil, fmt.Errorf("txn: MULTI/EXEC: %w", err)
	}
	if len(all) < len(tx.after) {
		return nil, fmt.Errorf("txn: MULTI/EXEC: %d replies for %d commands", len(all), len(tx.queued)+len(tx.after))
	}
	for i, rep := range all[len(all)-len(tx.after):] {
		if e, ok := rep.(redis.Error); ok {
			return nil, fmt.Errorf("txn: %s after EXEC: %w", tx.after[i].Name, e)
		}
	}
	all = all[:len(all)-len(tx.after)]
	// Replies: those of sends left unread (a WATCH with no read after
	// it), then MULTI's OK, one QUEUED per command, EXEC's reply.
	skip := len(all) - (len(tx.queued) + 2)
	if skip < 0 {
		return nil, fmt.Errorf("txn: MULTI/EXEC: %d replies for %d commands", len(all), len(tx.queued))
	}
	for _, rep := range all[:skip] {
		if e, ok := rep.(redis.Error); ok {
			return nil, fmt.Errorf("txn: read before MULTI: %w", e)
		}
	}
	return ExecReplies(tx.queued, all[skip:])
}

// Check checks queued commands against Redis 2.4 before MULTI is sent:
// 2.4 drops a command it refuses while queueing and runs the rest.
func Check(queued []Cmd) error {
	for i, c := range queued {
		if err := redis24.Check(c.Name, c.Args...); err != nil {
			return fmt.Errorf("txn: command %d (%s) refused before MULTI: %w", i, c.Name, err)
		}
	}
	return nil
}

// SendMulti sends MULTI, the queued commands and EXEC without flushing.
func SendMulti(conn redis.Conn, queued []Cmd) error {
	if err := conn.Send("MULTI"); err != nil {
		return fmt.Errorf("txn: send MULTI: %w", err)
	}
	for _, c := range queued {
		if err := conn.Send(c.Name, c.Args...); err != nil {
			return fmt.Errorf("txn: send %s: %w", c.Name, err)
		}
	}
	if err := conn.Send("EXEC"); err != nil {
		return fmt.Errorf("txn: send EXEC: %w", err)
	}
	return nil
}

// ErrNilExec is what ExecReplies returns when EXEC answered nil: a watched
// key changed, and nothing was written. Run retries it; callers of
// ExecReplies decide for themselves.
var ErrNilExec = errors.New("txn: EXEC answered nil: a watched key changed")

// ExecReplies judges the replies to MULTI, the queued commands and EXEC
// (len(queued)+2 of them) and returns EXEC's reply, one element per
// command. It returns ErrNilExec when a watched key changed, an
// *ExecError for a command refused while queueing or failed inside EXEC
// (with the replies, since at 2.4 the others ran), or another error.
func ExecReplies(queued []Cmd, all []interface{}) ([]interface{}, error) {
	if len(all) != len(queued)+2 {
		return nil, fmt.Errorf("txn: MULTI/EXEC: %d replies for %d commands", len(all), len(queued))
	}
	if e, ok := all[0].(redis.Error); ok {
		return nil, fmt.Errorf("txn: MULTI: %w", e)
	}
	var queueErr *ExecError
	for i, q := range all[1 : len(all)-1] {
		if e, ok := q.(redis.Error); ok {
			queueErr = &ExecError{Index: i, Command: queued[i].Name, Queued: true, Err: e}
			break
		}
	}
	switch exec := all[len(all)-1].(type) {
	case nil:
		if queueErr != nil {
			return nil, queueErr
		}
		return nil, ErrNilExec
	case redis.Error:
		// 2.6.5 and later abort the whole transaction (EXECABORT) after a
		// queueing error; report the command that caused it.
		if queueErr != nil {
			return nil, queueErr
		}
		return nil, fmt.Errorf("txn: EXEC: %w", exec)
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
				return exec, &ExecError{Index: i, Command: name, Err: e}
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

func (r *Runner) sleep(ctx context.Context, attempt int) error {
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
	d = time.Duration(rand.Int64N(int64(d)) + 1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Cmd is one queued command.
type Cmd struct {
	Name string
	Args []interface{}
}

// Tx is the view of one attempt: reads go to the watched connection at
// once, writes are queued until MULTI. A Tx is not safe for concurrent use
// and is valid only during the call of the function it was given to.
type Tx struct {
	conn    redis.Conn
	hidden  int // pending replies of WATCH, not returned by Flush
	sent    int // pending replies of Send
	sendErr error
	queued  []Cmd
	after   []Cmd
}

// Watch adds keys to the watched set. It may be called after reads, so a
// transaction can watch keys it only learns about by reading.
func (tx *Tx) Watch(keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	args := make([]interface{}, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	// Sent, not done: it travels with the first read.
	if err := tx.conn.Send("WATCH", args...); err != nil {
		tx.sendErr = fmt.Errorf("txn: send WATCH: %w", err)
		return tx.sendErr
	}
	tx.hidden++
	return nil
}

// Do sends a read command on the watched connection and returns its reply,
// after the replies of any commands sent with [Tx.Send] (whose errors it
// also reports).
func (tx *Tx) Do(name string, args ...interface{}) (interface{}, error) {
	if err := tx.checkRead(name, args); err != nil {
		return nil, err
	}
	tx.sent, tx.hidden = 0, 0
	rep, err := tx.conn.Do(name, args...)
	if err != nil {
		return rep, fmt.Errorf("txn: %s: %w", name, err)
	}
	return rep, nil
}

// Send pipelines a read command; [Tx.Flush] returns the replies.
func (tx *Tx) Send(name string, args ...interface{}) error {
	if err := tx.checkRead(name, args); err != nil {
		return err
	}
	if err := tx.conn.Send(name, args...); err != nil {
		tx.sendErr = fmt.Errorf("txn: send %s: %w", name, err)
		return tx.sendErr
	}
	tx.sent++
	return nil
}

// Flush sends the pipelined commands and returns their replies in order.
// An error reply of the server is returned as a redis.Error element, not
// as the error, so callers can judge each reply.
func (tx *Tx) Flush() ([]interface{}, error) {
	if tx.sendErr != nil {
		return nil, tx.sendErr
	}
	n, h := tx.sent, tx.hidden
	tx.sent, tx.hidden = 0, 0
	if n+h == 0 {
		return nil, nil
	}
	reps, err := redis.Values(tx.conn.Do(""))
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
	tx.queued = append(tx.queued, Cmd{Name: name, Args: args})
}

// AfterExec adds a command to send right after EXEC, in the same round
// trip, whatever EXEC answers: typically a WATCH that the caller holds
// into its next transaction on this connection. Its reply is checked for
// errors but not returned.
func (tx *Tx) AfterExec(name string, args ...interface{}) {
	tx.after = append(tx.after, Cmd{Name: name, Args: args})
}

func (tx *Tx) checkRead(name string, args []interface{}) error {
	switch strings.ToUpper(name) {
	case "MULTI", "EXEC", "DISCARD":
		return fmt.Errorf("txn: %s is sent by Run, not by the transaction function", name)
	}
	return nil
}

// unwatch ends the attempt without MULTI. It also flushes sends left
// unread (a WATCH with no read after it) and reports the first failure
// among them. If the connection is broken the pool discards it, and the
// server forgets the WATCH with it.
func (tx *Tx) unwatch() error {
	tx.sent, tx.hidden = 0, 0
	if _, err := tx.conn.Do("UNWATCH"); err != nil {
		return fmt.Errorf("txn: UNWATCH: %w", err)
	}
	return nil
}
