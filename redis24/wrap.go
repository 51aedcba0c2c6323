package redis24

import (
	"context"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Option configures [Wrap].
type Option func(*conn)

// OnViolation registers a function called (on the caller's goroutine) for
// every command that Wrap refuses, before the error is returned.
func OnViolation(f func(*Violation)) Option {
	return func(c *conn) { c.onViolation = f }
}

// WithCensus records every command name sent or refused, and every violation,
// in census.
func WithCensus(census *Census) Option {
	return func(c *conn) { c.census = census }
}

// AllowAuthUser lets AUTH through with two arguments, user name and
// password: the ACL form that only Redis 6.0 or newer accepts. Pass it only
// when a user name is configured; every other command, and AUTH with any
// other number of arguments, is still held to the 2.4 table.
func AllowAuthUser() Option {
	return func(c *conn) { c.authUser = true }
}

// Wrap returns a connection that runs [Check] on every Do, Send,
// DoWithTimeout and DoContext before the command reaches c. A refused command
// is not sent (not even queued inside MULTI): the OnViolation hook is called
// and the [*Violation] is returned as the error. The connection itself is
// unaffected; inside MULTI the transaction stays open, and the caller decides
// whether to DISCARD it (Redis 2.4 would have run EXEC without the command).
//
// The result implements redis.ConnWithTimeout and redis.ConnWithContext, so
// it works with redis.DoWithTimeout, redis.DoContext and inside a redis.Pool.
// When c lacks those methods, the timeout variants fall back to the plain
// ones (the dial-time timeouts apply) and the context variants check ctx
// before calling them.
func Wrap(c redis.Conn, opts ...Option) redis.Conn {
	w := &conn{inner: c}
	for _, o := range opts {
		o(w)
	}
	return w
}

type conn struct {
	inner       redis.Conn
	onViolation func(*Violation)
	census      *Census
	authUser    bool
	mode        Mode
}

var (
	_ redis.ConnWithTimeout = (*conn)(nil)
	_ redis.ConnWithContext = (*conn)(nil)
)

// guard records and checks one command; it returns the violation, if any.
func (c *conn) guard(cmd string, args []interface{}) error {
	if cmd == "" {
		return nil // redigo's flush: Do("") sends nothing new
	}
	if c.census != nil {
		c.census.Record(cmd)
	}
	v := check(cmd, args)
	if v != nil && c.authUser && len(args) == 2 && strings.EqualFold(cmd, "AUTH") {
		v = nil
	}
	if v != nil && c.mode != "" && modeAllows(c.mode, cmd, args) {
		v = nil
	}
	if v == nil {
		return nil
	}
	v.Caller = callerOutside()
	if c.census != nil {
		c.census.RecordViolation(v)
	}
	if c.onViolation != nil {
		c.onViolation(v)
	}
	return v
}

// Close implements redis.Conn.
func (c *conn) Close() error { return c.inner.Close() }

// Err implements redis.Conn.
func (c *conn) Err() error { return c.inner.Err() }

// Flush implements redis.Conn.
func (c *conn) Flush() error { return c.inner.Flush() }

// Receive implements redis.Conn.
func (c *conn) Receive() (interface{}, error) { return c.inner.Receive() }

// Do implements redis.Conn.
func (c *conn) Do(cmd string, args ...interface{}) (interface{}, error) {
	if err := c.guard(cmd, args); err != nil {
		return nil, err
	}
	return c.inner.Do(cmd, args...)
}

// Send implements redis.Conn.
func (c *conn) Send(cmd string, args ...interface{}) error {
	if err := c.guard(cmd, args); err != nil {
		return err
	}
	return c.inner.Send(cmd, args...)
}

// DoWithTimeout implements redis.ConnWithTimeout.
func (c *conn) DoWithTimeout(timeout time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	if err := c.guard(cmd, args); err != nil {
		return nil, err
	}
	if cwt, ok := c.inner.(redis.ConnWithTimeout); ok {
		return cwt.DoWithTimeout(timeout, cmd, args...)
	}
	return c.inner.Do(cmd, args...)
}

// ReceiveWithTimeout implements redis.ConnWithTimeout.
func (c *conn) ReceiveWithTimeout(timeout time.Duration) (interface{}, error) {
	if cwt, ok := c.inner.(redis.ConnWithTimeout); ok {
		return cwt.ReceiveWithTimeout(timeout)
	}
	return c.inner.Receive()
}

// DoContext implements redis.ConnWithContext.
func (c *conn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	if err := c.guard(cmd, args); err != nil {
		return nil, err
	}
	if cwc, ok := c.inner.(redis.ConnWithContext); ok {
		return cwc.DoContext(ctx, cmd, args...)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.inner.Do(cmd, args...)
}

// ReceiveContext implements redis.ConnWithContext.
func (c *conn) ReceiveContext(ctx context.Context) (interface{}, error) {
	if cwc, ok := c.inner.(redis.ConnWithContext); ok {
		return cwc.ReceiveContext(ctx)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.inner.Receive()
}
