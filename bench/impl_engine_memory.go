package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/gomodule/redigo/redis"
)

// MemoryParts implements MemoryParter: it walks the namespace's keys (SCAN)
// and sums MEMORY USAGE by part: task records (t:), buckets (b:), the
// bucket index (sched) and every other key.
func (e *engineImpl) MemoryParts(ctx context.Context) (MemoryParts, error) {
	var p MemoryParts
	keys := e.keys
	conn, err := e.pool.GetContext(ctx)
	if err != nil {
		return p, err
	}
	defer conn.Close()
	if _, err := conn.Do("MEMORY", "USAGE", keys.Schedule()); err != nil {
		var re redis.Error
		if errors.As(err, &re) {
			return p, fmt.Errorf("%w: %v", errNoMemoryUsage, err)
		}
		return p, err
	}
	var names []string
	cursor := "0"
	for {
		rep, err := redis.Values(conn.Do("SCAN", cursor, "MATCH", keys.Prefix()+"*", "COUNT", 1000))
		if err != nil || len(rep) != 2 {
			return p, fmt.Errorf("SCAN: %v", err)
		}
		cursor, _ = redis.String(rep[0], nil)
		batch, _ := redis.Strings(rep[1], nil)
		names = append(names, batch...)
		if cursor == "0" {
			break
		}
	}
	headOf := map[int]int64{} // record key name length → usage without the value
	const chunk = 1000
	for start := 0; start < len(names); start += chunk {
		part := names[start:min(start+chunk, len(names))]
		for _, k := range part {
			_ = conn.Send("MEMORY", "USAGE", k, "SAMPLES", 0)
			switch rest := strings.TrimPrefix(k, keys.Prefix()); {
			case strings.HasPrefix(rest, "t:"):
				_ = conn.Send("STRLEN", k)
			case strings.HasPrefix(rest, "b:"):
				_ = conn.Send("LRANGE", k, 0, -1)
			case k == keys.Schedule():
				_ = conn.Send("ZRANGE", k, 0, -1)
			}
		}
		if err := conn.Flush(); err != nil {
			return p, err
		}
		for _, k := range part {
			use, err := redis.Int64(conn.Receive())
			if err != nil {
				return p, fmt.Errorf("MEMORY USAGE %s: %w", k, err)
			}
			switch rest := strings.TrimPrefix(k, keys.Prefix()); {
			case strings.HasPrefix(rest, "t:"):
				n, err := redis.Int64(conn.Receive())
				if err != nil {
					return p, fmt.Errorf("STRLEN %s: %w", k, err)
				}
				p.Records++
				p.RecordUsage += use
				p.RecordBytes += n
				p.RecordNames += int64(len(k))
				headOf[len(k)] = 0
			case strings.HasPrefix(rest, "b:"):
				ids, err := redis.Strings(conn.Receive())
				if err != nil {
					return p, fmt.Errorf("LRANGE %s: %w", k, err)
				}
				p.Buckets++
				p.BucketUsage += use
				p.BucketNames += int64(len(k))
				p.BucketIDs += int64(len(ids))
				for _, id := range ids {
					p.BucketIDLen += int64(len(id))
				}
			case k == keys.Schedule():
				ms, err := redis.Strings(conn.Receive())
				if err != nil {
					return p, fmt.Errorf("ZRANGE %s: %w", k, err)
				}
				p.IndexUsage += use
				p.IndexMembers += int64(len(ms))
				for _, m := range ms {
					p.IndexNames += int64(len(m))
				}
			default:
				p.Other++
				p.OtherUsage += use
			}
		}
	}
	// A record key without its value: a probe key of the same name length
	// holding an integer (no value allocation), measured and deleted.
	for l := range headOf {
		probe := keys.Prefix() + "probe:"
		probe += strings.Repeat("x", max(l-len(probe), 0))
		if _, err := conn.Do("SET", probe, 12345); err != nil {
			return p, err
		}
		use, err := redis.Int64(conn.Do("MEMORY", "USAGE", probe, "SAMPLES", 0))
		if _, derr := conn.Do("DEL", probe); err == nil {
			err = derr
		}
		if err != nil {
			return p, fmt.Errorf("probe %s: %w", probe, err)
		}
		headOf[l] = use
	}
	for _, k := range names {
		if strings.HasPrefix(strings.TrimPrefix(k, keys.Prefix()), "t:") {
			p.RecordHeads += headOf[len(k)]
		}
	}
	return p, nil
}
