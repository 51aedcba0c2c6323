package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/bucketq/bucketq/redis24"
	"github.com/gomodule/redigo/redis"
)

// TestChaosUniqueWaitReplies is the short form of the unique-key and
// Wait/reply scenario: eight producers race to enqueue tasks over a few
// unique keys (each answered by a reply task, ReplyTo) while three worker
// processes are SIGKILLed and restarted at random. It checks that every
// refusal names a task enqueued with that key, that Wait returns the final
// outcome of every task enqueued, that exactly one reply task is written
// per task, and that every key is free at the end.
func TestChaosUniqueWaitReplies(t *testing.T) { runUniqueWaitReplies(t, 1) }

// TestChaosUniqueWaitRepliesShards is the same on three lanes, each on a
// redis-server of its own: the producers share a Client over the three
// lanes (a task with a unique key goes to the lane its key hashes to), the
// workers and the reaper serve every lane; Wait goes to each task's lane,
// and each task's one reply task is in its lane.
func TestChaosUniqueWaitRepliesShards(t *testing.T) { runUniqueWaitReplies(t, 3) }

func runUniqueWaitReplies(t *testing.T, lanes int) {
	bin, err := findRedisServer()
	if err != nil {
		t.Fatalf("%v", err)
	}
	buildOnce.Do(buildProc)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	dir := t.TempDir()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	const ns = "uq"

	var (
		pools []*redis.Pool
		addrs []string
	)
	for k := 0; k < lanes; k++ {
		srv, err := startRedis(bin, filepath.Join(dir, fmt.Sprintf("redis-%d", k)), redisOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Stop(syscall.SIGKILL) })
		addrs = append(addrs, srv.Addr)
		pool := &redis.Pool{MaxIdle: 16, Dial: func() (redis.Conn, error) {
			c, err := redis.Dial("tcp", srv.Addr, redis.DialReadTimeout(10*time.Second))
			if err != nil {
				return nil, err
			}
			return redis24.Wrap(c, redis24.OnViolation(func(v *redis24.Violation) { t.Errorf("redis24: %v", v) })), nil
		}}
		defer pool.Close()
		pools = append(pools, pool)
	}
	// client enqueues and waits; in reads the reply tasks and the workers.
	cfg := engine.Config{Namespace: ns}
	client, err := engine.NewClient(cfg, pools...)
	if err != nil {
		t.Fatal(err)
	}
	in, err := engine.NewInspector(cfg, pools...)
	if err != nil {
		t.Fatal(err)
	}

	// Processes: a reaper and three workers, restarted after each kill.
	common := []string{"-addr", addrs[0], "-ns", ns, "-max-recoveries", "1000", "-sleep-max", "30ms"}
	if lanes > 1 {
		common = append(common, "-addrs", strings.Join(addrs, ","))
	}
	var (
		mu    sync.Mutex
		procs = map[string]*exec.Cmd{}
		waits sync.WaitGroup // each started process's Wait
	)
	start := func(name string, args ...string) {
		cmd := exec.Command(procBin, append(append([]string{}, common...), args...)...)
		logf, _ := os.OpenFile(filepath.Join(dir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		cmd.Stderr = logf
		if err := cmd.Start(); err != nil {
			t.Errorf("start %s: %v", name, err)
			return
		}
		waits.Go(func() { _ = cmd.Wait(); logf.Close() })
		mu.Lock()
		procs[name] = cmd
		mu.Unlock()
	}
	start("reaper", "-mode", "reaper")
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("worker-%d", i)
		start(name, "-mode", "worker", "-ledger", filepath.Join(dir, name+".ledger"))
	}
	t.Cleanup(func() {
		mu.Lock()
		for _, p := range procs {
			_ = p.Process.Kill()
		}
		mu.Unlock()
		// Every Wait returns once its process is gone: no goroutine
		// outlives the test, however slowly a busy machine reaps them.
		waits.Wait()
	})
	// The race is between producers and running tasks: wait until every
	// worker serves every lane.
	testwait.Until(t, 15*time.Second, fmt.Sprintf("%d live workers", 3*lanes), func() bool {
		ws, err := in.Workers(context.Background())
		alive := 0
		for _, w := range ws {
			if w.Alive {
				alive++
			}
		}
		return err == nil && alive >= 3*lanes
	})
	killCtx, stopKills := context.WithCancel(context.Background())
	defer stopKills()
	killsDone := make(chan int, 1)
	go func() {
		kills := 0
		defer func() { killsDone <- kills }()
		for {
			select {
			case <-killCtx.Done():
				return
			// Real time is what is tested: the kills come at random
			// moments of the producers' race.
			case <-time.After(time.Duration(100+rng.IntN(300)) * time.Millisecond):
			}
			name := fmt.Sprintf("worker-%d", rng.IntN(3))
			mu.Lock()
			p := procs[name]
			mu.Unlock()
			_ = p.Process.Signal(syscall.SIGKILL)
			kills++
			start(name, "-mode", "worker", "-ledger", filepath.Join(dir, name+".ledger"))
		}
	}()

	// Producers race over the keys.
	const producers, keys, rounds = 8, 20, 6
	var (
		pmu      sync.Mutex
		accepted = map[string]string{}   // id → key
		refusals = map[string][]string{} // key → holder ids named
	)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				first := "" // the round's first task this producer got enqueued
				for k := 0; k < keys; k++ {
					key := fmt.Sprintf("key-%d", (k+p*3)%keys)
					info, err := client.Enqueue(ctx, "noop", []byte(key), engine.UniqueKey(key, 0), engine.ReplyTo("replies"))
					var dup *engine.ExistsError
					pmu.Lock()
					switch {
					case err == nil:
						accepted[info.ID] = key
						if first == "" {
							first = info.ID
						}
					case errors.As(err, &dup):
						refusals[key] = append(refusals[key], dup.IDs[0])
					default:
						t.Errorf("enqueue: %v", err)
					}
					pmu.Unlock()
				}
				// The next round races against tasks ending and freeing
				// their keys: one of this round's has ended.
				if first != "" {
					if _, err := client.Wait(ctx, first); err != nil {
						t.Errorf("wait for %s: %v", first, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for key, ids := range refusals {
		for _, id := range ids {
			if accepted[id] != key {
				t.Errorf("a refusal of key %s named %s, which was not enqueued with it", key, id)
			}
		}
	}
	// Wait returns every final outcome, through the kills.
	done := 0
	for id := range accepted {
		o, err := client.Wait(ctx, id)
		if err != nil {
			t.Fatalf("wait for %s: %v", id, err)
		}
		if o.State == engine.StateDone {
			done++
		} else {
			t.Errorf("task %s ended %s: %s", id, o.State, o.Error)
		}
	}
	stopKills()
	kills := <-killsDone
	// Exactly one reply task per task, in the task's lane (no worker here
	// serves the reply queue: they wait there, ready).
	replies := map[string]int{}
	opts := engine.ListOptions{Filter: engine.Filter{Queue: "replies", State: engine.StateReady}, Limit: 1000}
	for {
		page, err := in.ListTasks(ctx, opts)
		if err != nil {
			t.Fatalf("reply tasks: %v", err)
		}
		for _, v := range page.Tasks {
			r, err := engine.DecodeReply(v.Payload)
			if err != nil {
				t.Fatalf("reply task %s: %v", v.ID, err)
			}
			if client.LaneOf(v.ID) != client.LaneOf(r.ID) {
				t.Errorf("reply task %s for %s in lane %d, want its task's lane %d", v.ID, r.ID, client.LaneOf(v.ID), client.LaneOf(r.ID))
			}
			replies[r.ID]++
		}
		if page.Next == "" {
			break
		}
		opts.Cursor = page.Next
	}
	if len(replies) != len(accepted) {
		t.Errorf("%d tasks answered by reply tasks, want %d", len(replies), len(accepted))
	}
	for id, n := range replies {
		if _, ok := accepted[id]; !ok || n != 1 {
			t.Errorf("task %s: %d replies (enqueued: %v)", id, n, ok)
		}
	}
	// Every key is free once its tasks ended.
	for k := 0; k < keys; k++ {
		if _, err := client.Enqueue(ctx, "noop", nil, engine.UniqueKey(fmt.Sprintf("key-%d", k), 0), engine.Queue("nobody")); err != nil {
			t.Errorf("key-%d after every task ended: %v", k, err)
		}
	}
	t.Logf("%d lanes: %d tasks enqueued over %d keys (%d refusals), %d done, %d worker kills", lanes, len(accepted), keys, func() int {
		n := 0
		for _, ids := range refusals {
			n += len(ids)
		}
		return n
	}(), done, kills)
}
