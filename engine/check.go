package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/txn"
)

// CheckOptions tunes Check.
type CheckOptions struct {
	// Repair fixes what can be fixed: a worker holding tasks is put back
	// in the registry, gauges are set to what the
	// structures hold, orphan buckets are put back in the bucket index,
	// stale and malformed index members are removed, and tasks without a
	// home are put back where their state says (a waiting task in its
	// bucket or at the front of its ready list, a running one in its
	// worker's pending set, a dead one in the dead letters). Each repair
	// is one optimistic transaction that reads again what it depends on,
	// so it is safe while workers and dispatchers run.
	Repair bool
	// NoKeyListing skips the one KEYS command of the check. Without it
	// the check walks only the structures (queues, bucket index, buckets,
	// ready, in-flight, pending and dead lists), and cannot find records
	// without a home nor buckets missing from the index. With it (the
	// default) KEYS {ns}:[tbfp]:* costs O(keys in the database) and
	// blocks the server while it runs: on a large database, run the
	// check off-peak or set this.
	NoKeyListing bool
}

// CheckFinding is one inconsistency Check found.
type CheckFinding struct {
	// Kind says what is wrong: "gauge" (a gauge differs from the
	// structures), "homeless" (a task in none of the places its state
	// needs), "duplicate" (a task in two places), "stray" (a task in a
	// place its state does not allow), "orphan-bucket", "stale-member",
	// "bad-member" (bucket index trouble), "wrong-type" (a key of the
	// wrong type), "retry-count" (a bucket's count of retries differs
	// from its retrying tasks), "unregistered-worker" (a worker holding
	// tasks, missing from the registry), "slots" (a queue's count of
	// slots in use differs from its running tasks that hold one).
	Kind    string
	Queue   string   // the queue concerned, if any
	TaskID  string   // the task concerned, if any
	Key     string   // the Redis key concerned, if any
	Worker  string   // the worker concerned (unregistered workers)
	Places  []string // keys that hold the task's id (duplicates, strays)
	Gauge   string   // the gauge (gauge findings): scheduled, retrying, running or dead
	Stored  int64    // the gauge's stored value
	Counted int64    // what the structures hold
	// Message says it in one sentence.
	Message string
	// Repaired: Check with Repair fixed it.
	Repaired bool
}

// CheckReport is what Check found.
type CheckReport struct {
	// Findings were seen twice, the second time by a walk that no change
	// to the keys concerned interrupted: they are not tasks in motion.
	Findings []CheckFinding
	// Unconfirmed were seen once, but the keys concerned kept changing
	// and a second walk could not settle them. Run the check again.
	Unconfirmed []CheckFinding
	// InMotion counts what a first walk saw and a settled second walk
	// did not: tasks that were moving between places, not damage.
	InMotion int
	// Remaining is, after repairs, what a fresh check still finds (nil
	// without Repair or when nothing was found).
	Remaining []CheckFinding
	// Repaired counts the findings that were fixed.
	Repaired int
	// Tasks and Queues count the task records and queues walked.
	Tasks, Queues int
}

// Check walks the namespace and reports inconsistencies: the gauges of
// each queue (scheduled, retrying, running, dead) recounted from the
// buckets, lists and records; task ids found in no place or in two;
// buckets missing from the index, index members with no bucket or that do
// not parse; keys of the wrong type. It reads a bounded number of
// elements per round trip, plus one KEYS unless opts.NoKeyListing.
//
// It is safe to run against a live system: what a first walk finds is
// reported only if a second walk, under WATCH of every key concerned,
// finds it again (see CheckReport). With opts.Repair it then fixes what
// can be fixed and checks again (CheckReport.Remaining).
func (c *laneClient) Check(ctx context.Context, opts CheckOptions) (*CheckReport, error) {
	if dl, ok := ctx.Deadline(); ok {
		// The KEYS of a large database may take longer than a round trip
		// is otherwise allowed (txn.DefaultRoundTrip): the caller's
		// deadline is the bound.
		ctx = txn.WithRoundTrip(ctx, time.Until(dl))
	}
	conn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	bo := buckets.CheckOptions{ListKeys: !opts.NoKeyListing}
	raw, err := c.store.CheckNamespace(ctx, conn, bo)
	if err != nil {
		return nil, fmt.Errorf("engine: check: %w", err)
	}
	rep := &CheckReport{Tasks: raw.Tasks, Queues: raw.Queues, InMotion: raw.InMotion,
		Findings: toFindings(raw.Findings), Unconfirmed: toFindings(raw.Unconfirmed)}
	if !opts.Repair || len(raw.Findings) == 0 {
		return rep, nil
	}
	// Index and homes first: putting a task back in a bucket moves the
	// scheduled gauge, which the gauge repair then recounts.
	gauges := map[string]bool{}
	for pass := 0; pass < 2; pass++ {
		for i, f := range raw.Findings {
			if (f.Kind == buckets.FindGauge) != (pass == 1) {
				continue
			}
			if f.Kind == buckets.FindGauge {
				if gauges[f.Queue] {
					rep.Findings[i].Repaired = true
					continue
				}
				gauges[f.Queue] = true
			}
			wrote, err := c.store.Repair(ctx, conn, bo, f, ms(c.cfg.Advanced.Clock.Now()))
			if err != nil {
				return rep, fmt.Errorf("engine: check: %w", err)
			}
			// A repair that found nothing left to do (a live process
			// fixed it meanwhile) counts as repaired too.
			rep.Findings[i].Repaired = wrote || repairable(f.Kind)
		}
	}
	for _, f := range rep.Findings {
		if f.Repaired {
			rep.Repaired++
		}
	}
	after, err := c.store.CheckNamespace(ctx, conn, bo)
	if err != nil {
		return rep, fmt.Errorf("engine: check after repair: %w", err)
	}
	rep.Remaining = toFindings(after.Findings)
	if rep.Remaining == nil {
		rep.Remaining = []CheckFinding{}
	}
	return rep, nil
}

func repairable(k buckets.FindingKind) bool {
	switch k {
	case buckets.FindGauge, buckets.FindHomeless, buckets.FindOrphanBucket, buckets.FindStaleMember, buckets.FindBadMember,
		buckets.FindUnregistered, buckets.FindUnlistedLevel, buckets.FindSlots:
		return true
	}
	return false
}

func toFindings(fs []buckets.Finding) []CheckFinding {
	if len(fs) == 0 {
		return nil
	}
	out := make([]CheckFinding, len(fs))
	for i, f := range fs {
		out[i] = CheckFinding{Kind: string(f.Kind), Queue: f.Queue, TaskID: f.ID, Key: f.Key, Worker: f.Worker,
			Places: f.Places, Gauge: f.Gauge, Stored: f.Stored, Counted: f.Count, Message: f.String()}
	}
	return out
}
