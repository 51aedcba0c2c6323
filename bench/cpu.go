package main

import (
	"runtime"
	"time"
)

// cpuMetrics are the figures cpuSpan adds to a measurement: the CPU time
// each task cost on each side, and how busy the machine's cores were.
var cpuMetrics = []MetricDef{
	{Key: "client_cpu", Unit: "µs/task"},
	{Key: "server_cpu", Unit: "µs/task"},
	{Key: "cores_busy", Unit: "%"},
}

// cpuSpan measures the CPU time spent over a span of a measurement on the
// client side (this process: every producer, worker and dispatcher of the
// implementation runs in it, and nothing else of the harness's does while
// a sequential case runs) and on the server side (INFO cpu). Client and
// server share the machine's cores, so together they tell whether a rate
// is bound by CPU (cores_busy near 100%) or by waiting, and which side's
// work a design could cut.
type cpuSpan struct {
	m              *Measure
	client, server float64
	at             time.Time
	ok             bool
}

// startCPU marks the start of the span. A server or system that cannot
// tell its CPU time leaves the figures out (n/a).
func startCPU(m *Measure) *cpuSpan {
	s := &cpuSpan{m: m, at: time.Now()}
	c, err1 := processCPU()
	v, err2 := m.Admin.ServerCPU()
	s.client, s.server, s.ok = c, v, err1 == nil && err2 == nil
	return s
}

// minCPUSpan is the shortest span whose CPU figures are reported. The
// kernel brings a running thread's CPU time up to date only at a scheduler
// tick or a switch (1–10 ms), so over a few milliseconds the figures are
// mostly that lag: a tiny smoke run once read 104% of both cores busy.
const minCPUSpan = 50 * time.Millisecond

// cpuNA says why a span's CPU figures are missing (the cell reads n/a).
var cpuNA = "CPU time not readable here, or the span was under " + minCPUSpan.String() + ", finer than the kernel's CPU accounting"

// isCPUMetric reports whether key is one of cpuMetrics.
func isCPUMetric(key string) bool {
	for _, md := range cpuMetrics {
		if md.Key == key {
			return true
		}
	}
	return false
}

// add ends the span and adds its figures for n tasks to out. The clock is
// read after both CPU counters, so the wall time encloses the CPU time
// measured (the server's includes its answer to INFO).
func (s *cpuSpan) add(out map[string]float64, n int) {
	if !s.ok || n <= 0 {
		return
	}
	c, err1 := processCPU()
	v, err2 := s.m.Admin.ServerCPU()
	span := time.Since(s.at)
	wall := span.Seconds()
	if err1 != nil || err2 != nil || span < minCPUSpan {
		return
	}
	dc, dv := c-s.client, v-s.server
	out["client_cpu"] = dc * 1e6 / float64(n)
	out["server_cpu"] = dv * 1e6 / float64(n)
	out["cores_busy"] = 100 * (dc + dv) / (wall * float64(runtime.NumCPU()))
}
