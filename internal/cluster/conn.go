package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
)

// boundConn is the connection a transaction function gets: every Do and
// Receive is bounded by ctx (redigo's DoContext and ReceiveContext), Close
// does nothing (the Router returns the connection to its pool), and, after
// an ASK, every command outside MULTI is preceded by ASKING, whose reply is
// read and dropped. Redis keeps the ASKING flag of a client from MULTI to
// EXEC, so queued commands need none (an ASKING inside MULTI would be
// queued and answer in EXEC's reply).
type boundConn struct {
	c       redis.Conn
	ctx     context.Context
	asking  bool
	inMulti bool
	drops   []bool // per pending Send: an ASKING reply comes first
}

var (
	_ redis.ConnWithContext = (*boundConn)(nil)
	_ redis.ConnWithTimeout = (*boundConn)(nil)
)

func (b *boundConn) Close() error { return nil }
func (b *boundConn) Err() error   { return b.c.Err() }
func (b *boundConn) Flush() error { return b.c.Flush() }

// prefix sends ASKING when the command needs it and tracks MULTI.
func (b *boundConn) prefix(cmd string) (bool, error) {
	asked := false
	if b.asking && !b.inMulti && cmd != "" {
		if err := b.c.Send("ASKING"); err != nil {
			return false, err
		}
		asked = true
	}
	switch strings.ToUpper(cmd) {
	case "MULTI":
		b.inMulti = true
	case "EXEC", "DISCARD":
		b.inMulti = false
	}
	return asked, nil
}

func (b *boundConn) Send(cmd string, args ...interface{}) error {
	asked, err := b.prefix(cmd)
	if err != nil {
		return err
	}
	b.drops = append(b.drops, asked)
	return b.c.Send(cmd, args...)
}

func (b *boundConn) Do(cmd string, args ...interface{}) (interface{}, error) {
	return b.DoContext(b.ctx, cmd, args...)
}

func (b *boundConn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	// A connection whose earlier call ended with its context is broken:
	// redigo may still be writing that call in the background, so it must
	// not be written to again.
	if err := b.c.Err(); err != nil {
		return nil, err
	}
	drops := b.drops
	b.drops = nil
	if _, err := b.prefix(cmd); err != nil {
		return nil, err
	}
	reply, err := redis.DoContext(b.c, ctx, cmd, args...)
	err = ctxErr(ctx, err)
	if cmd != "" || err != nil {
		// Do returns the last reply; an ASKING answers OK, never an error.
		return reply, err
	}
	all, ok := reply.([]interface{})
	if !ok {
		return reply, err
	}
	kept := make([]interface{}, 0, len(drops))
	i := 0
	for _, drop := range drops {
		if drop {
			i++
		}
		if i < len(all) {
			kept = append(kept, all[i])
		}
		i++
	}
	return kept, nil
}

func (b *boundConn) DoWithTimeout(timeout time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	return b.DoContext(ctx, cmd, args...)
}

func (b *boundConn) Receive() (interface{}, error) { return b.ReceiveContext(b.ctx) }

func (b *boundConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	if len(b.drops) > 0 {
		drop := b.drops[0]
		b.drops = b.drops[1:]
		if drop {
			if _, err := redis.ReceiveContext(b.c, ctx); err != nil {
				return nil, ctxErr(ctx, err)
			}
		}
	}
	reply, err := redis.ReceiveContext(b.c, ctx)
	return reply, ctxErr(ctx, err)
}

// ctxErr makes an error caused by the end of ctx (redigo may report it as
// the read deadline it set from ctx) match ctx.Err() with errors.Is.
func ctxErr(ctx context.Context, err error) error {
	if err == nil {
		return err
	}
	cerr := ctx.Err()
	if d, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(d) {
		// The deadline has passed but ctx's timer has not fired yet.
		cerr = context.DeadlineExceeded
	}
	if cerr == nil || errors.Is(err, cerr) {
		return err
	}
	return fmt.Errorf("%w: %w", cerr, err)
}

func (b *boundConn) ReceiveWithTimeout(timeout time.Duration) (interface{}, error) {
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	return b.ReceiveContext(ctx)
}
