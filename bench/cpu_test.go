package main

import (
	"testing"
	"time"
)

// TestCPUSpanBounds times a span of busy work: its figures must be
// present, and the cores cannot be more than fully busy.
func TestCPUSpanBounds(t *testing.T) {
	m := &Measure{Admin: NewAdmin(testRedis.Addr)}
	defer m.Admin.Close()
	s := startCPU(m)
	if !s.ok {
		t.Skip("CPU time is not readable on this system") // proc_other.go
	}
	for end := time.Now().Add(2 * minCPUSpan); time.Now().Before(end); {
	}
	out := map[string]float64{}
	s.add(out, 1000)
	busy, ok := out["cores_busy"]
	if !ok {
		t.Fatalf("no CPU figures over %v: %v", 2*minCPUSpan, out)
	}
	if busy <= 0 || busy > 100 {
		t.Errorf("cores busy %v%%", busy)
	}
	if out["client_cpu"] <= 0 {
		t.Errorf("client CPU %v µs/task for a busy span", out["client_cpu"])
	}

	// A span shorter than minCPUSpan reports nothing.
	out = map[string]float64{}
	startCPU(m).add(out, 1000)
	for _, md := range cpuMetrics {
		if v, ok := out[md.Key]; ok {
			t.Errorf("%s = %v over a span far under %v", md.Key, v, minCPUSpan)
		}
	}
}
