package engine

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/bucketq/bucketq/internal/safetext"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// MemoryPolicy is what a Redis server says of its memory limit
// (CONFIG GET maxmemory and maxmemory-policy): what happens to the
// engine's keys when memory runs out. Read it with [Inspector.MemoryPolicy];
// [Server.Run] reads it at start and refuses a policy that evicts any key.
type MemoryPolicy struct {
	// MaxMemory is the limit in bytes; 0 means none.
	MaxMemory int64
	// Policy is maxmemory-policy: noeviction, volatile-lru, allkeys-lru...
	Policy string
	// Unknown says why the server did not tell (CONFIG renamed or refused,
	// as on many managed services); empty when it did.
	Unknown string
}

// Evicts reports whether the server may evict keys without a TTL, task
// records among them: an allkeys-* policy with a limit set.
func (m MemoryPolicy) Evicts() bool {
	return m.Unknown == "" && m.MaxMemory > 0 && strings.HasPrefix(m.Policy, "allkeys-")
}

// String is a one-line account for logs, `engine check` and /readyz.
func (m MemoryPolicy) String() string {
	switch {
	case m.Unknown != "":
		return "unknown (" + m.Unknown + ")"
	case m.MaxMemory == 0:
		return "no maxmemory (policy " + m.Policy + " unused)"
	}
	s := fmt.Sprintf("maxmemory %d bytes, policy %s", m.MaxMemory, m.Policy)
	switch {
	case m.Evicts():
		s += ": tasks can be evicted and lost"
	case strings.HasPrefix(m.Policy, "volatile-"):
		s += ": keys with a TTL can be evicted"
	default:
		s += ": writes are refused when full, nothing is evicted"
	}
	return s
}

// volatileCost says which of the engine's keys carry a TTL, and what
// their eviction costs: for the one warning of a volatile-* policy.
const volatileCost = "the engine's keys with a TTL can be evicted when Redis is full: " +
	"a worker's heartbeat (its tasks are recovered and run again), " +
	"done and dead task records and results (Lookup, Wait and dead-letter listings lose them early; " +
	"a TaskID or unique key can then be reused), unique keys (a duplicate is accepted), " +
	"finished workflows' records, waiter marks (Wait notices the end later), a key's rate window " +
	"(the key may start more than its key_rate once), and the dispatch turn (harmless). Task records that wait or run carry no TTL and are never evicted. " +
	"Use maxmemory-policy noeviction to keep all of them: writes are then refused when full, and retried"

// readMemoryPolicy reads the server's memory limit and policy. A refused
// or renamed CONFIG is not an error: the policy is then Unknown.
func readMemoryPolicy(ctx context.Context, pool *redis.Pool) (MemoryPolicy, error) {
	conn, err := pool.GetContext(ctx)
	if err != nil {
		return MemoryPolicy{}, failed("get a connection", err)
	}
	defer conn.Close()
	var vals [2]string
	for i, name := range []string{"maxmemory", "maxmemory-policy"} {
		rep, err := txn.Do(ctx, conn, "CONFIG", "GET", name)
		if e, ok := err.(redis.Error); ok {
			return MemoryPolicy{Unknown: "CONFIG GET refused: " + safetext.Quote(string(e))}, nil
		}
		if err != nil {
			return MemoryPolicy{}, failed("CONFIG GET "+name, err)
		}
		if vals[i], err = configValue(rep); err != nil {
			return MemoryPolicy{Unknown: "CONFIG GET " + name + " answered " + err.Error()}, nil
		}
	}
	n, err := strconv.ParseInt(vals[0], 10, 64)
	if err != nil || n < 0 {
		return MemoryPolicy{Unknown: "maxmemory " + safetext.Quote(vals[0]) + " is not a number"}, nil
	}
	return MemoryPolicy{MaxMemory: n, Policy: vals[1]}, nil
}

// configValue is the value of a CONFIG GET reply: [name value].
func configValue(rep interface{}) (string, error) {
	kv, err := redis.Strings(rep, nil)
	if err != nil || len(kv) != 2 {
		return "", fmt.Errorf("%d fields, want a name and a value", len(kv))
	}
	return kv[1], nil
}

// checkMemoryPolicy is Server.Run's look at the memory policy: an error
// matching ErrEviction for an evicting policy unless allow; a warning for
// a volatile one, and a note when the server does not say. It logs once.
func checkMemoryPolicy(ctx context.Context, pool *redis.Pool, allow bool, log *slog.Logger) error {
	m, err := readMemoryPolicy(ctx, pool)
	if err != nil {
		// Redis is not reachable yet: the parts wait for it as they
		// always do; the policy is looked at by engine check.
		log.Warn("could not read the Redis memory policy", "err", err)
		return nil
	}
	switch {
	case m.Unknown != "":
		log.Info("the Redis memory policy is unknown; make sure it is noeviction or volatile-*: an allkeys-* policy evicts tasks", "why", m.Unknown)
	case m.Evicts() && !allow:
		return fmt.Errorf("engine: Redis has maxmemory %d and maxmemory-policy %s, which evicts any key when memory is full: tasks would be lost. "+
			"Set maxmemory-policy to noeviction (or a volatile-* policy), or set Config.AllowEviction to start anyway: %w", m.MaxMemory, m.Policy, ErrEviction)
	case m.Evicts():
		log.Warn("Redis may evict task records (Config.AllowEviction is set): tasks can be lost when memory is full", "policy", m.String())
	case m.MaxMemory > 0 && strings.HasPrefix(m.Policy, "volatile-"):
		log.Warn(volatileCost, "policy", m.String())
	}
	return nil
}

// MemoryPolicy is Inspector.MemoryPolicy for one lane.
func (in *laneInspector) MemoryPolicy(ctx context.Context) (MemoryPolicy, error) {
	return readMemoryPolicy(ctx, in.pool)
}
