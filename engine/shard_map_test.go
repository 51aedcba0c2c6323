package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// msgHandler sends the message of each log record at Error to ch.
type msgHandler struct{ ch chan string }

func (h msgHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h msgHandler) Handle(_ context.Context, r slog.Record) error {
	select {
	case h.ch <- r.Message:
	default:
	}
	return nil
}
func (h msgHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h msgHandler) WithGroup(string) slog.Handler      { return h }

// runLogged is runBackground for servers whose Run is expected to end
// with errors (a lane refused under a newer map cannot unregister; a
// server stopped at once cannot register): it logs them.
func runLogged(t testing.TB, run func(context.Context) error) (stop func()) {
	return runBackground(t, func(ctx context.Context) error {
		if err := run(ctx); err != nil {
			t.Logf("server stopped: %v", err)
		}
		return nil
	})
}

// idInLane returns a chosen id whose lane is k of n.
func idInLane(prefix string, k, n int) string {
	for i := 0; ; i++ {
		id := fmt.Sprintf("%s-%d", prefix, i)
		if laneOf(id, n) == k {
			return id
		}
	}
}

// TestShardMapVersion: a lane whose map key names another version refuses
// every write of a process with the old map (ErrShardMapVersion, nothing
// written), producers put movable tasks on the other lanes, a server with
// the old map stops serving the lane, and processes with the new map use
// it.
func TestShardMapVersion(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	ctx := context.Background()
	const n = 3
	v1 := e.sameServer(n)
	v1.MapVersion = 1
	v2 := e.sameServer(n)
	v2.MapVersion = 2
	c1 := e.shardedClient(t, v1)
	c2 := e.shardedClient(t, v2)
	a := e.admin(t)

	if _, err := c1.Enqueue(ctx, "job", nil, TaskID(idInLane("before", 1, n))); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Do("SET", e.laneKey(1, "map"), "2"); err != nil {
		t.Fatal(err)
	}
	id := idInLane("after", 1, n)
	if _, err := c1.Enqueue(ctx, "job", nil, TaskID(id)); !errors.Is(err, ErrShardMapVersion) {
		t.Fatalf("write to a lane of another map version: %v, want ErrShardMapVersion", err)
	}
	if exists(t, a, e.laneKey(1, "t:"+id)) {
		t.Fatal("the refused task was written")
	}
	key := idInLane("customer", 1, n) // a shard key of lane 1
	for range 3 {
		ti, err := c1.Enqueue(ctx, "job", nil, ShardKey(key))
		if err != nil {
			t.Fatalf("a movable task with lane 1 refusing: %v", err)
		}
		if c1.LaneOf(ti.ID) == 1 {
			t.Errorf("task %s written to the refusing lane", ti.ID)
		}
	}
	if c1.Rerouted() == 0 {
		t.Error("no task rerouted away from the refusing lane")
	}
	if _, err := c2.Enqueue(ctx, "job", nil, TaskID(id)); err != nil {
		t.Fatalf("a process with the lane's version: %v", err)
	}

	// A server with the old map stops serving lane 1; one with the new
	// map runs its tasks.
	var mu sync.Mutex
	ran := map[string]string{}
	handler := func(who string) *Mux {
		m := NewMux()
		m.HandleFunc("job", func(_ context.Context, tk *Task) error {
			mu.Lock()
			ran[tk.ID] = who
			mu.Unlock()
			return nil
		})
		return m
	}
	logs := make(chan string, 16)
	cfg1 := e.cfg
	cfg1.Logger = slog.New(msgHandler{logs})
	old, err := newShardedServer(v1, cfg1, handler("v1"), AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	runLogged(t, old.Run)
	for msg := range logs {
		if strings.Contains(msg, "no longer serving the lane") {
			break
		}
	}
	cur, err := newShardedServer(v2, e.cfg, handler("v2"), AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	runLogged(t, cur.Run)
	waitFor(t, outcomeWait, "lane 1's task to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return ran[id] != ""
	})
	mu.Lock()
	if ran[id] != "v2" {
		t.Errorf("lane 1's task ran on the %s server", ran[id])
	}
	mu.Unlock()
	redistest.RequireNoViolations(t, e.srv)
}

// TestShardMoveLane follows the procedure of docs/scaling.md for moving a
// logical shard to a new server on Redis 2.4, while producers and workers
// run: replicate the lane's server to the new one (SLAVEOF), stop writes
// to the lane (its map key on the old server takes the new version, which
// replicates), wait until the replica has the new version (it then has
// every write before it), promote it (SLAVEOF NO ONE), and start the
// processes with the new map. Every acknowledged task runs; a task runs
// twice only when its run was cut off (the lease of an old process ended).
func TestShardMoveLane(t *testing.T) {
	t.Parallel()
	s0 := redistest.Start(t, redistest.Private())
	srcA := redistest.Start(t, redistest.Private())
	dstB := redistest.Start(t, redistest.Private())
	e := newEnv(t, s0)
	cfg := e.cfg
	cfg.Concurrency = 4
	p0, pA, pB := s0.Pool(t), srcA.Pool(t), dstB.Pool(t)
	v1 := shardSpec{Pools: []*redis.Pool{p0, pA, p0}, MapVersion: 1}
	v2 := shardSpec{Pools: []*redis.Pool{p0, pB, p0}, MapVersion: 2}

	var mu sync.Mutex
	ran := map[string]int{}
	// The producers keep at most 50 tasks enqueued and not started yet:
	// each start frees a place.
	ahead := make(chan struct{}, 50)
	mux := NewMux()
	mux.HandleFunc("job", func(_ context.Context, tk *Task) error {
		select {
		case <-ahead:
		default: // a second run
		}
		// real time: runs last a little, so that the move cuts some off.
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		ran[tk.ID]++
		mu.Unlock()
		return nil
	})
	oldSrv, err := newShardedServer(v1, cfg, mux, AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	stopOld := runLogged(t, oldSrv.Run)
	c1, err := newShardedClient(v1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := newShardedClient(v2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var current atomic.Pointer[Client]
	current.Store(c1)
	moved := make(chan struct{}) // closed once current is c2

	var ackMu sync.Mutex
	var acked []string
	stopProd := make(chan struct{})
	var prod sync.WaitGroup
	var refused atomic.Int64
	for p := range 2 {
		prod.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stopProd:
					return
				default:
				}
				select {
				case ahead <- struct{}{}:
				case <-stopProd:
					return
				}
				c := current.Load()
				opts := []Option{In(time.Duration(i%5) * 50 * time.Millisecond), Timeout(2 * time.Second)}
				if i%3 == 0 {
					// A task pinned to its id's lane: retried by the
					// producer until a process with the current map writes it.
					opts = append(opts, TaskID(fmt.Sprintf("p%d-%d", p, i)))
				}
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					ti, err := c.Enqueue(ctx, "job", nil, opts...)
					cancel()
					if err == nil {
						ackMu.Lock()
						acked = append(acked, ti.ID)
						ackMu.Unlock()
						break
					}
					if !errors.Is(err, ErrShardMapVersion) {
						t.Errorf("enqueue: %v", err)
						return
					}
					refused.Add(1)
					// Refused by the old server's new version: the next
					// try waits for the processes with the new map.
					select {
					case <-moved:
					case <-stopProd:
						return
					}
					c = current.Load()
				}
			}
		})
	}
	waitAcked := func(n int) {
		waitFor(t, outcomeWait, fmt.Sprintf("%d tasks enqueued", n), func() bool {
			ackMu.Lock()
			defer ackMu.Unlock()
			return len(acked) >= n
		})
	}
	waitAcked(200)

	// 1. Replicate the lane's server to the new one.
	dstB.ReplicateFrom(t, srcA, 20*time.Second)
	waitAcked(400)
	// 2. Stop writes to the lane: the old server's map key takes the new
	// version.
	aAdm, bAdm := srcA.Admin(t), dstB.Admin(t)
	key := fmt.Sprintf("{%s:1}:map", e.ns)
	if _, err := aAdm.Do("SET", key, "2"); err != nil {
		t.Fatal(err)
	}
	// 3. Once the replica has the new version, it has every write before.
	waitFor(t, outcomeWait, "the replica to have the new map version", func() bool {
		v, _ := redis.String(bAdm.Do("GET", key))
		return v == "2"
	})
	// 4. Promote it, and start the processes with the new map.
	dstB.Promote(t)
	newSrv, err := newShardedServer(v2, cfg, mux, AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	runLogged(t, newSrv.Run)
	current.Store(c2)
	close(moved)
	stopOld()
	ackMu.Lock()
	switched := len(acked)
	ackMu.Unlock()
	waitAcked(switched + 200)
	close(stopProd)
	prod.Wait()

	ackMu.Lock()
	all := append([]string(nil), acked...)
	ackMu.Unlock()
	waitFor(t, outcomeWait, "every acknowledged task to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range all {
			if ran[id] == 0 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	twice := 0
	for _, n := range ran {
		if n > 1 {
			twice++
		}
	}
	mu.Unlock()
	t.Logf("%d tasks acknowledged, %d writes refused during the move and retried, %d ran twice", len(all), refused.Load(), twice)
	for _, s := range []*redistest.Server{s0, srcA, dstB} {
		redistest.RequireNoViolations(t, s)
	}
}
