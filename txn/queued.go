package txn

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/bucketq/bucketq/internal/redisinfo"
	"github.com/gomodule/redigo/redis"
)

// ErrFull marks a write the server refused because its memory is at
// maxmemory ("command not allowed when used memory > 'maxmemory'", or
// Redis 7's OOM error). The transaction wrote nothing; the same write may
// go through once memory is freed.
var ErrFull = errors.New("txn: the server is out of memory (maxmemory)")

// fullError is a server's maxmemory refusal: it matches ErrFull and
// unwraps to the server's own reply.
type fullError struct{ reply redis.Error }

func (e fullError) Error() string        { return string(e.reply) }
func (e fullError) Is(target error) bool { return target == ErrFull }
func (e fullError) Unwrap() error        { return e.reply }

// replyError returns e as an error, marked with ErrFull when it is a
// maxmemory refusal.
func replyError(e redis.Error) error {
	if isFull(e) {
		return fullError{e}
	}
	return e
}

func isFull(e redis.Error) bool {
	s := string(e)
	return strings.HasPrefix(s, "OOM ") || strings.Contains(s, "used memory > 'maxmemory'")
}

// Queue modes of a Runner's server: how it treats a transaction one of
// whose commands it refused while queueing.
const (
	modeUnknown int32 = iota
	modeAborts        // 2.6.5 and later: EXEC aborts the whole transaction
	modeRuns          // older: the refused command is dropped, EXEC runs the rest
)

// checkQueued reports whether transactions on conn's server must read the
// replies to their queued commands before sending EXEC: servers older than
// 2.6.5 drop a command they refuse while queueing (at maxmemory, every
// write) and run the rest at EXEC, so a transaction would be written in
// part. The server's version is read once per Runner (INFO); a server that
// does not say its version is treated as old, which costs a round trip per
// transaction and is always safe.
func (r *Runner) checkQueued(ctx context.Context, conn redis.Conn) (bool, error) {
	switch r.mode.Load() {
	case modeAborts:
		return false, nil
	case modeRuns:
		return true, nil
	}
	rep, err := Do(ctx, conn, "INFO")
	if err != nil {
		if _, isReply := err.(redis.Error); !isReply {
			return false, fmt.Errorf("txn: INFO (the server's version): %w", err)
		}
		rep = "" // INFO refused or renamed: assume the old behaviour
	}
	info, _ := redis.String(rep, nil)
	mode := modeRuns
	if abortsOnQueueError(info) {
		mode = modeAborts
	}
	r.mode.CompareAndSwap(modeUnknown, mode)
	return mode == modeRuns, nil
}

// abortsOnQueueError reports whether the redis_version that INFO gave is
// 2.6.5 or later.
func abortsOnQueueError(info string) bool {
	v, ok := redisinfo.Field(info, "redis_version")
	if !ok {
		return false
	}
	var n [3]int
	for i, part := range strings.SplitN(v, ".", 3) {
		n[i], _ = strconv.Atoi(part)
	}
	return n[0] > 2 || n[0] == 2 && (n[1] > 6 || n[1] == 6 && n[2] >= 5)
}

// openMulti is the first half of a transaction on a server that runs the
// rest after refusing a queued command: it sends MULTI and queued behind
// the commands already sent on conn and not read (pre of them, counted by
// the caller) and reads every reply. When MULTI or a queued command was
// refused it DISCARDs, so that nothing is written and the connection is
// out of MULTI, and returns an *ExecError with Queued set. Otherwise the
// connection is inside MULTI and the caller sends EXEC. It returns the
// replies of the earlier commands and those of MULTI and queued.
func openMulti(ctx context.Context, conn redis.Conn, pre int, queued []Cmd) (before, multi []interface{}, err error) {
	if err := conn.Send("MULTI"); err != nil {
		return nil, nil, fmt.Errorf("txn: send MULTI: %w", err)
	}
	if err := sendAll(conn, queued); err != nil {
		return nil, nil, err
	}
	all, err := values(Do(ctx, conn, ""))
	if err != nil {
		return nil, nil, fmt.Errorf("txn: MULTI: %w", err)
	}
	if len(all) != pre+1+len(queued) {
		return nil, nil, discardAfter(ctx, conn, fmt.Errorf("txn: MULTI: %d replies for %d commands", len(all), pre+1+len(queued)))
	}
	before, multi = all[:pre], all[pre:]
	if e, ok := multi[0].(redis.Error); ok {
		return before, multi, discardAfter(ctx, conn, fmt.Errorf("txn: MULTI: %w", replyError(e)))
	}
	for i, q := range multi[1:] {
		if e, ok := q.(redis.Error); ok {
			return before, multi, discardAfter(ctx, conn, &ExecError{Index: i, Command: queued[i].Name, Queued: true, Err: replyError(e), Commands: queued})
		}
	}
	return before, multi, nil
}

// discardAfter sends DISCARD and UNWATCH in one round trip, which ends a
// MULTI left open and forgets every watch whatever state the connection
// is in (outside MULTI, DISCARD answers an error, which is fine), and
// returns err. If they get no answer the connection is closed, so that no
// pool hands it out in an unknown state.
func discardAfter(ctx context.Context, conn redis.Conn, err error) error {
	derr := conn.Send("DISCARD")
	if derr == nil {
		_, derr = Do(ctx, conn, "UNWATCH")
	}
	if derr != nil {
		if _, isReply := derr.(redis.Error); !isReply {
			_ = conn.Close()
			return fmt.Errorf("%w (DISCARD: %w)", err, derr)
		}
	}
	return err
}

// execFailed reports whether EXEC's reply is an error: the server may
// have left the connection inside MULTI (Redis 2.4 refuses EXEC itself at
// maxmemory and keeps the transaction open), so the caller must
// discardAfter before the connection is used again.
func execFailed(rep interface{}) bool {
	_, ok := rep.(redis.Error)
	return ok
}
