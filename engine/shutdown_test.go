package engine

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// silentServer accepts TCP connections and never replies. Closing it
// closes every connection it accepted.
type silentServer struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	done  chan struct{}
}

func newSilentServer(t *testing.T) *silentServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silentServer{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *silentServer) close() {
	s.ln.Close()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
	s.conns = nil
}

// Shutdown returns within its deadline plus 500 ms, with an error
// matching context.DeadlineExceeded, even against a server that accepts
// connections and never replies.
func TestShutdownAgainstSilentServer(t *testing.T) {
	// Not parallel: it bounds a time in real time, which the load of
	// the package's parallel tests would stretch.
	for _, which := range []string{"worker", "server"} {
		t.Run(which, func(t *testing.T) {
			s := newSilentServer(t)
			pool := &redis.Pool{MaxIdle: 4, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", s.ln.Addr().String()) }}
			defer pool.Close()
			cfg := Config{Namespace: "silent", Logger: testLogger(t)}
			var run func(context.Context) error
			var shutdown func(context.Context) error
			if which == "worker" {
				w, err := newWorker(pool, cfg, NewMux())
				if err != nil {
					t.Fatal(err)
				}
				run, shutdown = w.Run, w.Shutdown
			} else {
				srv, err := newLaneServer(pool, cfg, NewMux(), AllRoles)
				if err != nil {
					t.Fatal(err)
				}
				run, shutdown = srv.Run, srv.Shutdown
			}
			ran := make(chan error, 1)
			go func() { ran <- run(context.Background()) }()
			// Let it reach the server and hang there.
			waitFor(t, outcomeWait, "a connection to the silent server", func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				return len(s.conns) > 0
			})
			const deadline = 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			t0 := time.Now()
			err := shutdown(ctx)
			if d := time.Since(t0); d > deadline+500*time.Millisecond {
				t.Fatalf("Shutdown took %v; deadline %v", d, deadline)
			}
			// DeadlineExceeded when it gave up waiting for the server;
			// Canceled when stopping cancelled a call still waiting for it
			// (a worker that never registered).
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				t.Fatalf("Shutdown: %v, want DeadlineExceeded or Canceled", err)
			}
			// Closing the server's connections ends the calls Run was
			// stuck in; Run then returns.
			s.close()
			select {
			case err := <-ran:
				// Run says why it stopped: it never registered.
				if err == nil {
					t.Fatal("Run returned nil after a stop that never reached Redis")
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Run did not return after the server went away")
			}
		})
	}
}
