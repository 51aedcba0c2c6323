package buckets

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// batchEnv is a fresh namespace on a real server.
func batchEnv(t *testing.T) (*Store, redis.Conn, context.Context) {
	t.Helper()
	s, c := storeOn(t, redistest.Start(t))
	return s, c, context.Background()
}

// storeOn is a Store of a fresh namespace on srv (1 s buckets) and a
// connection to it, both cleaned up with t.
func storeOn(t testing.TB, srv *redistest.Server) (*Store, redis.Conn) {
	t.Helper()
	ns := redistest.Namespace(t)
	t.Cleanup(func() { srv.Cleanup(t, ns) })
	s, err := NewStore(ns, 1000)
	if err != nil {
		t.Fatal(err)
	}
	c := srv.Pool(t).Get()
	t.Cleanup(func() { c.Close() })
	return s, c
}

func popAll(t *testing.T, s *Store, c redis.Conn, n int) []string {
	t.Helper()
	ids, err := s.PopMany(context.Background(), c, "q", w1, n)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// PopMany takes the oldest tasks first, into the in-flight list, and
// returns fewer when the queue runs out.
func TestPopMany(t *testing.T) {
	t.Parallel()
	s, c, ctx := batchEnv(t)
	if err := enqueued("a", "b", "c")(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	ids := popAll(t, s, c, 5)
	if !slices.Equal(ids, []string{"a", "b", "c"}) {
		t.Fatalf("PopMany = %v, want [a b c]", ids)
	}
	inflight, _ := redis.Strings(c.Do("LRANGE", s.Keys.Inflight(w1), 0, -1))
	slices.Sort(inflight)
	if !slices.Equal(inflight, ids) {
		t.Errorf("in-flight list %v, want the popped ids", inflight)
	}
	if ids := popAll(t, s, c, 4); len(ids) != 0 {
		t.Errorf("PopMany of an empty queue = %v", ids)
	}
}

// ClaimBatch claims every waiting task, buries a missing record, drops a
// cancelled one, and leaves the in-flight list empty, in one transaction.
func TestClaimBatch(t *testing.T) {
	t.Parallel()
	s, c, ctx := batchEnv(t)
	if err := enqueued("a", "b", "c", "d")(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	ids := popAll(t, s, c, 4)
	if _, err := c.Do("DEL", s.Keys.Task("c")); err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx, c, "d", t0+5, 60); err != nil {
		t.Fatal(err)
	}
	cs := make([]ClaimState, len(ids))
	recs, res, err := s.ClaimBatch(ctx, c, w1, "q", ids, t0+10, lease, cs, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []ClaimResult{Claimed, Claimed, Buried, Skipped}
	if !slices.Equal(res, want) {
		t.Fatalf("results %v, want %v", res, want)
	}
	for i, r := range recs[:2] {
		if r == nil || r.ID != ids[i] || r.State != StateRunning || r.Worker != w1 || r.Runs != 1 {
			t.Errorf("record %d: %+v", i, r)
		}
	}
	if recs[2] != nil || recs[3] != nil {
		t.Errorf("records of unclaimed ids: %v %v", recs[2], recs[3])
	}
	if n, _ := redis.Int(c.Do("LLEN", s.Keys.Inflight(w1))); n != 0 {
		t.Errorf("%d ids left in the in-flight list", n)
	}
	if n, _ := redis.Int(c.Do("ZCARD", s.Keys.Pending(w1))); n != 2 {
		t.Errorf("%d pending, want 2", n)
	}
	if n, _ := redis.Int(c.Do("HGET", s.Keys.Stats("q"), StatRunning)); n != 2 {
		t.Errorf("running gauge %d, want 2", n)
	}
	if dead, _ := s.DeadIDs(ctx, c, 0, 10); !slices.Equal(dead, []string{"c"}) {
		t.Errorf("dead letters %v, want [c]", dead)
	}
}

// A batch of a paused queue goes back in its order: the oldest is again
// the next to pop.
func TestClaimBatchPaused(t *testing.T) {
	t.Parallel()
	s, c, ctx := batchEnv(t)
	if err := enqueued("a", "b", "c")(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	ids := popAll(t, s, c, 3)
	if err := s.Pause(ctx, c, "q"); err != nil {
		t.Fatal(err)
	}
	_, res, err := s.ClaimBatch(ctx, c, w1, "q", ids, t0+10, lease, make([]ClaimState, 3), false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res, []ClaimResult{Paused, Paused, Paused}) {
		t.Fatalf("results %v", res)
	}
	if again := popAll(t, s, c, 3); !slices.Equal(again, ids) {
		t.Errorf("popped again %v, want %v", again, ids)
	}
}

// A batch whose EXEC reply was lost, tried again with the same claim
// states, recognises its own claims instead of taking them for another's.
func TestClaimBatchLostReply(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ns := redistest.Namespace(t)
	t.Cleanup(func() { srv.Cleanup(t, ns) })
	s, _ := NewStore(ns, 1000)
	pool := srv.Pool(t)
	ctx := context.Background()
	c := pool.Get()
	defer c.Close()
	if err := enqueued("a", "b")(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	ids := popAll(t, s, c, 2)
	cs := make([]ClaimState, 2)
	cc := &crashConn{inner: pool.Get(), at: "EXEC", after: true}
	if _, _, err := s.ClaimBatch(ctx, cc, w1, "q", ids, t0+10, lease, cs, false); !errors.Is(err, errCrash) {
		t.Fatalf("ClaimBatch on a cut connection: %v", err)
	}
	cc.Close()
	recs, res, err := s.ClaimBatch(ctx, c, w1, "q", ids, t0+10, lease, cs, false)
	if err != nil || !slices.Equal(res, []ClaimResult{Claimed, Claimed}) {
		t.Fatalf("retry: %v, %v", res, err)
	}
	for _, r := range recs {
		if r.Runs != 1 {
			t.Errorf("%s: run %d, want the first run (claimed once)", r.ID, r.Runs)
		}
	}
	if n, _ := redis.Int(c.Do("HGET", s.Keys.Stats("q"), StatRunning)); n != 2 {
		t.Errorf("running gauge %d, want 2 (each claim counted once)", n)
	}
}

// FinishGroup records each run's own outcome, and writes nothing for a
// run that is no longer the record's or whose record is gone.
func TestFinishGroup(t *testing.T) {
	t.Parallel()
	s, c, ctx := batchEnv(t)
	if err := claimed("a", "b", "c", "d")(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do("DEL", s.Keys.Task("d")); err != nil {
		t.Fatal(err)
	}
	done := func(*Record) Outcome { return Done }
	items := []FinishItem{
		{ID: "a", Run: 1, Now: t0 + 20, Decide: done},
		{ID: "b", Run: 1, Now: t0 + 20, Decide: func(r *Record) Outcome {
			r.State, r.Attempts, r.Due, r.LastError = StateRetry, 1, t0+30_000, "boom"
			return Again
		}},
		{ID: "c", Run: 2, Now: t0 + 20, Decide: done}, // not this run
		{ID: "d", Run: 1, Now: t0 + 20, Decide: done},
	}
	res, err := s.FinishGroup(ctx, c, w1, items, 60)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Err != nil || res[0].Out != Done || res[1].Err != nil || res[1].Out != Again {
		t.Errorf("a, b: %+v %+v", res[0], res[1])
	}
	if !errors.Is(res[2].Err, ErrLeaseLost) || res[2].Rec == nil || res[2].Rec.State != StateRunning {
		t.Errorf("c: %+v, want ErrLeaseLost with the record as it is", res[2])
	}
	if !errors.Is(res[3].Err, ErrNotFound) {
		t.Errorf("d: %+v, want ErrNotFound", res[3])
	}
	recs, errs, err := s.Records(ctx, c, []string{"a", "b", "c"})
	if err != nil || errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatal(err, errs)
	}
	if recs[0].State != StateDone || recs[1].State != StateRetry || recs[2].State != StateRunning {
		t.Errorf("states %v %v %v, want done retry running", recs[0].State, recs[1].State, recs[2].State)
	}
	pending, _ := redis.Strings(c.Do("ZRANGE", s.Keys.Pending(w1), 0, -1))
	slices.Sort(pending)
	if !slices.Equal(pending, []string{"c", "d"}) {
		t.Errorf("pending %v, want [c d] (d is left for Finish to abandon)", pending)
	}
	if n, _ := redis.Int(c.Do("HGET", s.Keys.Stats("q"), StatRunning)); n != 2 {
		t.Errorf("running gauge %d, want 2", n)
	}
}

// An id that is twice in the ready list, popped twice into one batch, is
// claimed once: one run, and the running gauge counts it once.
func TestClaimBatchDuplicateID(t *testing.T) {
	t.Parallel()
	s, c, ctx := batchEnv(t)
	if err := enqueued("a")(ctx, s, c); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do("LPUSH", s.Keys.Ready("q"), "a"); err != nil {
		t.Fatal(err)
	}
	ids := popAll(t, s, c, 2)
	if !slices.Equal(ids, []string{"a", "a"}) {
		t.Fatalf("popped %v", ids)
	}
	recs, res, err := s.ClaimBatch(ctx, c, w1, "q", ids, t0+10, lease, make([]ClaimState, 2), false)
	if err != nil {
		t.Fatal(err)
	}
	if res[0] != Claimed || res[1] != Skipped || recs[1] != nil {
		t.Fatalf("results %v, records %v", res, recs)
	}
	if n, _ := redis.Int(c.Do("HGET", s.Keys.Stats("q"), StatRunning)); n != 1 {
		t.Errorf("running gauge %d, want 1", n)
	}
	if n, _ := redis.Int(c.Do("LLEN", s.Keys.Inflight(w1))); n != 0 {
		t.Errorf("%d ids left in the in-flight list", n)
	}
	fr, err := s.FinishGroup(ctx, c, w1, []FinishItem{
		{ID: "a", Run: 1, Now: t0 + 20, Decide: func(*Record) Outcome { return Done }},
		{ID: "a", Run: 1, Now: t0 + 20, Decide: func(*Record) Outcome { return Done }},
	}, 60)
	if err != nil || fr[0].Err != nil || !errors.Is(fr[1].Err, ErrLeaseLost) {
		t.Fatalf("FinishGroup of one run twice: %+v, %v", fr, err)
	}
	if n, _ := redis.Int(c.Do("HGET", s.Keys.Stats("q"), StatProcessed)); n != 1 {
		t.Errorf("processed %d, want 1", n)
	}
}

// coalesce sums increments and joins sorted-set members only where no
// other command on the key stands between.
func TestCoalesce(t *testing.T) {
	t.Parallel()
	var in cmdList
	in.Queue("ZREM", "p", "a")
	in.Queue("HINCRBY", "st", "running", -1)
	in.Queue("SETEX", "t:a", 60, "x")
	in.Queue("HINCRBY", "st", "processed", 1)
	in.Queue("ZREM", "p", "b")
	in.Queue("HINCRBY", "st", "running", -1)
	in.Queue("HINCRBY", "st", "processed", 1)
	in.Queue("ZADD", "z", 1, "a")
	in.Queue("DEL", "z")
	in.Queue("ZADD", "z", 2, "b")
	// SETs of distinct keys join the first as one MSET, unless a command
	// since names the key (a RENAME of it, another SET of it).
	in.Queue("SET", "t:c", "1")
	in.Queue("LREM", "f", 1, "c")
	in.Queue("SET", "t:d", "2")
	in.Queue("RENAME", "t:e", "bad:t:e")
	in.Queue("SET", "t:e", "3")
	in.Queue("SET", "t:c", "4")
	in.Queue("SET", "t:f", "5")
	got := coalesce(in)
	want := []string{
		"ZREM [p a b]", "HINCRBY [st running -2]", "SETEX [t:a 60 x]", "HINCRBY [st processed 2]",
		"ZADD [z 1 a]", "DEL [z]", "ZADD [z 2 b]",
		"MSET [t:c 1 t:d 2]", "LREM [f 1 c]", "RENAME [t:e bad:t:e]", "MSET [t:e 3 t:c 4 t:f 5]",
	}
	var have []string
	for _, c := range got {
		have = append(have, c.Name+" "+fmt.Sprint(c.Args))
	}
	if !slices.Equal(have, want) {
		t.Errorf("coalesce:\n got %q\nwant %q", have, want)
	}

	// A result group's slot returns: one counter change, and its wake-up
	// tokens in at most a push, a trim and a push.
	in = nil
	for i := 0; i < 6; i++ {
		in.Queue("INCR", "sl")
		in.Queue("DECR", "sl")
		in.Queue("DECR", "sl")
		in.Queue("LPUSH", "sw", "1")
		if i%4 == 0 {
			in.Queue("LTRIM", "sw", 0, 7)
		}
	}
	in.Queue("DECRBY", "sl", 2)
	have = nil
	for _, c := range coalesce(in) {
		have = append(have, c.Name+" "+fmt.Sprint(c.Args))
	}
	want = []string{"INCRBY [sl -8]", "LPUSH [sw 1 1 1 1 1]", "LTRIM [sw 0 7]", "LPUSH [sw 1]"}
	if !slices.Equal(have, want) {
		t.Errorf("coalesce:\n got %q\nwant %q", have, want)
	}
}

// coalesce leaves every key as the writes it was given would: random
// lists of writes over a few keys (counters, hashes, sorted sets, lists
// with head trims, and commands that stand between merges: DEL, RENAME,
// LREM, SETs of the other keys) run as given under one prefix and
// coalesced under another, each in one MULTI/EXEC, and every key is read
// back and compared. Keys are used as the wrong type now and then, so
// commands fail inside EXEC the same way on both sides.
func TestCoalesceKeepsEffect(t *testing.T) {
	t.Parallel()
	s, c, ctx := batchEnv(t)
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"s", "c", "h", "z", "l", "m"}
	vals := []string{"1", "2", "x", "s", "l"} // some name keys: only keys' places count
	pick := func(from []string) string { return from[rng.IntN(len(from))] }
	type op struct {
		name string
		args []interface{} // keys as *string, to be prefixed
	}
	k := func(name string) *string { return &name }
	gen := func() []op {
		var ops []op
		for n := rng.IntN(14); n > 0; n-- {
			var o op
			switch rng.IntN(13) {
			case 0:
				o = op{"SET", []interface{}{k(pick(keys)), pick(vals)}}
			case 1:
				o = op{"HINCRBY", []interface{}{k(pick(keys)), pick([]string{"f", "g"}), rng.IntN(3) - 1}}
			case 2:
				o = op{"ZADD", []interface{}{k(pick(keys)), rng.IntN(5), pick(vals)}}
			case 3:
				o = op{"ZREM", []interface{}{k(pick(keys)), pick(vals)}}
			case 4:
				o = op{"DEL", []interface{}{k(pick(keys))}}
			case 5:
				o = op{"RENAME", []interface{}{k(pick(keys)), k(pick(keys))}}
			case 6:
				o = op{"LREM", []interface{}{k(pick(keys)), 1, pick(vals)}}
			case 7:
				o = op{pick([]string{"INCR", "DECR"}), []interface{}{k(pick([]string{"c", "c", "s"}))}}
			case 8:
				o = op{pick([]string{"INCRBY", "DECRBY"}), []interface{}{k(pick([]string{"c", "c", "s"})), int64(rng.IntN(4))}}
			case 9, 10:
				o = op{"LPUSH", []interface{}{k(pick([]string{"l", "l", "m"}))}}
				for n := 1 + rng.IntN(3); n > 0; n-- {
					o.args = append(o.args, pick(vals))
				}
			case 11:
				o = op{"LTRIM", []interface{}{k(pick([]string{"l", "l", "m"})), 0, 1 + rng.IntN(3)/2}}
			default:
				o = op{"RPUSH", []interface{}{k(pick([]string{"l", "m"})), pick(vals)}}
			}
			ops = append(ops, o)
		}
		return ops
	}
	under := func(prefix string, ops []op) cmdList {
		var cmds cmdList
		for _, o := range ops {
			args := make([]interface{}, len(o.args))
			for i, a := range o.args {
				if p, ok := a.(*string); ok {
					a = s.Keys.prefix + prefix + *p
				}
				args[i] = a
			}
			cmds.Queue(o.name, args...)
		}
		return cmds
	}
	state := func(prefix string) []string {
		var out []string
		for _, key := range keys {
			name := s.Keys.prefix + prefix + key
			typ, err := redis.String(c.Do("TYPE", name))
			if err != nil {
				t.Fatal(err)
			}
			var v interface{}
			switch typ {
			case "string":
				v, err = redis.String(c.Do("GET", name))
			case "hash":
				var m map[string]string
				m, err = redis.StringMap(c.Do("HGETALL", name))
				v = fmt.Sprint(m)
			case "zset":
				v, err = redis.Strings(c.Do("ZRANGE", name, 0, -1, "WITHSCORES"))
			case "list":
				v, err = redis.Strings(c.Do("LRANGE", name, 0, -1))
			}
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%s %s %v", key, typ, v))
		}
		return out
	}
	exec := func(cmds cmdList) {
		// Commands that fail inside EXEC (a wrong type, RENAME of a
		// missing key) are part of what is compared.
		_, _ = s.runner.Run(ctx, c, nil, func(tx *txn.Tx) error {
			tx.QueueAll(cmds)
			return nil
		})
	}
	merged := 0
	for round := 0; round < 800; round++ {
		ops := gen()
		given := under("a:", ops)
		shown := fmt.Sprint(given)
		got := coalesce(under("b:", ops))
		merged += len(ops) - len(got)
		if after := fmt.Sprint(given); after != shown {
			t.Fatalf("coalesce changed its input's Args: %s, was %s", after, shown)
		}
		exec(given)
		exec(got)
		if a, b := state("a:"), state("b:"); !slices.Equal(a, b) {
			t.Fatalf("writes %s\ncoalesced %s\nleave %q\nnot %q", shown, fmt.Sprint(got), b, a)
		}
		var del []interface{}
		for _, key := range keys {
			del = append(del, s.Keys.prefix+"a:"+key, s.Keys.prefix+"b:"+key)
		}
		if _, err := c.Do("DEL", del...); err != nil {
			t.Fatal(err)
		}
	}
	if merged == 0 {
		t.Fatal("no command was merged: the lists test nothing")
	}
	t.Logf("%d commands merged away", merged)
}

// A worker forgotten by a reaper while it was cut off (its heartbeat
// expired, its in-flight list given back, then Forget) may still claim
// the ids it had popped once it is back, before its next full beat. The
// claim registers it again in the same EXEC: otherwise, had it died
// then, its pending set would be where no reaper looks.
func TestClaimRegistersForgottenWorker(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			s, c, ctx := batchEnv(t)
			if err := enqueued("a", "b")(ctx, s, c); err != nil {
				t.Fatal(err)
			}
			if err := s.Beat(ctx, c, w1, 30, []byte("{}")); err != nil {
				t.Fatal(err)
			}
			ids := popAll(t, s, c, 2)
			// What a reaper does to a worker whose heartbeat expired: the
			// in-flight ids go back, then the worker is forgotten.
			if _, err := c.Do("DEL", s.Keys.Heartbeat(w1)); err != nil {
				t.Fatal(err)
			}
			if _, err := s.RecoverAllInflight(ctx, c, w1, t0+5, true); err != nil {
				t.Fatal(err)
			}
			if ok, err := s.Forget(ctx, c, w1, true); err != nil || !ok {
				t.Fatalf("Forget = %v, %v; want the worker forgotten", ok, err)
			}
			var res []ClaimResult
			if batch {
				_, r, err := s.ClaimBatch(ctx, c, w1, "q", ids, t0+10, lease, make([]ClaimState, len(ids)), false)
				if err != nil {
					t.Fatal(err)
				}
				res = r
			} else {
				for _, id := range ids {
					_, r, err := s.Claim(ctx, c, w1, "q", id, t0+10, lease, false, &ClaimState{})
					if err != nil {
						t.Fatal(err)
					}
					res = append(res, r)
				}
			}
			if !slices.Equal(res, []ClaimResult{Claimed, Claimed}) {
				t.Fatalf("claims %v, want both claimed", res)
			}
			if n, _ := redis.Int(c.Do("ZCARD", s.Keys.Pending(w1))); n != 2 {
				t.Fatalf("pending set holds %d, want 2", n)
			}
			if ok, err := redis.Bool(c.Do("SISMEMBER", s.Keys.Workers(), w1)); err != nil || !ok {
				t.Errorf("the claim left the worker unregistered (%v, %v): a reaper would never return its pending tasks", ok, err)
			}
			// And the namespace check agrees.
			rep, err := s.CheckNamespace(ctx, c, CheckOptions{ListKeys: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range rep.Findings {
				if f.Kind == FindUnregistered {
					t.Errorf("check: %v", f)
				}
			}
		})
	}
}
