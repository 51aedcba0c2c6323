package buckets

import (
	"context"
	"fmt"
	"sort"

	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// Enqueue writes tasks, all or none, in one MULTI/EXEC. It reads nothing,
// so it watches nothing. now (Unix ms, the producer's clock) decides which
// tasks go straight to their ready list (Due <= now) and which wait in the
// bucket of their due time rounded up to the resolution.
//
// Queued, in this order:
//
//	MSET       t:<id> <record> ...            every record
//	SADD       queues <q> ...                 every queue named
//	LPUSH      q:<q> <id> ...                 due tasks, per queue, in order
//	LPUSH/LTRIM n:<q> tokens                  wake idle workers of that queue
//	RPUSH      b:<q>:<ts> <id> ...            scheduled tasks, per bucket
//	ZADD       sched <ts> <q>:<ts>            index the bucket
//	HINCRBY    st:<q> scheduled <n>           per queue
//	LPUSH/LTRIM wake <earliest ts>            wake a sleeping dispatcher
//
// A crash before EXEC leaves nothing; after EXEC, everything. If the
// connection drops after EXEC was sent the caller cannot know which, and
// gets the error: retrying may then enqueue the tasks twice, never zero
// times.
func (s *Store) Enqueue(ctx context.Context, conn redis.Conn, now int64, recs []*Record) error {
	if len(recs) == 0 {
		return nil
	}
	var (
		mset      = []interface{}{}
		queues    = map[string]bool{}
		ready     = map[string][]string{}
		sched     = map[string]map[int64][]string{}
		readyQs   []string
		earliest  int64 = -1
		scheduled       = map[string]int{}
	)
	for _, r := range recs {
		mset = append(mset, s.Keys.Task(r.ID), r.Encode())
		queues[r.Queue] = true
		if r.Due <= now {
			if len(ready[r.Queue]) == 0 {
				readyQs = append(readyQs, r.Queue)
			}
			ready[r.Queue] = append(ready[r.Queue], r.ID)
			continue
		}
		ts := BucketTime(r.Due, s.Resolution)
		if sched[r.Queue] == nil {
			sched[r.Queue] = map[int64][]string{}
		}
		sched[r.Queue][ts] = append(sched[r.Queue][ts], r.ID)
		scheduled[r.Queue]++
		if earliest < 0 || ts < earliest {
			earliest = ts
		}
	}
	var cmds cmdList
	cmds.Queue("MSET", mset...)
	sadd := []interface{}{s.Keys.Queues()}
	for _, q := range sortedKeys(queues) {
		sadd = append(sadd, q)
	}
	cmds.Queue("SADD", sadd...)
	for _, q := range readyQs {
		s.pushReady(&cmds, q, ready[q], false)
	}
	for _, q := range sortedKeys(sched) {
		byTS := sched[q]
		tss := make([]int64, 0, len(byTS))
		for ts := range byTS {
			tss = append(tss, ts)
		}
		sort.Slice(tss, func(i, j int) bool { return tss[i] < tss[j] })
		for _, ts := range tss {
			s.scheduleBucket(&cmds, q, ts, byTS[ts])
		}
		cmds.Queue("HINCRBY", s.Keys.Stats(q), StatScheduled, scheduled[q])
	}
	if earliest >= 0 {
		s.wakeDispatchers(&cmds, earliest)
	}
	if _, err := s.exec(ctx, conn, cmds); err != nil {
		return fmt.Errorf("buckets: enqueue %d tasks: %w", len(recs), err)
	}
	return nil
}

// exec runs commands in one MULTI/EXEC without WATCH.
func (s *Store) exec(ctx context.Context, conn redis.Conn, cmds cmdList) ([]interface{}, error) {
	return s.runner().Run(ctx, conn, nil, func(tx *txn.Tx) error {
		for _, c := range cmds {
			tx.Queue(c.Name, c.Args...)
		}
		return nil
	})
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
