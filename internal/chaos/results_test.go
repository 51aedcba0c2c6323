package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/redis24"
	"github.com/gomodule/redigo/redis"
)

// TestChaosUniqueWaitReplies is the short form of the unique-key and
// Wait/reply scenario: eight producers race to enqueue tasks over a few
// unique keys (each with a reply list) while three worker processes are
// SIGKILLed and restarted at random. It checks that every refusal names a
// task enqueued with that key, that Wait returns the final outcome of
// every task enqueued, that the reply list holds exactly one reply per
// task, and that every key is free at the end.
func TestChaosUniqueWaitReplies(t *testing.T) {
	bin, err := findRedisServer()
	if err != nil {
		t.Fatalf("%v", err)
	}
	buildOnce.Do(buildProc)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	dir := t.TempDir()
	srv, err := startRedis(bin, filepath.Join(dir, "redis"), redisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop(syscall.SIGKILL) })
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	const ns = "uq"

	pool := &redis.Pool{MaxIdle: 16, Dial: func() (redis.Conn, error) {
		c, err := redis.Dial("tcp", srv.Addr, redis.DialReadTimeout(10*time.Second))
		if err != nil {
			return nil, err
		}
		return redis24.Wrap(c, redis24.OnViolation(func(v *redis24.Violation) { t.Errorf("redis24: %v", v) })), nil
	}}
	defer pool.Close()
	client, err := engine.NewClient(pool, engine.Config{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}

	// Processes: a reaper and three workers, restarted after each kill.
	common := []string{"-addr", srv.Addr, "-ns", ns, "-max-recoveries", "1000", "-sleep-max", "30ms"}
	var (
		mu    sync.Mutex
		procs = map[string]*exec.Cmd{}
	)
	start := func(name string, args ...string) {
		cmd := exec.Command(procBin, append(append([]string{}, common...), args...)...)
		logf, _ := os.OpenFile(filepath.Join(dir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		cmd.Stderr = logf
		if err := cmd.Start(); err != nil {
			t.Errorf("start %s: %v", name, err)
			return
		}
		go func() { _ = cmd.Wait(); logf.Close() }()
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
		defer mu.Unlock()
		for _, p := range procs {
			_ = p.Process.Kill()
		}
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
				for k := 0; k < keys; k++ {
					key := fmt.Sprintf("key-%d", (k+p*3)%keys)
					info, err := client.Enqueue(ctx, "noop", []byte(key), engine.UniqueKey(key, 0), engine.ReplyTo("replies"))
					var dup *engine.DuplicateError
					pmu.Lock()
					switch {
					case err == nil:
						accepted[info.ID] = key
					case errors.As(err, &dup):
						refusals[key] = append(refusals[key], dup.ID)
					default:
						t.Errorf("enqueue: %v", err)
					}
					pmu.Unlock()
				}
				time.Sleep(20 * time.Millisecond)
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
	// Exactly one reply per task.
	replies := map[string]int{}
	for len(replies) < len(accepted) {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		r, err := client.NextReply(rctx, "replies")
		rcancel()
		if err != nil {
			t.Fatalf("%d replies for %d tasks: %v", len(replies), len(accepted), err)
		}
		replies[r.ID]++
	}
	conn := pool.Get()
	defer conn.Close()
	if n, err := redis.Int(conn.Do("LLEN", "{"+ns+"}:rl:replies")); err != nil || n != 0 {
		t.Errorf("%d replies more than tasks (%v)", n, err)
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
	t.Logf("%d tasks enqueued over %d keys (%d refusals), %d done, %d worker kills", len(accepted), keys, func() int {
		n := 0
		for _, ids := range refusals {
			n += len(ids)
		}
		return n
	}(), done, kills)
}
