package buckets

import (
	"errors"
	"slices"
	"testing"

	"github.com/gomodule/redigo/redis"
)

// A move whose ready list becomes a string just before its MULTI is sent,
// and whose EXEC reply is lost: the EXEC ran (the buckets are gone) but its
// push failed, so its tasks are in no list. MoveDue reports the move as
// uncertain, and SettleMove on a fresh connection places them again.
func TestSettleMoveAfterLostExecReply(t *testing.T) {
	t.Parallel()
	for _, asideFirst := range []bool{false, true} {
		name := "string"
		if asideFirst {
			name = "set aside by a worker"
		}
		t.Run(name, func(t *testing.T) { settleAfterLostExecReply(t, asideFirst) })
	}
}

func settleAfterLostExecReply(t *testing.T, asideFirst bool) {
	st, pool, admin := realStore(t)
	ctx := testCtx(t)
	conn := pool.Get()
	defer conn.Close()
	due := t0 - 1000
	ids := []string{"a", "b", "c"}
	var recs []*Record
	for _, id := range ids {
		recs = append(recs, newRec(id, due))
	}
	if err := st.Enqueue(ctx, conn, t0-60_000, recs); err != nil {
		t.Fatal(err)
	}
	ready := st.Keys.Ready("q")
	hc := &hookConn{Conn: pool.Get(), hook: stringTrap(admin, ready, "not a list")}
	cc := &crashConn{inner: hc, at: "EXEC", after: true}
	defer cc.Close()
	res, err := st.MoveDue(ctx, []redis.Conn{cc}, MoveOpts{Now: t0, Chunk: 16, MaxTasks: 100, Lookahead: 128})
	if !errors.Is(err, errCrash) {
		t.Fatalf("MoveDue error = %v; want the injected crash", err)
	}
	if !hc.fired || !cc.fired {
		t.Fatalf("hook fired %v, crash fired %v; want both", hc.fired, cc.fired)
	}
	if len(res.Uncertain) != 1 {
		t.Fatalf("Uncertain = %+v; want the one move in flight", res.Uncertain)
	}
	// What the move took, told again from its reads when its outcome
	// went unseen: the bucket's three ids, its key, member and queue.
	bts := BucketTime(due, st.Resolution)
	if mb := res.Uncertain[0].Buckets; len(mb) != 1 || !slices.Equal(mb[0].IDs, ids) || mb[0].Queue != "q" ||
		mb[0].Key != st.Keys.Bucket("q", bts) || mb[0].Member != Member("q", bts) {
		t.Fatalf("uncertain move = %+v; want ids %v from bucket %s", mb, ids, st.Keys.Bucket("q", bts))
	}
	if n, err := redis.Int(admin.Do("EXISTS", st.Keys.Bucket("q", bts))); err != nil || n != 0 {
		t.Fatalf("bucket exists = %d (%v); want it removed by the EXEC that ran", n, err)
	}

	// The defect: the bucket is gone and the ready list is a string, so
	// the tasks are in no list; if a worker sets the string aside first,
	// the check finds them homeless.
	if typ, err := redis.String(admin.Do("TYPE", ready)); err != nil || typ != "string" {
		t.Fatalf("ready list type = %q (%v); want the string", typ, err)
	}
	fresh := pool.Get()
	defer fresh.Close()
	wantAside := []string{ready}
	if asideFirst {
		if moved, err := st.SetAside(ctx, fresh, "list", ready); err != nil || len(moved) != 1 {
			t.Fatalf("SetAside = %v, %v", moved, err)
		}
		wantAside = nil
		rep, err := st.CheckNamespace(ctx, fresh, CheckOptions{ListKeys: true})
		if err != nil {
			t.Fatal(err)
		}
		homeless := 0
		for _, f := range rep.Findings {
			if f.Kind == FindHomeless {
				homeless++
			}
		}
		if homeless != len(ids) {
			t.Fatalf("check before settling: %+v; want %d homeless tasks", rep, len(ids))
		}
	}

	var setAside []string
	st.OnSetAside = func(k, _ string) { setAside = append(setAside, k) }
	sr, err := st.SettleMove(ctx, fresh, res.Uncertain[0])
	if err != nil {
		t.Fatal(err)
	}
	if sr.Pushed != len(ids) || !slices.Equal(sr.SetAside, wantAside) || !slices.Equal(setAside, wantAside) {
		t.Fatalf("SettleMove = %+v (told of %v); want %d pushed and %s set aside", sr, setAside, len(ids), ready)
	}
	got, err := redis.Strings(admin.Do("LRANGE", ready, 0, -1))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if !slices.Equal(got, ids) {
		t.Fatalf("ready list = %v; want %v", got, ids)
	}
	if v, err := redis.String(admin.Do("GET", st.Keys.Quarantine(ready))); err != nil || v != "not a list" {
		t.Fatalf("quarantine = %q (%v); want the string set aside", v, err)
	}
	rep, err := st.CheckNamespace(ctx, fresh, CheckOptions{ListKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(rep.Findings, rep.Unconfirmed...) {
		if f.Kind == FindHomeless || f.Kind == FindDuplicate {
			t.Errorf("check: %+v", f)
		}
	}

	// Settling again finds the ids placed (a list now, but set aside
	// recently): it pushes duplicates, which Claim drops; it loses nothing.
	sr, err = st.SettleMove(ctx, fresh, res.Uncertain[0])
	if err != nil || len(sr.SetAside) != 0 || sr.Pushed != len(ids) {
		t.Fatalf("second SettleMove = %+v, %v; want the %d ids pushed again", sr, err, len(ids))
	}
	// A record no longer waiting needs nothing: a claimed one is not
	// pushed again, nor one whose record is gone (run and deleted).
	if _, cr, err := st.Claim(ctx, fresh, "w1", "q", "a", t0+10, lease, false, nil); err != nil || cr != Claimed {
		t.Fatalf("claim: %v, %v", cr, err)
	}
	if _, err := admin.Do("DEL", st.Keys.Task("b")); err != nil {
		t.Fatal(err)
	}
	sr, err = st.SettleMove(ctx, fresh, res.Uncertain[0])
	if err != nil || sr.Pushed != 1 {
		t.Fatalf("third SettleMove = %+v, %v; want only c pushed", sr, err)
	}
}

// A move that committed with its push intact, or that never reached EXEC,
// needs nothing.
func TestSettleMoveNothingToDo(t *testing.T) {
	t.Parallel()
	for _, ran := range []bool{true, false} {
		st, pool, admin := realStore(t)
		ctx := testCtx(t)
		conn := pool.Get()
		due := t0 - 1000
		if err := st.Enqueue(ctx, conn, t0-60_000, []*Record{newRec("a", due), newRec("b", due)}); err != nil {
			t.Fatal(err)
		}
		cc := &crashConn{inner: pool.Get(), at: "EXEC", after: ran}
		res, err := st.MoveDue(ctx, []redis.Conn{cc}, MoveOpts{Now: t0, Chunk: 16, MaxTasks: 100, Lookahead: 128})
		_ = cc.Close()
		if !errors.Is(err, errCrash) || len(res.Uncertain) != 1 {
			t.Fatalf("ran=%v: MoveDue = %+v, %v; want one uncertain move", ran, res, err)
		}
		sr, err := st.SettleMove(ctx, conn, res.Uncertain[0])
		if err != nil || sr.Pushed != 0 || len(sr.SetAside) != 0 {
			t.Fatalf("ran=%v: SettleMove = %+v, %v; want nothing done", ran, sr, err)
		}
		n, err := redis.Int(admin.Do("LLEN", st.Keys.Ready("q")))
		if err != nil || (ran && n != 2) || (!ran && n != 0) {
			t.Fatalf("ran=%v: ready list holds %d (%v)", ran, n, err)
		}
		conn.Close()
	}
}

// An enqueue of due tasks whose push meets a ready list replaced by a
// string, and whose EXEC reply is lost: the records are written but in no
// list; SettleEnqueue sets the string aside and pushes them.
func TestSettleEnqueueAfterLostExecReply(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	ctx := testCtx(t)
	ready := st.Keys.Ready("q")
	hc := &hookConn{Conn: pool.Get(), hook: stringTrap(admin, ready, "not a list")}
	cc := &crashConn{inner: hc, at: "EXEC", after: true}
	defer cc.Close()
	recs := []*Record{newRec("a", t0), newRec("b", t0)}
	if err := st.Enqueue(ctx, cc, t0, recs); !errors.Is(err, ErrUncertain) {
		t.Fatalf("Enqueue error = %v; want ErrUncertain", err)
	}
	conn := pool.Get()
	defer conn.Close()
	res, err := st.SettleEnqueue(ctx, conn, "q", []string{"a", "b"})
	if err != nil || res.Pushed != 2 {
		t.Fatalf("SettleEnqueue = %+v, %v; want both pushed", res, err)
	}
	ids, err := redis.Strings(admin.Do("LRANGE", ready, 0, -1))
	if err != nil || len(ids) != 2 {
		t.Fatalf("ready list = %v, %v; want a and b", ids, err)
	}
	rep, err := st.CheckNamespace(ctx, conn, CheckOptions{ListKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Findings {
		if f.Kind == FindHomeless {
			t.Fatalf("homeless after settling: %s", f)
		}
	}
}
