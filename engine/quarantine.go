package engine

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// Log attribute keys.
const (
	keyComponent = "component"
	keyTaskID    = "task_id"
	keyQueue     = "queue"
	keyType      = "type"
	keyWorker    = "worker"
	keyAttempt   = "attempt"
	keyErr       = "err"
)

// setAside renames keys of the wrong type (written by hand, say) out of
// the way on a pooled connection, logging each one.
func setAside(ctx context.Context, pool *redis.Pool, st interface {
	SetAside(context.Context, redis.Conn, string, ...string) ([]string, error)
}, keys buckets.Keys, log *slog.Logger, want string, names ...string) {
	conn, err := pool.GetContext(ctx)
	if err != nil {
		return
	}
	defer conn.Close()
	moved, err := st.SetAside(ctx, conn, want, names...)
	logSetAside(log, keys, moved, err)
}

func logSetAside(log *slog.Logger, keys buckets.Keys, moved []string, err error) {
	for _, k := range moved {
		log.Error("key of the wrong type set aside", "key", k, "moved_to", keys.Quarantine(k))
	}
	if err != nil {
		log.Warn("could not set aside keys of the wrong type", keyErr, err)
	}
}

// discardLog drops every record: for waits that log nothing.
var discardLog = slog.New(slog.DiscardHandler)

// rateLimit lets one log line through per minute.
type rateLimit struct {
	mu   sync.Mutex
	last time.Time
}

// Allow reports whether a line may be logged now.
func (r *rateLimit) Allow() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); r.last.IsZero() || now.Sub(r.last) >= time.Minute {
		r.last = now
		return true
	}
	return false
}

// placer is the part of a store that keeps repairs of placements which
// failed on every try (buckets.Store.PlaceAgain).
type placer interface {
	Unplaced() int
	PlaceAgain(ctx context.Context, conn redis.Conn) (int, error)
}

// storePlaceAgain is placeAgain for the worker: through its store.
func storePlaceAgain(ctx context.Context, st store, log *slog.Logger) {
	if st.Unplaced() == 0 {
		return
	}
	if _, err := st.PlaceAgain(ctx, nil); err != nil {
		log.Error("tasks in no list until their placement succeeds; trying again at the next step", keyErr, err, "kept", st.Unplaced())
	}
}

// placeAgain applies, on a pooled connection, the repairs st keeps: tasks
// whose push failed on a key of the wrong type and whose repair then lost
// its connection, so they are in no list until it succeeds. Components
// call it on their periodic step; what fails stays kept for the next.
func placeAgain(ctx context.Context, pool *redis.Pool, st placer, log *slog.Logger) {
	if st.Unplaced() == 0 {
		return
	}
	conn, err := pool.GetContext(ctx)
	if err != nil {
		return
	}
	defer conn.Close()
	// What it placed is logged by the store (buckets.Store.OnPlacedAgain,
	// set in Config.prepare), as when the store's own next transaction
	// places it.
	if _, err := st.PlaceAgain(ctx, conn); err != nil {
		log.Error("tasks in no list until their placement succeeds; trying again at the next step", keyErr, err, "kept", st.Unplaced())
	}
}
