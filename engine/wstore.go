package engine

import (
	"context"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// workerStore is every transaction a Worker runs: *buckets.Store in
// production. Tests wrap it to make a step fail as a dead process or a
// cut connection would, without seams in the worker's own code.
type workerStore interface {
	Beat(ctx context.Context, conn redis.Conn, w string, ttl int64, info []byte, served ...buckets.Served) error
	Refresh(ctx context.Context, conn redis.Conn, w string, ttl int64, info []byte, served ...buckets.Served) error
	PausedQueues(ctx context.Context, conn redis.Conn) ([]string, error)
	QueueLimits(ctx context.Context, conn redis.Conn, qs []string) ([]buckets.Limits, error)
	PopKey(ctx context.Context, conn redis.Conn, p, w string, n int, now int64) (place string, ids []string, next int64, err error)
	Pop(ctx context.Context, conn redis.Conn, q, w string) (string, error)
	PopNext(q, w string) txn.Cmd
	PopsNext(q, w string, n int) []txn.Cmd
	PopMany(ctx context.Context, conn redis.Conn, q, w string, n int) ([]string, error)
	Levels(ctx context.Context, conn redis.Conn) (map[string][]string, error)
	Claim(ctx context.Context, conn redis.Conn, w, q, id string, now int64, deadline func(*buckets.Record) int64, hold bool, cs *buckets.ClaimState) (*buckets.Record, buckets.ClaimResult, error)
	ClaimBatch(ctx context.Context, conn redis.Conn, w, q string, ids []string, now int64, deadline func(*buckets.Record) int64, cs []buckets.ClaimState, hold bool) ([]*buckets.Record, []buckets.ClaimResult, error)
	FinishGroup(ctx context.Context, conn redis.Conn, w string, items []buckets.FinishItem, doneTTL int64) ([]buckets.FinishResult, error)
	FinishGroupHeld(ctx context.Context, held *txn.Held, w string, items []buckets.HeldItem, doneTTL int64, next []txn.Cmd) ([]buckets.FinishResult, []interface{}, error)
	FinishHeld(ctx context.Context, held *txn.Held, w string, r *buckets.Record, waited bool, now, doneTTL int64, decide func(*buckets.Record) buckets.Outcome, next []txn.Cmd) (*buckets.Record, buckets.Outcome, []interface{}, error)
	Finish(ctx context.Context, conn redis.Conn, w, id string, run int, now, doneTTL int64, decide func(*buckets.Record) buckets.Outcome) (*buckets.Record, buckets.Outcome, error)
	Abandon(ctx context.Context, conn redis.Conn, w string, r *buckets.Record, now int64) (buckets.AbandonResult, error)
	Requeue(ctx context.Context, conn redis.Conn, w string, ids []string, now int64, why buckets.Reason, maxRecoveries int) (buckets.RequeueResult, error)
	RecoverLost(ctx context.Context, conn redis.Conn, w string, now int64, limit int, held func() map[string]int) (buckets.RequeueResult, error)
	RecoverAllInflight(ctx context.Context, conn redis.Conn, w string, now int64) (buckets.RequeueResult, error)
	Forget(ctx context.Context, conn redis.Conn, w string, requireDead bool) (bool, error)
	SetAside(ctx context.Context, conn redis.Conn, want string, keys ...string) ([]string, error)
	placer
}

var _ workerStore = (*buckets.Store)(nil)
