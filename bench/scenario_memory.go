package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// memoryCases measure Redis memory per scheduled task: Sizes.MemoryN tasks
// with Sizes.Payload-byte payloads are scheduled (8 producers, Schedule one
// by one, no consumer running) an hour ahead, either all within one second
// (burst) or spread evenly over an hour (spread). Reported:
// (used_memory after − used_memory before) / N, and that minus the payload
// size ("overhead"). "Before" is read after FLUSHALL (own server) and after
// 64 warm-up tasks were scheduled through the same producers, so connection
// buffers are already counted. Each reading waits for used_memory to
// settle (settledMemory): Redis frees client buffers lazily, in its cron,
// and on a busy machine a buffer still held at one reading outweighed a
// small N's tasks. (mem_clients_normal cannot be subtracted instead: from
// Redis 7.4 it counts the shared query buffer against the client using
// it, memory that used_memory holds all along.) The harness's task ID
// (≤7 digits) travels with each task and is part of the overhead.
//
// An implementation that can name its keys ([MemoryParter]) is also asked,
// before and after, what its keys hold by part (MEMORY USAGE, Redis ≥ 4),
// and the differences per task go to the result's detail "breakdown"
// (see [breakdown]), which docs/benchmarks.md renders as a table.
func memoryCases(s Sizes) []*Case {
	var cs []*Case
	for _, shape := range []string{"burst", "spread"} {
		n := s.MemoryN
		cs = append(cs, &Case{
			Scenario: "memory",
			Title:    fmt.Sprintf("%s, n=%d scheduled, payload=%dB", shape, n, s.Payload),
			Params:   map[string]any{"shape": shape, "n": n, "payload_bytes": s.Payload},
			Metrics:  []MetricDef{{Key: "overhead", Unit: "B/task"}, {Key: "total", Unit: "B/task"}},
			Needs:    needScheduler,
			Timeout:  5*time.Minute + time.Duration(n/1000)*time.Second,
			Run: func(ctx context.Context, m *Measure) (map[string]float64, error) {
				return runMemory(ctx, m, shape, n)
			},
		})
	}
	return cs
}

// runMemory performs one memory measurement.
func runMemory(ctx context.Context, m *Measure, shape string, n int) (map[string]float64, error) {
	sch := m.Impl.(Scheduler)
	base := time.Now().Add(time.Hour).Truncate(time.Second)
	due := func(i int) time.Time { return base.Add(time.Duration(i%1000) * time.Millisecond) }
	if shape == "spread" {
		step := time.Hour / time.Duration(max(n, 1))
		due = func(i int) time.Time { return base.Add(time.Duration(i) * step) }
	}
	ts := m.H.makeTasks(n, due)
	warm := m.H.makeTasks(64, func(int) time.Time { return base })
	for i := range warm {
		warm[i].ID = strconv.Itoa(n + i)
	}
	if err := parallel(ctx, len(warm), 8, func(i int) error { return sch.Schedule(ctx, warm[i]) }); err != nil {
		return nil, err
	}
	before, err := settledMemory(ctx, m.Admin)
	if err != nil {
		return nil, err
	}
	mp, parts := m.Impl.(MemoryParter)
	var partsBefore MemoryParts
	if parts {
		if partsBefore, err = mp.MemoryParts(ctx); errors.Is(err, errNoMemoryUsage) {
			parts = false
			m.Detail("breakdown_note", err.Error())
		} else if err != nil {
			return nil, fmt.Errorf("memory parts before: %w", err)
		}
		// The scan grows the admin connection's buffers: read it again.
		if before, err = settledMemory(ctx, m.Admin); err != nil {
			return nil, err
		}
	}
	if err := parallel(ctx, n, 8, func(i int) error { return sch.Schedule(ctx, ts[i]) }); err != nil {
		return nil, err
	}
	after, err := settledMemory(ctx, m.Admin)
	if err != nil {
		return nil, err
	}
	m.Detail("used_memory_before", before)
	m.Detail("used_memory_after", after)
	per := float64(after-before) / float64(n)
	if parts {
		partsAfter, err := mp.MemoryParts(ctx)
		if err != nil {
			return nil, fmt.Errorf("memory parts after: %w", err)
		}
		m.Detail("breakdown", breakdown(partsBefore, partsAfter, n, per))
	}
	return map[string]float64{"total": per, "overhead": per - float64(m.H.Sizes.Payload)}, nil
}

