package compat_test

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/enginehook"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/gomodule/redigo/redis"
)

// childConfig is the scenario's configuration with the heartbeat settings
// of the child workers (200ms interval, 1s TTL).
func (e *env) childConfig() engine.Config {
	cfg := e.cfg
	cfg.Advanced.HeartbeatInterval, cfg.Advanced.HeartbeatTTL = childHeartbeatInterval, childHeartbeatTTL
	return cfg
}

// scenarioRecovery: a worker process is SIGKILLed while it runs two tasks;
// once its heartbeat expires a reaper in this process returns them, and
// they run to completion here, once each, counted as recovered.
func scenarioRecovery(e *env) {
	t, ctx := e.t, e.ctx
	e.cfg = e.childConfig()
	c := e.client()
	a := must(t)(c.Enqueue(ctx, "block", []byte("a")))
	b := must(t)(c.Enqueue(ctx, "block", []byte("b")))

	ch := e.startChild(childOpts{concurrency: 2})
	running := map[string]bool{}
	for i := 0; i < 2; i++ {
		f := strings.Fields(ch.waitLine("RUNNING ", 30*time.Second))
		running[f[1]] = true
		if f[2] != "1" || f[3] != "0" {
			t.Errorf("child ran %s with attempt %s, recoveries %s; want 1, 0", f[1], f[2], f[3])
		}
	}
	if !running[a] || !running[b] {
		t.Fatalf("child runs %v, want %s and %s", running, a, b)
	}
	if info := e.lookup(c, a); info.State != engine.StateRunning || info.Worker != ch.id {
		t.Errorf("task in the child: state %s, worker %s; want running, %s", info.State, info.Worker, ch.id)
	}
	ch.kill()
	killed := time.Now()

	// The reaper returns both once the dead worker's heartbeat is gone.
	e.reaper(e.cfg)
	testwait.Until(t, outcomeWait, "the reaper to return both tasks", func() bool {
		if e.stats("default").Recovered == 2 {
			return true
		}
		e.passTime(250 * time.Millisecond)
		return false
	})
	t.Logf("tasks of the killed worker returned %v after SIGKILL (heartbeat TTL %v)", time.Since(killed).Round(time.Millisecond), childHeartbeatTTL)
	for _, id := range []string{a, b} {
		if info := e.lookup(c, id); info.State != engine.StateReady || info.Recoveries != 1 || info.Worker != "" {
			t.Errorf("returned task: state %s, recoveries %d, worker %q; want ready, 1, none", info.State, info.Recoveries, info.Worker)
		}
	}
	if st := e.stats("default"); st.Ready != 2 || st.Running != 0 {
		t.Errorf("after recovery: %d ready, %d running; want 2, 0", st.Ready, st.Running)
	}

	var rec recorder
	e.worker(e.cfg, rec.handler())
	rec.waitRuns(t, 2)
	rec.exactlyOnce(t, []string{a, b})
	for _, r := range rec.all() {
		if r.Recoveries != 1 || r.Attempt != 1 || r.Payload != map[string]string{a: "a", b: "b"}[r.ID] {
			t.Errorf("recovered run %+v: want recoveries 1, attempt 1, its payload", r)
		}
	}
	testwait.Until(t, outcomeWait, "both tasks done", func() bool {
		return e.lookup(c, a).State == engine.StateDone && e.lookup(c, b).State == engine.StateDone
	})
	e.expectStats("default", "2 recovered, 2 processed, none running or failed", func(st engine.QueueInfo) bool {
		return st.Recovered == 2 && st.Processed == 2 && st.Running == 0 && st.Failed == 0
	})
}

// scenarioRecoveryInflight: a worker process is SIGKILLed after it took a
// task (RPOPLPUSH into its in-flight list) but before it claimed it; the
// reaper returns the task, which never started, so no recovery is counted.
func scenarioRecoveryInflight(e *env) {
	t, ctx := e.t, e.ctx
	e.cfg = e.childConfig()
	c := e.client()
	id := must(t)(c.Enqueue(ctx, "block", nil))
	ch := e.startChild(childOpts{concurrency: 1, claimGate: true}) // never opened
	if got := strings.TrimPrefix(ch.waitLine("POPPED ", 30*time.Second), "POPPED "); got != id {
		t.Fatalf("child took %s, want %s", got, id)
	}
	if st := e.stats("default"); st.Ready != 0 || st.Running != 0 {
		t.Errorf("task taken but not claimed: %d ready, %d running; want 0, 0", st.Ready, st.Running)
	}
	ch.kill()
	e.reaper(e.cfg)
	testwait.Until(t, outcomeWait, "the reaper to return the taken task", func() bool {
		if e.stats("default").Ready == 1 {
			return true
		}
		e.passTime(250 * time.Millisecond)
		return false
	})
	var rec recorder
	e.worker(e.cfg, rec.handler())
	rec.waitRuns(t, 1)
	rec.exactlyOnce(t, []string{id})
	if r := rec.all()[0]; r.Recoveries != 0 || r.Attempt != 1 {
		t.Errorf("task returned from the in-flight list ran with recoveries %d, attempt %d; want 0, 1", r.Recoveries, r.Attempt)
	}
	e.expectStats("default", "0 recovered (it never started), 1 processed", func(st engine.QueueInfo) bool {
		return st.Recovered == 0 && st.Processed == 1 && st.Running == 0
	})
}

