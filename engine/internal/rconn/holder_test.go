package rconn

import (
	"context"
	"testing"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// After an error, the next Get tests what the pool hands out: when the
// server has closed every idle connection (a restart, a proxy cut), the
// first connection Get returns works, instead of one failed command per
// dead idle connection.
func TestHolderTestsConnectionsAfterAnError(t *testing.T) {
	srv := redistest.Start(t, redistest.Private()) // it kills every client connection of the server
	pool := srv.Pool(t)
	pool.MaxIdle = 8
	ctx := context.Background()
	// Fill the pool with idle connections.
	var conns []redis.Conn
	for i := 0; i < 4; i++ {
		c := pool.Get()
		if _, err := c.Do("PING"); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Close()
	}
	if n := pool.Stats().IdleCount; n != 4 {
		t.Fatalf("%d idle connections, want 4", n)
	}
	// The server closes every client connection (the admin's too).
	if _, err := srv.Admin(t).Do("CLIENT", "KILL", "TYPE", "normal"); err != nil {
		t.Fatal(err)
	}

	h := &Holder{Pool: pool}
	defer h.Close()
	h.Drop() // what a loop does after its command failed
	c, err := h.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do("PING"); err != nil {
		t.Fatalf("the first connection after the error is dead: %v", err)
	}
	// Without an error seen, Get takes the pool's connection as it is.
	h2 := &Holder{Pool: pool}
	defer h2.Close()
	if _, err := h2.Get(ctx); err != nil {
		t.Fatal(err)
	}
}
