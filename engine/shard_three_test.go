package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/measured"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/internal/testwait"
)

// shardTestTasks is how many tasks TestShardThreeServersKill enqueues:
// ENGINE_TEST_SHARD_TASKS (the full form is 100000), else a short form
// that fits the CI budget under the race detector.
func shardTestTasks(t testing.TB) int {
	if s := os.Getenv("ENGINE_TEST_SHARD_TASKS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 100 {
			t.Fatalf("ENGINE_TEST_SHARD_TASKS=%q: want a number of tasks, at least 100", s)
		}
		return n
	}
	return 3000
}

// TestShardThreeServersKill runs three independent redis-server processes
// (AOF, appendfsync always) as three lanes. Producers enqueue tasks due
// over the next seconds while a sharded server runs them; one server is
// killed (SIGKILL) a third of the way in and restarted from its AOF a
// while later. Every enqueue keeps succeeding (the dead lane's tasks go to
// the others), every acknowledged task runs, none before it was due, and
// each server saw only Redis 2.4 commands. (A task whose claim was written
// but whose reply the kill cut off waits for its lease to end: the tasks
// have a 2 s timeout so that this stays short.)
func TestShardThreeServersKill(t *testing.T) {
	t.Parallel()
	total := shardTestTasks(t)
	began := time.Now()
	var servers []*redistest.Server
	sh := shardSpec{}
	for range 3 {
		s := redistest.Start(t, redistest.WithAppendOnly())
		servers = append(servers, s)
		sh.Pools = append(sh.Pools, s.Pool(t))
	}
	e := newEnv(t, servers[0])
	cfg := e.cfg
	cfg.Concurrency = 16
	spread := 3 * time.Second
	if total > 10000 {
		spread = 20 * time.Second
	}

	var (
		mu    sync.Mutex
		ran   = map[string]int{}
		early []string
	)
	mux := NewMux()
	mux.HandleFunc("job", func(_ context.Context, tk *Task) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		ran[tk.ID]++
		if now.Before(tk.Due) {
			early = append(early, fmt.Sprintf("%s due %v ran %v", tk.ID, tk.Due, now))
		}
		return nil
	})
	srv, err := newShardedServer(sh, cfg, mux, AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	stopSrv := runBackground(t, srv.Run)
	client, err := newShardedClient(sh, cfg)
	if err != nil {
		t.Fatal(err)
	}

	const batch = 50
	var (
		ackMu              sync.Mutex
		acked              []string
		failedAfterKill    atomic.Int64
		uncertain, errored atomic.Int64
		enqueued           atomic.Int64
	)
	killAt := int64(total / 3)
	killed := make(chan struct{})
	var killOnce sync.Once
	// The lane comes back once a sixth of the tasks were enqueued with it
	// down.
	downLong := make(chan struct{})
	var downOnce sync.Once
	restarted := make(chan struct{})
	var producers sync.WaitGroup
	var next atomic.Int64
	for range 4 {
		producers.Go(func() {
			for {
				start := next.Add(batch) - batch
				if start >= int64(total) {
					return
				}
				n := min(batch, total-int(start))
				tasks := make([]NewTask, n)
				for i := range tasks {
					d := time.Duration(rand.Int64N(int64(spread)))
					if i%4 == 0 {
						d = 0
					}
					// A short timeout: a claim whose reply the kill cut
					// off, and whose retries ran out while the server was
					// down, leaves its task claimed until the lease ends.
					tasks[i] = NewTask{Type: "job", Options: []Option{In(d), Timeout(2 * time.Second)}}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				res, err := client.EnqueueBatch(ctx, tasks)
				cancel()
				if res != nil {
					ackMu.Lock()
					for _, ti := range res {
						if ti != nil {
							acked = append(acked, ti.ID)
						}
					}
					ackMu.Unlock()
				}
				if err != nil {
					errored.Add(1)
					if isUncertain(err) {
						uncertain.Add(1)
					} else {
						select {
						case <-killed:
							failedAfterKill.Add(1)
							t.Logf("enqueue failed while a lane was down: %v", err)
						default:
						}
					}
				}
				if sum := enqueued.Add(int64(n)); sum >= killAt {
					killOnce.Do(func() {
						servers[1].Kill(t)
						close(killed)
					})
					if sum >= killAt+int64(total/6) {
						downOnce.Do(func() { close(downLong) })
					}
				}
			}
		})
	}
	go func() {
		<-downLong
		servers[1].Restart(t)
		close(restarted)
	}()
	producers.Wait()
	<-restarted
	t.Logf("%d tasks acknowledged of %d, %d batches failed (%d uncertain, %d not uncertain while a lane was down), %d rerouted",
		len(acked), total, errored.Load(), uncertain.Load(), failedAfterKill.Load(), client.Rerouted())
	if failedAfterKill.Load() > 0 {
		t.Errorf("%d batches failed with a lane down instead of going to the other lanes", failedAfterKill.Load())
	}
	if client.Rerouted() == 0 {
		t.Errorf("no task was rerouted while lane 1's server was down")
	}
	if len(acked) < total*9/10 {
		t.Errorf("only %d of %d tasks acknowledged", len(acked), total)
	}
	nAcked := len(acked)
	record := func(lost, early, twice int) {
		if _, err := measured.Log("shard-kill", fmt.Sprintf("`TestShardThreeServersKill`, %d tasks", total), map[string]float64{
			"tasks": float64(total), "acknowledged": float64(nAcked), "rerouted": float64(client.Rerouted()),
			"unrun": float64(lost), "early": float64(early), "twice": float64(twice), "seconds": time.Since(began).Seconds(),
		}, nil); err != nil {
			t.Error(err)
		}
	}
	deadline := time.Now().Add(spread + 60*time.Second)
	testwait.Until(t, spread+90*time.Second, "every acknowledged task to run", func() bool {
		mu.Lock()
		var missing []string
		for _, id := range acked {
			if ran[id] == 0 {
				missing = append(missing, id)
			}
		}
		acked = missing
		mu.Unlock()
		if len(missing) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			byLane := map[int]int{}
			for _, id := range missing {
				byLane[client.LaneOf(id)]++
			}
			for _, id := range missing[:min(5, len(missing))] {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				ti, err := client.Lookup(ctx, id)
				cancel()
				t.Logf("missing %s: %+v %v", id, ti, err)
			}
			mu.Lock()
			record(len(missing), len(early), 0)
			mu.Unlock()
			t.Fatalf("%d acknowledged tasks did not run (by lane %v)", len(missing), byLane)
		}
		return false
	})
	stopSrv()
	mu.Lock()
	dups := 0
	for _, n := range ran {
		if n > 1 {
			dups++
		}
	}
	mu.Unlock()
	t.Logf("%d tasks ran, %d more than once", len(ran), dups)
	mu.Lock()
	record(0, len(early), dups)
	mu.Unlock()
	if len(early) > 0 {
		t.Errorf("%d tasks ran early, e.g. %s", len(early), early[0])
	}
	for i, s := range servers {
		t.Logf("server %d commands: %v", i, redistest.CensusCommands(s))
		redistest.RequireNoViolations(t, s)
	}
}

func isUncertain(err error) bool { return errors.Is(err, ErrUncertain) }
