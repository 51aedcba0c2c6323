package redistest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
)

// serverWide reports whether cmd args acts on the whole server rather than
// on keys: flushing it, changing its configuration or role, cutting or
// pausing its clients, stopping it. Other tests and programs share the
// server of ENGINE_TEST_REDIS, so these are refused there.
func serverWide(cmd string, args []interface{}) bool {
	sub := ""
	if len(args) > 0 {
		switch a := args[0].(type) {
		case []byte:
			sub = strings.ToUpper(string(a))
		default:
			sub = strings.ToUpper(fmt.Sprint(a))
		}
	}
	switch strings.ToUpper(cmd) {
	case "FLUSHALL", "FLUSHDB", "SHUTDOWN", "SLAVEOF", "REPLICAOF", "DEBUG", "FAILOVER", "SWAPDB", "MIGRATE":
		return true
	case "CONFIG":
		return sub != "GET"
	case "CLIENT":
		return sub == "KILL" || sub == "PAUSE" || sub == "UNPAUSE"
	case "ACL":
		return sub == "SETUSER" || sub == "DELUSER" || sub == "LOAD"
	case "SCRIPT", "FUNCTION":
		return sub == "FLUSH" || sub == "KILL"
	}
	return false
}

// sharedConn guards a connection to the shared server: a server-wide
// command is not sent, and fails the test.
type sharedConn struct {
	inner redis.Conn
	addr  string
	rep   *reporter
}

var (
	_ redis.ConnWithTimeout = (*sharedConn)(nil)
	_ redis.ConnWithContext = (*sharedConn)(nil)
)

func (c *sharedConn) refuse(cmd string, args []interface{}) error {
	if !serverWide(cmd, args) {
		return nil
	}
	line := strings.TrimSpace(cmd + " " + strings.Trim(fmt.Sprint(args), "[]"))
	err := fmt.Errorf("redistest: %s refused on the shared server %s (%s): a test that needs it starts its own with redistest.Private()", line, c.addr, EnvAddr)
	c.rep.fail(err)
	return err
}

func (c *sharedConn) Close() error                  { return c.inner.Close() }
func (c *sharedConn) Err() error                    { return c.inner.Err() }
func (c *sharedConn) Flush() error                  { return c.inner.Flush() }
func (c *sharedConn) Receive() (interface{}, error) { return c.inner.Receive() }

func (c *sharedConn) Do(cmd string, args ...interface{}) (interface{}, error) {
	if err := c.refuse(cmd, args); err != nil {
		return nil, err
	}
	return c.inner.Do(cmd, args...)
}

func (c *sharedConn) Send(cmd string, args ...interface{}) error {
	if err := c.refuse(cmd, args); err != nil {
		return err
	}
	return c.inner.Send(cmd, args...)
}

func (c *sharedConn) DoWithTimeout(d time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	if err := c.refuse(cmd, args); err != nil {
		return nil, err
	}
	return redis.DoWithTimeout(c.inner, d, cmd, args...)
}

func (c *sharedConn) ReceiveWithTimeout(d time.Duration) (interface{}, error) {
	return redis.ReceiveWithTimeout(c.inner, d)
}

func (c *sharedConn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	if err := c.refuse(cmd, args); err != nil {
		return nil, err
	}
	return redis.DoContext(c.inner, ctx, cmd, args...)
}

func (c *sharedConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(c.inner, ctx)
}

// guardShared wraps c in sharedConn when s is the shared server.
func (s *Server) guardShared(c redis.Conn, rep *reporter) redis.Conn {
	if s.Kind != KindExternal {
		return c
	}
	return &sharedConn{inner: c, addr: s.Addr, rep: rep}
}
