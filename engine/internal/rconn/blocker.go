package rconn

import (
	"context"
	"errors"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Blocker is a dedicated connection for blocking pops, dialled with the
// pool's dial function but kept out of the pool: a blocked BLPOP needs a
// read timeout longer than its own timeout, and must be interrupted by
// closing the connection when its context ends.
type Blocker struct {
	Pool *redis.Pool
	conn redis.Conn
}

func (b *Blocker) get(ctx context.Context) (redis.Conn, error) {
	if b.conn != nil && b.conn.Err() == nil {
		return b.conn, nil
	}
	b.Close()
	c, err := DialFresh(ctx, b.Pool)
	if err != nil {
		return nil, err
	}
	b.conn = c
	return c, nil
}

// Close closes the connection.
func (b *Blocker) Close() {
	if b.conn != nil {
		b.conn.Close()
		b.conn = nil
	}
}

// Pop waits up to wait (whole seconds: Redis 2.4 refuses fractions) for a
// token on any of keys with BLPOP. It returns the key that had one, or ""
// on timeout. The read timeout allows for 2.4 firing a timeout of T after
// T to T+1 s; ctx ending closes the connection, which ends the wait.
func (b *Blocker) Pop(ctx context.Context, keys []string, wait time.Duration) (string, error) {
	conn, err := b.get(ctx)
	if err != nil {
		return "", err
	}
	secs := max(1, int64(wait/time.Second))
	args := make([]interface{}, 0, len(keys)+1)
	for _, k := range keys {
		args = append(args, k)
	}
	args = append(args, secs)
	type result struct {
		rep []string
		err error
	}
	done := make(chan result, 1)
	go func() {
		var rep []string
		var err error
		if _, ok := conn.(redis.ConnWithTimeout); ok {
			rep, err = redis.Strings(redis.DoWithTimeout(conn, time.Duration(secs+3)*time.Second, "BLPOP", args...))
		} else {
			// A connection of the caller's that cannot take a read
			// timeout per command: its own read timeout must then exceed
			// IdleWait.
			rep, err = redis.Strings(conn.Do("BLPOP", args...))
		}
		done <- result{rep, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		conn.Close()
		<-done
		b.conn = nil
		return "", ctx.Err()
	}
	if errors.Is(r.err, redis.ErrNil) {
		return "", nil
	}
	if r.err != nil {
		b.Close()
		return "", r.err
	}
	if len(r.rep) != 2 {
		return "", nil
	}
	return r.rep[0], nil
}
