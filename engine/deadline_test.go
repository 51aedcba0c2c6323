package engine

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
)

// Against a server that accepts connections and never answers, every call
// of the Client returns once its context's deadline passes, with an error
// matching context.DeadlineExceeded, and the connection it
// used is discarded rather than put back in the pool's idle list (a reply
// may still be on its way).
func TestCallsBoundedByDeadline(t *testing.T) {
	t.Parallel()
	addr := silentAddr(t)
	pool := &redisPool{MaxIdle: 4, Dial: func() (redisConn, error) { return redisDial("tcp", addr) }}
	t.Cleanup(func() { pool.Close() })
	c, err := newLaneClient(pool, Config{Namespace: "deadline"})
	if err != nil {
		t.Fatal(err)
	}
	in := c.inspector()
	id := uuid.NewString()
	calls := []struct {
		name string
		call func(context.Context) error
	}{
		{"Enqueue", func(ctx context.Context) error { _, err := c.Enqueue(ctx, "t", nil); return err }},
		{"Enqueue with In", func(ctx context.Context) error { _, err := c.Enqueue(ctx, "t", nil, In(time.Minute)); return err }},
		{"EnqueueBatch", func(ctx context.Context) error {
			_, err := c.EnqueueBatch(ctx, []NewTask{{Type: "t"}, {Type: "t", Options: []Option{In(time.Hour)}}})
			return err
		}},
		{"Lookup", func(ctx context.Context) error { _, err := c.Lookup(ctx, id); return err }},
		{"Cancel", func(ctx context.Context) error { return c.Cancel(ctx, id) }},
		{"ListTasks dead", func(ctx context.Context) error {
			_, err := in.ListTasks(ctx, ListOptions{Filter: Filter{State: StateDead}})
			return err
		}},
		{"Act retry", func(ctx context.Context) error { _, err := in.Act(ctx, ActionRetry, id); return err }},
		{"Act delete", func(ctx context.Context) error { _, err := in.Act(ctx, ActionDelete, id); return err }},
		{"ActAll retry", func(ctx context.Context) error {
			_, err := in.ActAll(ctx, ActionRetry, Filter{State: StateDead})
			return err
		}},
		{"Queues", func(ctx context.Context) error { _, err := in.Queues(ctx); return err }},
	}
	// The slack only tells a return from a hang (a call not bounded by
	// its context waits for ever): how soon after the deadline a busy
	// machine schedules the return is not what is tested.
	const deadline, slack = 300 * time.Millisecond, 10 * time.Second
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			err := tc.call(ctx)
			if took := time.Since(start); took > deadline+slack {
				t.Errorf("returned after %v; the deadline was %v", took, deadline)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("err %v; want one matching context.DeadlineExceeded", err)
			}
			if st := pool.Stats(); st.IdleCount != 0 || st.ActiveCount != 0 {
				t.Errorf("pool after the call: %d idle, %d open; want the connection discarded", st.IdleCount, st.ActiveCount)
			}
		})
	}
}

// An enqueue against a server that accepts connections and answers
// nothing but INFO (the version a transaction runner reads first) sends
// its write and loses the reply: the error
// matches ErrUncertain, and context.DeadlineExceeded too, since the
// deadline is what ended the wait. (Against a server that answers nothing
// at all, the write is never sent: TestCallsBoundedByDeadline.)
func TestEnqueueUncertainAtDeadline(t *testing.T) {
	t.Parallel()
	addr := infoOnlyAddr(t)
	pool := &redisPool{MaxIdle: 4, Dial: func() (redisConn, error) { return redisDial("tcp", addr) }}
	t.Cleanup(func() { pool.Close() })
	c, err := newLaneClient(pool, Config{Namespace: "deadline-uncertain"})
	if err != nil {
		t.Fatal(err)
	}
	deadline := 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	_, err = c.Enqueue(ctx, "t", nil)
	// Real time is part of what is tested: the call is bounded by its
	// deadline (the slack tells a return from a hang, not how soon a busy
	// machine schedules it).
	if took := time.Since(start); took > deadline+10*time.Second {
		t.Errorf("returned after %v; the deadline was %v", took, deadline)
	}
	if !errors.Is(err, ErrUncertain) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v; want one matching both ErrUncertain and context.DeadlineExceeded", err)
	}
}

// An enqueue whose connection breaks once its write is sent is checked on
// a fresh connection (settleEnqueue); when the deadline ends that check,
// the error matches context.DeadlineExceeded as well as ErrUncertain.
func TestEnqueueUncertainSettleAtDeadline(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	addr := silentAddr(t)
	var cut atomic.Bool
	pool := &redisPool{Dial: func() (redisConn, error) {
		if cut.CompareAndSwap(false, true) {
			return &cutConn{Conn: e.pool.Get()}, nil // the write's connection: cut at EXEC
		}
		return redisDial("tcp", addr) // the settling one: never answers
	}}
	t.Cleanup(func() { pool.Close() })
	c, err := newLaneClient(pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = c.Enqueue(ctx, "t", nil)
	if !errors.Is(err, ErrUncertain) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v; want one matching both ErrUncertain and context.DeadlineExceeded", err)
	}
}

// silentAddr is the address of a server that accepts connections and
// never replies.
func silentAddr(t *testing.T) string { return newSilentServer(t).ln.Addr().String() }

// infoOnlyAddr is the address of a server that answers INFO, as a Redis 7
// would, and never anything else.
func infoOnlyAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	t.Cleanup(func() { ln.Close(); conns.Wait() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					args, err := readCommand(r)
					if err != nil {
						return
					}
					if strings.EqualFold(args[0], "INFO") {
						const info = "redis_version:7.0.15\r\n"
						fmt.Fprintf(c, "$%d\r\n%s\r\n", len(info), info)
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// readCommand reads one command in RESP's multi-bulk form.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "*")))
	if err != nil || n < 1 {
		return nil, fmt.Errorf("not a multi-bulk command: %q", line)
	}
	args := make([]string, n)
	for i := range args {
		if line, err = r.ReadString('\n'); err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
		if err != nil || size < 0 {
			return nil, fmt.Errorf("not a bulk string: %q", line)
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		args[i] = string(b[:size])
	}
	return args, nil
}
