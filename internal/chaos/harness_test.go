package chaos

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/internal/chaos/ledger"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/gomodule/redigo/redis"
)

func TestParseCommand(t *testing.T) {
	cmd := "*3\r\n$5\r\nRPUSH\r\n$3\r\nkey\r\n$4\r\nv\r\nx\r\n"
	for i := 0; i < len(cmd); i++ {
		if _, _, ok := parseCommand([]byte(cmd[:i])); ok {
			t.Fatalf("prefix of %d bytes parsed as a whole command", i)
		}
	}
	name, size, ok := parseCommand([]byte(cmd + "*1\r\n$4\r\nEXEC\r\n"))
	if !ok || name != "RPUSH" || size != len(cmd) {
		t.Fatalf("got %q %d %v", name, size, ok)
	}
	if name, _, ok := parseCommand([]byte("*1\r\n$4\r\nexec\r\n")); !ok || name != "EXEC" {
		t.Fatalf("got %q %v", name, ok)
	}
}

func TestLedgerRoundTrip(t *testing.T) {
	dir := t.TempDir()
	pp := filepath.Join(dir, "p")
	w, err := ledger.Create(pp)
	if err != nil {
		t.Fatal(err)
	}
	_ = w.Write("H 42 -2000", "B p0.1.1 2 1000", "A p0.1.1 0 id-a 1500", "A p0.1.1 1 id-b 1600",
		"B p0.1.2 1 2000", "X p0.1.2 100", "B p0.1.3 1 3000", "F p0.1.3 buckets: EOF")
	w.Close()
	f, _ := os.OpenFile(pp, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("A p0.1.3 0 id-torn") // a torn last line is ignored
	f.Close()
	p, err := ledger.ReadProducer(pp)
	if err != nil {
		t.Fatal(err)
	}
	if p.PID != 42 || p.Offset != -2000 || len(p.Acked) != 2 || len(p.Batches) != 3 {
		t.Fatalf("got %+v", p)
	}
	if !p.Batches[0].Acked || !p.Batches[1].SelfKill || p.Batches[2].Failed != "buckets: EOF" {
		t.Fatalf("batches %+v %+v %+v", p.Batches[0], p.Batches[1], p.Batches[2])
	}
	hp := filepath.Join(dir, "h")
	w, _ = ledger.Create(hp)
	_ = w.Write(ledger.Start(ledger.Run{ID: "a", Start: 10, PID: 7, Payload: "batch:p0.1.1:0", Attempt: 1, Due: 5, Claimed: 9}),
		ledger.Start(ledger.Run{ID: "a", Start: 20, PID: 8, Payload: "batch:p0.1.1:0", Attempt: 1, Recoveries: 1, Due: 5, Key: "k1", Claimed: 19, Expires: 40}),
		ledger.End("a", 30, 8))
	w.Close()
	runs, err := ledger.ReadHandler(hp)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].End != 0 || runs[1].End != 30 || runs[1].Recoveries != 1 {
		t.Fatalf("runs %+v %+v", runs[0], runs[1])
	}
	if bid, i, ok := parseBatchPayload("batch:p0.1.12:7"); !ok || bid != "p0.1.12" || i != 7 {
		t.Fatalf("parseBatchPayload: %q %d %v", bid, i, ok)
	}
	if got := ledger.PayloadWord([]byte("batch:x:1 padding")); got != "batch:x:1" {
		t.Fatalf("PayloadWord: %q", got)
	}
}

