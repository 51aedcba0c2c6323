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
	_ = w.Write(ledger.Start("a", 10, 7, "batch:p0.1.1:0", 1, 0, 5, "", 9, 0), ledger.Start("a", 20, 8, "batch:p0.1.1:0", 1, 1, 5, "k1", 19, 40),
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
	sabotage := func(ctx context.Context, h *harness) {
		keys, _ := buckets.NewKeys(h.ns)
		c := h.admin.Get()
		defer c.Close()
		deadline := time.Now().Add(10 * time.Second)
		for (did.lost == "" || did.dup == "" || did.early == "") && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			obs, err := h.collect()
			if err != nil {
				continue
			}
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
	}
	rep, err := Run(context.Background(), Options{Scenario: "sabotage", scenario: &sc, sabotage: sabotage,
		Tasks: 300, Duration: 3 * time.Second, Drain: 3 * time.Second, Seed: 1, Bin: procBin, Dir: t.TempDir()})
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
