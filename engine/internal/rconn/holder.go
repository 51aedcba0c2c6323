package rconn

import (
	"context"
	"errors"

	"github.com/gomodule/redigo/redis"
)

// Holder keeps one pooled connection for a loop and replaces it after an
// error, since a redigo connection that failed is not reusable.
//
// After an error the pool's idle connections may all be dead too (the
// server restarted, a proxy cut every connection, the server's idle
// timeout closed them): the next Get then tests each connection it
// borrows with a PING and throws dead ones away, and dials a fresh one
// when the pool has no live one, so that recovery takes one round trip
// instead of one failed command and one backoff per dead connection.
type Holder struct {
	Pool *redis.Pool
	conn redis.Conn
	test bool // an error was seen: test what the pool hands out
}

// maxTests bounds the idle connections tested on one Get before dialling.
const maxTests = 8

// Get returns the held connection, or a live one from the pool.
func (h *Holder) Get(ctx context.Context) (redis.Conn, error) {
	if h.conn != nil {
		if h.conn.Err() == nil {
			return h.conn, nil
		}
		h.Drop()
	}
	if !h.test {
		c, err := h.Pool.GetContext(ctx)
		if err != nil {
			return nil, err
		}
		h.conn = c
		return c, nil
	}
	for i := 0; i < maxTests; i++ {
		c, err := h.Pool.GetContext(ctx)
		if err != nil {
			return nil, err
		}
		if _, err := redis.DoContext(c, ctx, "PING"); err == nil {
			h.conn, h.test = c, false
			return c, nil
		}
		c.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	c, err := DialFresh(ctx, h.Pool)
	if err != nil {
		return nil, err
	}
	h.conn, h.test = c, false
	return c, nil
}

// Drop discards the connection after an error; the next Get tests what
// the pool hands out.
func (h *Holder) Drop() {
	if h.conn != nil {
		h.conn.Close()
		h.conn = nil
	}
	h.test = true
}

// Close gives the connection back to the pool.
func (h *Holder) Close() {
	if h.conn != nil {
		h.conn.Close()
		h.conn = nil
	}
}

// Conn is the held connection, nil when none.
func (h *Holder) Conn() redis.Conn { return h.conn }

// DialFresh dials a new connection with the pool's dial function, outside
// the pool.
func DialFresh(ctx context.Context, pool *redis.Pool) (redis.Conn, error) {
	switch {
	case pool.DialContext != nil:
		return pool.DialContext(ctx)
	case pool.Dial != nil:
		return pool.Dial()
	}
	return nil, errors.New("engine: the pool has no Dial function")
}
