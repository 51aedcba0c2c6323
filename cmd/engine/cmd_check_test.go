package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// runCheck prints the findings, counts what remains, and after --repair
// reports none left; --json prints the same as JSON.
func TestRunCheck(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ns := redistest.Namespace(t)
	t.Cleanup(func() { srv.Cleanup(t, ns) })
	c, err := engine.NewClient(engine.Config{Namespace: ns}, srv.Pool(t))
	if err != nil {
		t.Fatal(err)
	}
	in, err := engine.NewInspector(engine.Config{Namespace: ns}, srv.Pool(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Enqueue(ctx, "t", nil, engine.In(time.Hour)); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if n, err := runCheck(ctx, in, false, false, &out); err != nil || n != 0 || !strings.Contains(out.String(), "no findings") ||
		!strings.Contains(out.String(), "redis memory: ") {
		t.Fatalf("healthy: runCheck = %d, %v; output:\n%s", n, err, out.String())
	}
	stats := "{" + ns + "}:st:default"
	if _, err := srv.Admin(t).Do("HINCRBY", stats, "running", 2); err != nil {
		t.Fatal(err)
	}

	out.Reset()
	n, err := runCheck(ctx, in, false, false, &out)
	if err != nil || n != 1 || !strings.Contains(out.String(), "gauge running is 2, the structures hold 0") {
		t.Fatalf("damaged: runCheck = %d, %v; want 1 finding naming the gauge; output:\n%s", n, err, out.String())
	}

	out.Reset()
	n, err = runCheck(ctx, in, false, true, &out)
	var j checkJSON
	if err != nil || n != 1 || json.Unmarshal(out.Bytes(), &j) != nil || len(j.Findings) != 1 ||
		j.Findings[0].Kind != "gauge" || j.Findings[0].Stored == nil || *j.Findings[0].Stored != 2 {
		t.Fatalf("--json: runCheck = %d, %v; output:\n%s", n, err, out.String())
	}

	out.Reset()
	n, err = runCheck(ctx, in, true, false, &out)
	if err != nil || n != 0 || !strings.Contains(out.String(), "repaired 1; a fresh check finds 0") {
		t.Fatalf("--repair: runCheck = %d, %v; output:\n%s", n, err, out.String())
	}
	if v, err := redis.Int(srv.Admin(t).Do("HGET", stats, "running")); err != nil || v != 0 {
		t.Fatalf("running gauge after repair = %d, %v; want 0", v, err)
	}
}
