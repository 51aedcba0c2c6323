package engine

import (
	"context"
	"errors"
	"sync"

	"github.com/gomodule/redigo/redis"
)

var errInjected = errors.New("injected connection failure")

// faultConn passes commands to a real connection until limit commands have
// been written, then closes it, as if the process died there. With
// loseReply set it lets the limit-th command reach the server and drops
// its reply instead ("the server did it, the client never heard").
type faultConn struct {
	redis.Conn
	mu        sync.Mutex
	limit     int
	sent      int
	loseReply bool
	dead      bool
}

func (f *faultConn) count(cmd string) (send bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dead {
		return false, errInjected
	}
	if cmd == "" {
		return true, nil
	}
	f.sent++
	if f.sent < f.limit {
		return true, nil
	}
	if f.sent == f.limit && f.loseReply {
		return true, nil
	}
	f.dead = true
	f.Conn.Close()
	return false, errInjected
}

func (f *faultConn) Send(cmd string, args ...interface{}) error {
	if ok, err := f.count(cmd); !ok {
		return err
	}
	return f.Conn.Send(cmd, args...)
}

func (f *faultConn) Do(cmd string, args ...interface{}) (interface{}, error) {
	return f.DoContext(context.Background(), cmd, args...)
}

// DoContext is Do bounded by ctx, as txn and buckets send every round trip.
func (f *faultConn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	ok, err := f.count(cmd)
	if !ok {
		return nil, err
	}
	rep, err := redis.DoContext(f.Conn, ctx, cmd, args...)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.loseReply && f.sent >= f.limit && !f.dead {
		f.dead = true
		f.Conn.Close()
		return nil, errInjected
	}
	return rep, err
}

// ReceiveContext completes redis.ConnWithContext.
func (f *faultConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	if ok, err := f.count(""); !ok {
		return nil, err
	}
	return redis.ReceiveContext(f.Conn, ctx)
}

func (f *faultConn) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dead {
		return errInjected
	}
	return f.Conn.Err()
}

func (f *faultConn) tripped() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dead
}