// scenarioWatchExpiry is difference (b) of docs/compat.md: a watched key
// that expires between WATCH and EXEC aborts the transaction at Redis 7
// (and in miniredis), not at 2.4. The engine's one transaction where that
// can happen is a stopping worker's Forget: it WATCHes its heartbeat key,
// reads it alive, queues SREM w + DEL hb, and the key expires before EXEC.
// The hook holds the EXEC until the key has expired. Under redis7 the EXEC
// aborts and txn runs Forget again; under sim24 the seam replays the queued
// commands as 2.4 would have run them. Either way the worker must end up
// unregistered, with nothing left for a reaper.
func scenarioWatchExpiry(e *env, sim24 bool) {
	t, ctx := e.t, e.ctx
	cfg := e.cfg
	// A TTL of 5 s: on a loaded machine the stopping worker may take
	// seconds from its last heartbeat to Forget's read, which must find
	// the key alive.
	cfg.Advanced.HeartbeatInterval, cfg.Advanced.HeartbeatTTL = 500*time.Millisecond, 5*time.Second
	cfg.ShutdownTimeout = time.Minute // Forget is held until the key expired
	c := e.client()
	var rec recorder
	w, err := enginehook.NewWorker(e.pool, cfg, rec.handler())
	if err != nil {
		t.Fatal(err)
	}
	hb := e.key("hb:" + w.ID())
	hookAdmin := e.admin()
	var fired, nilSeen atomic.Int32
	var hookWait atomic.Int64 // how long the hook held Forget's EXEC
	var aliveAtHook, expired atomic.Bool
	forget := func(v txnView) bool { return v.watches("}:hb:"+w.ID()) && v.queues("SREM") }
	e.faults.set(func(f *faults) {
		f.beforeExec = func(v txnView) {
			if !forget(v) || fired.Add(1) != 1 {
				return
			}
			aliveAtHook.Store(e.exists(hookAdmin, hb))
			start := time.Now()
			defer func() { hookWait.Store(int64(time.Since(start))) }()
			deadline := start.Add(30 * time.Second)
			for time.Now().Before(deadline) {
				if !e.exists(hookAdmin, hb) {
					expired.Store(true)
					return
				}
				// The whole TTL at once on miniredis: the key expires at
				// the next look however slowly the loop turns.
				e.passTime(cfg.Advanced.HeartbeatTTL)
				// real time: Redis expires the heartbeat on its own
				// clock (a DEL would touch the WATCH, an expiry does not).
				time.Sleep(20 * time.Millisecond)
			}
		}
		f.replayNilExec = func(v txnView) bool {
			if !forget(v) {
				return false
			}
			nilSeen.Add(1)
			return sim24
		}
	})
	stop := e.run("worker", w.Run)
	id := must(t)(c.Enqueue(ctx, "x", nil))
	rec.waitRuns(t, 1)
	rec.exactlyOnce(t, []string{id})
	admin := e.admin()
	if !e.exists(admin, hb) {
		t.Fatalf("running worker has no heartbeat key %s", hb)
	}
	sctx, cancel := e.ctxTimeout(time.Minute)
	if err := w.Shutdown(sctx); err != nil {
		t.Errorf("Shutdown: %v (the hook held Forget's EXEC for %v)", err, time.Duration(hookWait.Load()))
	}
	cancel()
	stop()
	e.faults.set(nil)

	if fired.Load() < 1 || !expired.Load() {
		t.Fatalf("the stopping worker's Forget was seen %d times, heartbeat expired before its EXEC: %v", fired.Load(), expired.Load())
	}
	if !aliveAtHook.Load() {
		t.Errorf("the heartbeat had expired before Forget read it: the difference was not exercised (machine too slow?)")
	}
	got := execOutcome{aborts: int(nilSeen.Load()), reached: int(fired.Load()), replays: int(e.faults.replays.Load())}
	if want, ok := watchExpiryOutcome(e.kind.side, sim24); !ok {
		t.Logf("Redis %s: EXEC after the watched heartbeat expired: %+v (not asserted for this version)", e.kind.version, got)
	} else if got != want {
		// Redis 7.0.15 and miniredis v2.40.0 abort; a real 2.4 never does.
		t.Errorf("EXEC after the watched heartbeat expired, on a server of side %s (sim24 %v): %d aborts, Forget's EXEC reached %d times, "+
			"%d replays; want %+v (docs/compat.md, difference 2)", e.kind.side, sim24, got.aborts, got.reached, got.replays, want)
	}
	if e.exists(admin, hb) {
		t.Errorf("heartbeat key left after the worker stopped")
	}
	if n, _ := redis.Int(admin.Do("SISMEMBER", e.key("w"), w.ID())); n != 0 {
		t.Errorf("worker still registered after it stopped")
	}
	r, err := enginehook.NewReaper(e.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := r.Reap(ctx); err != nil || res != (enginehook.ReapResult{}) {
		t.Errorf("Reap after the worker stopped = %+v, %v; want nothing to do", res, err)
	}
}

// Modes of scenarioForgetRace: where the cut-off worker's RPOPLPUSH lands
// relative to the reaper's Forget of it.
const (
	popInWindow24  = iota // between Forget's reads and its EXEC, run as Redis 2.4 would
	popInWindow7          // between Forget's reads and its EXEC, as the server runs it (Redis 7, miniredis)
	popAfterForget        // after Forget's EXEC: no version difference at all
)

// scenarioForgetRace is the RPOPLPUSH half of difference (b): at 2.4 an
// RPOPLPUSH that creates its destination list does not invalidate a WATCH
// on it; at Redis 7 (and in miniredis) it does.
//
// A child worker process stays alive but its heartbeats fail after the
// first (cut off from Redis on that connection), so its heartbeat key
// expires. A reaper then returns its tasks and Forgets it: WATCH hb f p,
// read them empty, queue SREM w <worker>, EXEC. Were the child to take a
// task now (RPOPLPUSH into its in-flight list), claim it and die, no
// reaper would look at it again; at 2.4 even a take between Forget's reads
// and its EXEC would go unseen. The engine's answer does not depend on the
// version: a worker whose last successful heartbeat is older than its TTL
// less one interval takes nothing, so the child must leave the task alone,
// wherever the enqueue lands relative to Forget.
//
// popInWindow7 and popInWindow24: the task is enqueued between Forget's
// reads and its EXEC (the seam runs the queued commands as 2.4 would for
// popInWindow24); popAfterForget: after Forget's EXEC.
func scenarioForgetRace(e *env, mode int) {
	t, ctx := e.t, e.ctx
	e.cfg = e.childConfig()
	c := e.client()
	ch := e.startChild(childOpts{concurrency: 1, beats: 1, claimGate: true})
	hb := e.key("hb:" + ch.id)
	admin := e.admin()
	// The child registered with its one heartbeat; the next one fails
	// (the key, with a TTL of 1 s, may be gone already on a slow machine).
	ch.waitLine("BEATS OVER", outcomeWait)
	e.waitKeyGone(hb, 15*time.Second) // its later heartbeats fail

	var task string
	offer := func() {
		task = must(t)(c.Enqueue(ctx, "block", nil))
		// real time: the child would take the task within its idle
		// wait (1 s); a worker that takes nothing leaves no sign.
		time.Sleep(1500 * time.Millisecond)
		if l, ok := ch.hasLine("POPPED "); ok {
			t.Errorf("ENGINE BUG: a worker whose heartbeat had expired took a task (%s): a reaper may have forgotten it", l)
		}
	}
	var fired, nilSeen atomic.Int32
	forget := func(v txnView) bool { return v.watches("}:hb:"+ch.id) && v.queues("SREM") }
	e.faults.set(func(f *faults) {
		// Reap runs on this goroutine, so the hook may use t.
		f.beforeExec = func(v txnView) {
			if forget(v) && fired.Add(1) == 1 && mode != popAfterForget {
				offer()
			}
		}
		f.replayNilExec = func(v txnView) bool {
			if !forget(v) {
				return false
			}
			nilSeen.Add(1)
			return mode == popInWindow24
		}
	})
	r, err := enginehook.NewReaper(e.pool, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	redistest.WaitUp(t, e.pool, e.cfg.Advanced.HeartbeatTTL)
	res, err := r.Reap(ctx)
	e.faults.set(nil)
	if err != nil {
		t.Fatalf("Reap: %v", err)
	}
	if fired.Load() != 1 || res.DeadWorkers != 1 {
		t.Fatalf("Reap found %d dead workers and reached Forget's EXEC %d times; want 1, 1", res.DeadWorkers, fired.Load())
	}
	registered, _ := redis.Int(admin.Do("SISMEMBER", e.key("w"), ch.id))
	t.Logf("Forget's EXEC answered nil %d times; worker still registered: %v", nilSeen.Load(), registered == 1)
	if mode == popAfterForget {
		offer()
	}
	ch.openGate()
	ch.kill()

	// The task was left in its queue: a live worker runs it, as a first run.
	var rec recorder
	e.reaper(e.cfg)
	e.worker(e.cfg, rec.handler())
	testwait.Until(t, outcomeWait, "the task to be done", func() bool { return e.lookup(c, task).State == engine.StateDone })
	if runs := rec.of(task); len(runs) != 1 || runs[0].Recoveries != 0 {
		t.Errorf("task ran %d times here (%+v), want once with recoveries 0", len(runs), runs)
	}
}