// settledMemory reads used_memory until two readings settleGap apart agree
// within settleSlack, for at most settleMax, and returns the last.
func settledMemory(ctx context.Context, a *Admin) (int64, error) {
	prev, err := a.InfoInt("memory", "used_memory")
	if err != nil {
		return 0, err
	}
	for end := time.Now().Add(settleMax); time.Now().Before(end); {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(settleGap):
		}
		cur, err := a.InfoInt("memory", "used_memory")
		if err != nil {
			return 0, err
		}
		if d := cur - prev; d >= -settleSlack && d <= settleSlack {
			return cur, nil
		}
		prev = cur
	}
	return prev, nil
}

// Settling of a used_memory reading: Redis's cron (hz 10) visits each
// client about once a second.
const (
	settleGap   = 300 * time.Millisecond
	settleSlack = 256 // bytes
	settleMax   = 10 * time.Second
)

// MemoryParter is an implementation that can say what its keys hold, by
// part, for the memory scenario's breakdown.
type MemoryParter interface {
	// MemoryParts sums MEMORY USAGE (SAMPLES 0) over the implementation's
	// keys by part. It returns an error wrapping errNoMemoryUsage when the
	// server has no MEMORY USAGE (before Redis 4).
	MemoryParts(ctx context.Context) (MemoryParts, error)
}

// errNoMemoryUsage says the server has no MEMORY USAGE command.
var errNoMemoryUsage = errors.New("the server has no MEMORY USAGE (Redis 4 or later): no breakdown")

// MemoryParts is what an implementation's keys hold, as MEMORY USAGE
// counts it: for a key, its dict entry, the key name's allocation, the
// value's object header and the value's allocations. Every field is a sum
// over the keys of its part.
type MemoryParts struct {
	Records      int64 // task record keys
	RecordBytes  int64 // the records' values (STRLEN)
	RecordNames  int64 // the records' key names, in bytes
	RecordHeads  int64 // the record keys without their values: MEMORY USAGE of a key of the same name length holding an integer
	RecordUsage  int64 // the record keys
	Buckets      int64 // bucket (list) keys
	BucketIDs    int64 // entries of the buckets (LLEN)
	BucketIDLen  int64 // bytes of those entries
	BucketNames  int64 // the bucket keys' names, in bytes
	BucketUsage  int64 // the bucket keys
	IndexMembers int64 // members of the bucket index
	IndexNames   int64 // bytes of those members
	IndexUsage   int64 // the index key
	Other        int64 // every other key of the implementation
	OtherUsage   int64
}

// Breakdown rows, in the order the page shows them; each is bytes per
// task, the difference after − before over the n tasks scheduled.
var breakdownRows = []struct{ Key, Label string }{
	{"record_key", "record key: dict entry, key name (`t:<id>`), object header"},
	{"record_value", "record value: the encoded record, payload included"},
	{"bucket", "bucket lists: key, list, and the id entries"},
	{"index", "index ZSET: the buckets' members and inline entries"},
	{"other", "other keys: counters, queue set, wake list"},
	{"rest", "rest: keyspace hash table slots, allocator (used_memory − the above)"},
}

// breakdown returns the per-task bytes of each part (the rows of
// breakdownRows), with the sizes that explain them.
func breakdown(b, a MemoryParts, n int, perTask float64) map[string]any {
	per := func(after, before int64) float64 { return float64(after-before) / float64(n) }
	avg := func(sum, count int64) float64 {
		if count == 0 {
			return 0
		}
		return float64(sum) / float64(count)
	}
	rows := map[string]float64{
		"record_key":   per(a.RecordHeads, b.RecordHeads),
		"record_value": per(a.RecordUsage-a.RecordHeads, b.RecordUsage-b.RecordHeads),
		"bucket":       per(a.BucketUsage, b.BucketUsage),
		"index":        per(a.IndexUsage, b.IndexUsage),
		"other":        per(a.OtherUsage, b.OtherUsage),
	}
	sum := 0.0
	for _, v := range rows {
		sum += v
	}
	rows["rest"] = perTask - sum
	return map[string]any{
		"bytes_per_task":         rows,
		"records":                a.Records,
		"record_bytes_avg":       avg(a.RecordBytes, a.Records),
		"record_key_name_avg":    avg(a.RecordNames, a.Records),
		"buckets":                a.Buckets,
		"tasks_per_bucket":       avg(a.BucketIDs, a.Buckets),
		"bucket_id_avg":          avg(a.BucketIDLen, a.BucketIDs),
		"bucket_key_name_avg":    avg(a.BucketNames, a.Buckets),
		"bucket_usage_avg":       avg(a.BucketUsage, a.Buckets),
		"index_members":          a.IndexMembers,
		"index_member_avg":       avg(a.IndexNames, a.IndexMembers),
		"index_usage_per_member": avg(a.IndexUsage, a.IndexMembers),
		"other_keys":             a.Other,
	}
}
