package engine

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// blockedPops counts the server's clients blocked in BLPOP.
func blockedPops(t testing.TB, a redis.Conn) int {
	t.Helper()
	list, err := redis.String(a.Do("CLIENT", "LIST"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, "cmd=blpop") && strings.Contains(line, "flags=b") {
			n++
		}
	}
	return n
}

// TestShardSharedWait: the idle workers of four lanes on one server (one
// pool) block in one BLPOP, not four, and a task enqueued to any lane
// still wakes its worker, long before the idle wait would.
func TestShardSharedWait(t *testing.T) {
	e := privateEnv(t)
	e.cfg.IdleWait = 60 * time.Second // a lost wake-up would show as a minute's wait
	const n = 4
	sh := e.sameServer(n)
	a := e.admin(t)

	var mu sync.Mutex
	ran := map[string]bool{}
	mux := NewMux()
	mux.HandleFunc("job", func(_ context.Context, tk *Task) error {
		mu.Lock()
		ran[tk.ID] = true
		mu.Unlock()
		return nil
	})
	srv, err := NewShardedServer(sh, e.cfg, mux, RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, srv.Run)
	waitFor(t, 10*time.Second, "the lanes' workers to block in one BLPOP", func() bool { return blockedPops(t, a) == 1 })

	c := e.shardedClient(t, sh)
	ctx := context.Background()
	for round := range 3 {
		var ids []string
		for k := range n {
			ti, err := c.Enqueue(ctx, "job", nil, TaskID(idInLane("w"+string(rune('a'+round)), k, n)))
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, ti.ID)
		}
		waitFor(t, 30*time.Second, "every lane's task to wake its worker", func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, id := range ids {
				if !ran[id] {
					return false
				}
			}
			return true
		})
		waitFor(t, 10*time.Second, "the workers to block in one BLPOP again", func() bool { return blockedPops(t, a) == 1 })
	}
	redistest.RequireNoViolations(t, e.srv)
}