// TestCheckCatchesSabotage damages a quiet run behind the engine's back
// (a task taken out of its bucket, a done task run again, a task made
// ready early) and expects the check to report each.
func TestCheckCatchesSabotage(t *testing.T) {
	if _, err := findRedisServer(); err != nil {
		t.Fatal(err)
	}
	buildOnce.Do(buildProc)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	sc := Scenario{Name: "sabotage", Doc: "the harness's self-test", Producers: 1, Dispatchers: 1, Reapers: 1,
		Workers: 1, Concurrency: 4, BatchMax: 5}
	var did struct{ lost, dup, early string }
	// The harness hands itself over once production began, and goes on
	// with its run when the test is done with the sabotage: the test's
	// goroutine waits for the damage it can do (testwait.Until).
	type faultWindow struct {
		h   *harness
		ctx context.Context // ends when the faults stop
	}
	hooked, sabotaged := make(chan faultWindow), make(chan struct{})
	hook := func(ctx context.Context, h *harness) {
		select {
		case hooked <- faultWindow{h, ctx}:
		case <-ctx.Done():
			return
		}
		select {
		case <-sabotaged:
		case <-ctx.Done():
		}
	}
	type result struct {
		rep *Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := Run(context.Background(), Options{Scenario: "sabotage", scenario: &sc, sabotage: hook,
			Tasks: 300, Duration: 3 * time.Second, Drain: 3 * time.Second, Seed: 1, Bin: procBin, Dir: t.TempDir()})
		done <- result{rep, err}
	}()
	var res result
	func() {
		// However the sabotage ends, the run goes on and is waited for.
		defer func() {
			close(sabotaged)
			if res.rep == nil && res.err == nil {
				res = <-done
			}
		}()
		var w faultWindow
		select {
		case w = <-hooked:
		case res = <-done:
			t.Fatalf("the run ended before its sabotage hook ran: %v", res.err)
		}
		keys, _ := buckets.NewKeys(w.h.ns)
		c := w.h.admin.Get()
		defer c.Close()
		// Done when the faults stop, too: an incomplete sabotage fails
		// below.
		testwait.Until(t, 10*time.Second, "a task taken out of its bucket, one run again and one made ready early", func() bool {
			if obs, err := w.h.collect(); err == nil && w.ctx.Err() == nil {
				sabotage(c, keys, obs, &did)
			}
			return did.lost != "" && did.dup != "" && did.early != "" || w.ctx.Err() != nil
		})
	}()
	rep, err := res.rep, res.err
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.String())
	if did.lost == "" || did.dup == "" || did.early == "" {
		t.Fatalf("sabotage incomplete: %+v", did)
	}
	got := map[string]bool{}
	for _, f := range rep.Failures {
		for _, k := range []string{"lost", "more often than interruptions explain", "before their due time"} {
			if strings.Contains(f, k) {
				got[k] = true
			}
		}
	}
	want := map[string]bool{"lost": true, "more often than interruptions explain": true, "before their due time": true}
	if !reflect.DeepEqual(got, want) || rep.Lost != 1 || rep.DupUnexplained != 1 || rep.EarlyBeyond != 1 {
		t.Errorf("the check missed sabotage: lost %d, unexplained duplicates %d, early %d; failures %q",
			rep.Lost, rep.DupUnexplained, rep.EarlyBeyond, rep.Failures)
	}
}

// sabotage damages the tasks obs shows, behind the engine's back: one
// due more than 1.5 s later is taken out of its bucket (lost), one due
// more than 2 s later is made ready at once (early), and one that ran to
// its end is made to wait and run again (dup). It does each once, and
// notes the task in did.
func sabotage(c redis.Conn, keys buckets.Keys, obs *observed, did *struct{ lost, dup, early string }) {
	for id, a := range obs.acked {
		due := a.Due - a.Offset
		ts := buckets.BucketTime(a.Due, 10)
		switch {
		case did.lost == "" && due > time.Now().Add(1500*time.Millisecond).UnixMilli():
			if n, _ := redis.Int(c.Do("LREM", keys.Bucket("default", ts), 0, id)); n == 1 {
				did.lost = id
			}
		case did.early == "" && due > time.Now().Add(2*time.Second).UnixMilli():
			if n, _ := redis.Int(c.Do("LREM", keys.Bucket("default", ts), 0, id)); n == 1 {
				_, _ = c.Do("LPUSH", keys.Ready("default"), id)
				did.early = id
			}
		case did.dup == "" && len(obs.runs[id]) == 1 && obs.runs[id][0].End != 0:
			raw, err := redis.Bytes(c.Do("GET", keys.Task(id)))
			r, derr := buckets.DecodeRecord(id, raw)
			if err != nil || derr != nil || r.State != buckets.StateDone {
				continue
			}
			r.State = buckets.StateWaiting
			_, _ = c.Do("SET", keys.Task(id), r.Encode())
			_, _ = c.Do("LPUSH", keys.Ready("default"), id)
			did.dup = id
		}
	}
}

// TestShortRunInjectsEveryFault: a run shorter than a fault loop's first
// gap keeps its faults on until the loop fired (untilFaultsFired), so a
// short run injects every fault its scenario is for.
func TestShortRunInjectsEveryFault(t *testing.T) {
	if _, err := findRedisServer(); err != nil {
		t.Fatal(err)
	}
	buildOnce.Do(buildProc)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	// The first restart comes 3-9 s in; production and delays are over
	// after 1.5 s.
	sc := Scenario{Name: "late-restart", Doc: "a restart later than the production", Producers: 1, Dispatchers: 1,
		Reapers: 1, Workers: 1, Concurrency: 4, BatchMax: 5, Restarts: 6 * time.Second}
	o := Options{Scenario: sc.Name, scenario: &sc, Tasks: 100, Duration: time.Second, DelayMax: 500 * time.Millisecond,
		Drain: 20 * time.Second, Seed: 1, Bin: procBin, Dir: t.TempDir()}
	type result struct {
		rep *Report
		err error
	}
	done := inPool(func() (r result) {
		r.rep, r.err = Run(context.Background(), o)
		return r
	})
	t.Parallel()
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	rep := res.rep
	t.Log("\n" + rep.String())
	restarts := rep.Faults["redis-server SIGTERM + restart"] + rep.Faults["redis-server SIGKILL + restart"]
	if restarts == 0 || !rep.OK() {
		t.Errorf("a run shorter than its restarts' first gap: %d restarts, failures %q, not exercised %q; want a restart and a pass",
			restarts, rep.Failures, rep.Unexercised)
	}
}
