package cluster

import (
	"context"
	"errors"
	"fmt"

	"github.com/gomodule/redigo/redis"
)

// Txn runs fn, one whole optimistic transaction (WATCH, reads, MULTI,
// queued writes, EXEC), on the master of the slot of keys, and runs it again
// from the start, on the node the cluster names, when it ends in MOVED, ASK,
// TRYAGAIN or CLUSTERDOWN: replies after which Redis has run none of it
// (a redirected command inside MULTI makes EXEC abort the transaction).
// Other errors, a lost connection among them, are returned at once, since
// the transaction may have been applied. fn may therefore run several
// times; it must start from WATCH each time and keep nothing from a run
// that failed.
//
// keys must list every key fn touches: they all have to hash to one slot,
// or Txn returns ErrCrossSlot before sending anything, and after an ASK
// they are what Txn asks about (one EXISTS on the node that answered ASK)
// to learn whether they have all left it. Only then is the transaction run
// on the importing node, each command outside MULTI preceded by ASKING; while
// some have moved and some not, reads on either node would see half the
// data, so Txn waits as for TRYAGAIN.
//
// The connection given to fn bounds every Do and Receive by ctx; Close on
// it does nothing. Tries are bounded by Options.MaxTries; when they are used
// up the error wraps ErrTriesExhausted and the last redirection.
func (r *Router) Txn(ctx context.Context, keys []string, fn func(conn redis.Conn) error) error {
	if len(keys) == 0 {
		return ErrNoKeys
	}
	slot := Slot(keys[0])
	for _, k := range keys[1:] {
		if s := Slot(k); s != slot {
			return fmt.Errorf("%w: %q is in slot %d, %q in slot %d", ErrCrossSlot, keys[0], slot, k, s)
		}
	}
	askAddr := ""
	var last error
	for try := 0; try < r.opts.MaxTries; try++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("cluster: transaction on slot %d: %w", slot, err)
		}
		addr := askAddr
		if addr == "" {
			a, err := r.Master(ctx, slot)
			if err != nil {
				return err
			}
			addr = a
		}
		c, err := r.conn(ctx, addr)
		if err != nil {
			// Nothing was sent: look for the slot's master again.
			if errors.Is(err, ErrClosed) || ctx.Err() != nil {
				return err
			}
			last, askAddr = err, ""
			_ = r.Refresh(ctx)
			if err := r.backoff(ctx, try); err != nil {
				return fmt.Errorf("cluster: transaction on slot %d: %w (after %w)", slot, err, last)
			}
			continue
		}
		err = fn(&boundConn{c: c, ctx: ctx, asking: askAddr != ""})
		c.Close()
		wasAsk := askAddr != ""
		askAddr = ""
		if err == nil {
			return nil
		}
		rd, ok := r.Redirected(ctx, err, addr)
		if !ok {
			return err
		}
		last = err
		if rd.Kind == KindAsk && !wasAsk {
			if rd, err = r.keysLeft(ctx, addr, keys); err != nil {
				return err
			}
			if rd.Kind == KindAsk {
				askAddr = rd.Addr
				continue
			}
		}
		if rd.Kind != KindMoved {
			if err := r.backoff(ctx, try); err != nil {
				return fmt.Errorf("cluster: transaction on slot %d: %w (after %w)", slot, err, last)
			}
		}
	}
	return fmt.Errorf("%w: transaction on slot %d, %d tries: %w", ErrTriesExhausted, slot, r.opts.MaxTries, last)
}

// keysLeft asks the node migrating a slot, with one EXISTS over keys,
// whether they have all left it: it answers ASK (go to the importing node)
// when none is there, TRYAGAIN when some are. Any other answer is reported
// as TRYAGAIN so that the caller waits and starts again from the map.
func (r *Router) keysLeft(ctx context.Context, addr string, keys []string) (*Redirect, error) {
	c, err := r.conn(ctx, addr)
	if err != nil {
		return &Redirect{Kind: KindTryAgain}, nil
	}
	defer c.Close()
	args := make([]interface{}, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	_, err = redis.DoContext(c, ctx, "EXISTS", args...)
	if err == nil {
		return &Redirect{Kind: KindTryAgain}, nil
	}
	if rd, ok := r.Redirected(ctx, err, addr); ok {
		return rd, nil
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("cluster: EXISTS on %s: %w", addr, err)
	}
	return &Redirect{Kind: KindTryAgain}, nil
}
