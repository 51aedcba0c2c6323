package buckets

import (
	"context"
	"fmt"
	"sort"
	"strconv"

	"github.com/gomodule/redigo/redis"
)

// Control messages on [Keys.Control].
const (
	CtlPause  = "pause"
	CtlResume = "resume"
)

// Pause marks queue q paused, and tells the subscribed workers:
//
// queue   SADD paused q; SADD queues q; PUBLISH ctl "pause q"
//
// One MULTI without a WATCH (nothing is read). Workers then take no task
// from q: a claim reads the paused set under WATCH, so no task of q is
// claimed after this EXEC. A crash before EXEC changes nothing.
func (s *Store) Pause(ctx context.Context, conn redis.Conn, q string) error {
	var cmds cmdList
	cmds.Queue("SADD", s.Keys.Paused(), q)
	cmds.Queue("SADD", s.Keys.Queues(), q)
	cmds.Queue("PUBLISH", s.Keys.Control(), CtlPause+" "+q)
	if _, err := s.exec(ctx, conn, cmds); err != nil {
		return fmt.Errorf("buckets: pause %s: %w", q, err)
	}
	return nil
}

// Resume unpauses queue q, tells the subscribed workers, and wakes the
// idle ones:
//
// queue   SREM paused q; PUBLISH ctl "resume q"; LPUSH n:<q> tokens; LTRIM n:<q>
//
// One MULTI without a WATCH. A crash before EXEC changes nothing.
func (s *Store) Resume(ctx context.Context, conn redis.Conn, q string) error {
	var cmds cmdList
	cmds.Queue("SREM", s.Keys.Paused(), q)
	cmds.Queue("PUBLISH", s.Keys.Control(), CtlResume+" "+q)
	s.queueTokens(&cmds, s.Keys.Notify(q), wakeTokens, "1")
	if _, err := s.exec(ctx, conn, cmds); err != nil {
		return fmt.Errorf("buckets: resume %s: %w", q, err)
	}
	return nil
}

// PausedQueues lists the paused queues, sorted (SMEMBERS paused).
func (s *Store) PausedQueues(ctx context.Context, conn redis.Conn) ([]string, error) {
	qs, err := redis.Strings(do(ctx, conn, "SMEMBERS", s.Keys.Paused()))
	if err != nil {
		return nil, fmt.Errorf("buckets: paused queues: %w", err)
	}
	sort.Strings(qs)
	return qs, nil
}

// ParseControl reads a control message: its verb (CtlPause, CtlResume)
// and queue; ok is false for anything else.
func ParseControl(msg string) (verb, q string, ok bool) {
	for _, v := range []string{CtlPause, CtlResume} {
		if len(msg) > len(v)+1 && msg[:len(v)] == v && msg[len(v)] == ' ' && ValidName(msg[len(v)+1:]) {
			return v, msg[len(v)+1:], true
		}
	}
	return "", "", false
}

// Served is what a worker's heartbeat says it serves: the task types it
// has handlers for on queue Queue, for TTL seconds.
type Served struct {
	Queue string
	Types []string
	TTL   int64
}

// UnservedType is a task type some worker gave back on a queue while no
// live worker served it there.
type UnservedType struct {
	Queue, Type string
	Since       int64 // first seen unserved, Unix ms on that worker's clock
}

// Unserved lists the types that workers gave back and that no live worker
// serves now: HGETALL un:<q> for each queue named, then EXISTS
// ty:<q>:<type> for each type found (pipelined).
func (s *Store) Unserved(ctx context.Context, conn redis.Conn, queues []string) ([]UnservedType, error) {
	if len(queues) == 0 {
		return nil, nil
	}
	var cmds cmdList
	for _, q := range queues {
		cmds.Queue("HGETALL", s.Keys.Unserved(q))
	}
	reps, err := pipeline(ctx, conn, cmds)
	if err != nil {
		return nil, fmt.Errorf("buckets: unserved types: %w", err)
	}
	var cands []UnservedType
	for i, q := range queues {
		m, err := redis.StringMap(reps[i], nil)
		if err != nil {
			return nil, fmt.Errorf("buckets: unserved types of queue %s: %w", q, err)
		}
		for typ, since := range m {
			n, _ := strconv.ParseInt(since, 10, 64)
			cands = append(cands, UnservedType{Queue: q, Type: typ, Since: n})
		}
	}
	if len(cands) == 0 {
		return nil, nil
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].Queue != cands[j].Queue {
			return cands[i].Queue < cands[j].Queue
		}
		return cands[i].Type < cands[j].Type
	})
	cmds = nil
	for _, c := range cands {
		cmds.Queue("EXISTS", s.Keys.Served(c.Queue, c.Type))
	}
	reps, err = pipeline(ctx, conn, cmds)
	if err != nil {
		return nil, fmt.Errorf("buckets: unserved types: %w", err)
	}
	var out []UnservedType
	for i, c := range cands {
		if n, _ := redis.Int(reps[i], nil); n == 0 {
			out = append(out, c)
		}
	}
	return out, nil
}

// KnownQueues lists the queues ever enqueued to or paused, sorted
// (SMEMBERS queues).
func (s *Store) KnownQueues(ctx context.Context, conn redis.Conn) ([]string, error) {
	qs, err := redis.Strings(do(ctx, conn, "SMEMBERS", s.Keys.Queues()))
	if err != nil {
		return nil, fmt.Errorf("buckets: queues: %w", err)
	}
	sort.Strings(qs)
	return qs, nil
}
