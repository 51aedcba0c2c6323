package txn_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// Inline round trips write and read as the others do.
func TestInlineRuns(t *testing.T) {
	s := redistest.Start(t)
	ns := redistest.Namespace(t)
	t.Cleanup(func() { s.Cleanup(t, ns) })
	conn := s.Pool(t).Get()
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	reps, err := txn.Run(txn.Inline(ctx), conn, nil, func(tx *txn.Tx) error {
		tx.Queue("SET", ns+":k", "v")
		tx.Queue("GET", ns+":k")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := redis.String(reps[1], nil); v != "v" {
		t.Fatalf("GET inside EXEC = %v, want v", reps[1])
	}
}

// An inline round trip to a server that never answers ends at the
// context's deadline, with an error that says so, and the connection is
// not used again.
func TestInlineBoundedByDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c // reads nothing, answers nothing
		}
	}()
	raw, err := redis.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	defer func() {
		if c := <-accepted; c != nil {
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = txn.Run(txn.Inline(ctx), raw, nil, func(tx *txn.Tx) error {
		tx.Queue("SET", "k", "v")
		return nil
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run against a silent server = %v, want context.DeadlineExceeded", err)
	}
	if raw.Err() == nil {
		t.Fatal("the connection is still usable after a cut round trip")
	}
}

// noTimeoutConn has redis.ConnWithContext but not redis.ConnWithTimeout.
type noTimeoutConn struct{ redis.Conn }

func (c noTimeoutConn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	return redis.DoContext(c.Conn, ctx, cmd, args...)
}

func (c noTimeoutConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(c.Conn, ctx)
}

// Over a pool whose connections have no timeouts, an inline round trip
// goes the usual way.
func TestInlineWithoutTimeouts(t *testing.T) {
	s := redistest.Start(t)
	ns := redistest.Namespace(t)
	t.Cleanup(func() { s.Cleanup(t, ns) })
	inner := s.Pool(t)
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return noTimeoutConn{inner.Get()}, nil }}
	defer pool.Close()
	conn := pool.Get()
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := txn.Run(txn.Inline(ctx), conn, nil, func(tx *txn.Tx) error {
		tx.Queue("SET", ns+":k", "v")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
