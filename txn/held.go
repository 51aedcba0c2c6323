package txn

import (
	"context"
	"errors"
	"fmt"

	"github.com/gomodule/redigo/redis"
)

// Held is a watch that a committed transaction left on its connection
// ([Tx.Hold]). It lets the next transaction on that connection skip the
// WATCH and the read: [Held.Exec] sends MULTI, the writes, EXEC and any
// commands to run after it in one round trip, and EXEC answers nil if a
// held key changed since the watch was set.
//
// A Held is used once: by Exec or by Release. It is not safe for
// concurrent use, and nothing else may run on its connection meanwhile.
type Held struct {
	r      *Runner
	conn   redis.Conn
	keys   []string
	active bool
}

// Conn is the connection that holds the watch.
func (h *Held) Conn() redis.Conn { return h.conn }

// Exec runs queued as one MULTI/EXEC under the held watch and sends after
// right behind EXEC, in the same round trip (bounded by ctx). It returns
// EXEC's reply (one element per queued command) and the replies to after,
// in order, error replies included as redis.Error elements.
//
// If a held key changed, nothing is written, the conflict is counted and
// Exec returns an error wrapping [ErrConflict]; after still ran, and its
// replies are returned. As in [Runner.Run], the commands are checked
// against Redis 2.4 before anything is sent, and a command that fails
// while queueing or inside EXEC is reported as an [*ExecError]. A
// transaction refused as a whole (a command refused while queueing, or
// EXEC refused at maxmemory) writes nothing; on a server older than 2.6.5
// after is then not run either, and its replies are nil. The watch is
// used up whatever happens.
func (h *Held) Exec(ctx context.Context, queued []Cmd, after ...Cmd) (replies, afterReplies []interface{}, err error) {
	if h == nil || !h.active {
		return nil, nil, ErrNotHeld
	}
	h.active = false
	if err := check(queued, after); err != nil {
		_ = h.unwatch(ctx)
		return nil, nil, err
	}
	n := 1                  // UNWATCH
	var multi []interface{} // MULTI's and queued's replies, read before EXEC (see Tx.commit)
	switch {
	case len(queued) > 0 && h.r.mode.Load() != modeAborts:
		var err error
		if _, multi, err = openMulti(ctx, h.conn, 0, queued); err != nil {
			// Refused while queueing and discarded (or the connection
			// failed): nothing written, and after is not sent.
			return nil, nil, err
		}
		if err := h.conn.Send("EXEC"); err != nil {
			return nil, nil, fmt.Errorf("txn: send EXEC: %w", err)
		}
	case len(queued) > 0:
		if err := sendMulti(h.conn, queued); err != nil {
			return nil, nil, err
		}
		n = len(queued) + 2
	default:
		if err := h.conn.Send("UNWATCH"); err != nil {
			return nil, nil, fmt.Errorf("txn: send UNWATCH: %w", err)
		}
	}
	if err := sendAll(h.conn, after); err != nil {
		return nil, nil, err
	}
	all, err := values(Do(ctx, h.conn, ""))
	if err != nil {
		return nil, nil, fmt.Errorf("txn: MULTI/EXEC: %w", err)
	}
	if len(all) != n+len(after) {
		return nil, nil, fmt.Errorf("txn: MULTI/EXEC: %d replies to %d commands", len(all), n+len(after))
	}
	afterReplies = all[n:]
	if len(queued) == 0 {
		return nil, afterReplies, nil
	}
	execAll := all[:n]
	if multi != nil {
		execAll = append(multi, all[0])
	}
	replies, err = execReplies(queued, execAll)
	if multi != nil && execFailed(all[0]) {
		// Redis 2.4 refused EXEC (at maxmemory) and kept the transaction
		// open, with after queued in it: after did not run.
		return nil, nil, discardAfter(ctx, h.conn, err)
	}
	if errors.Is(err, errNilExec) {
		h.r.conflicts.Add(1)
	}
	return replies, afterReplies, err
}

// Release gives up the watch (UNWATCH, bounded by ctx) without writing.
// Releasing a Held that is not active does nothing.
func (h *Held) Release(ctx context.Context) error {
	if h == nil || !h.active {
		return nil
	}
	h.active = false
	return h.unwatch(ctx)
}

func (h *Held) unwatch(ctx context.Context) error {
	if _, err := Do(ctx, h.conn, "UNWATCH"); err != nil {
		return fmt.Errorf("txn: UNWATCH: %w", err)
	}
	return nil
}
