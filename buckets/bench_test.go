package buckets

import (
	"context"
	"fmt"
	"testing"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

// The claim, finish and move paths one transaction at a time, against a
// real server (cd buckets && go test -run XXX -bench . -benchmem). Each
// op is one task: a batch's figures are per task of the batch.

func benchStore(b *testing.B) (*Store, redis.Conn, context.Context) {
	b.Helper()
	s, pool := benchStoreRes(b, 1000)
	c := pool.Get()
	b.Cleanup(func() { c.Close() })
	return s, c, context.Background()
}

// benchStoreRes is a store of the given bucket resolution (ms) in a
// namespace of its own, and a pool of its server.
func benchStoreRes(b *testing.B, res int64) (*Store, *redis.Pool) {
	b.Helper()
	srv := redistest.Start(b)
	ns := redistest.Namespace(b)
	b.Cleanup(func() { srv.Cleanup(b, ns) })
	s, err := NewStore(ns, res)
	if err != nil {
		b.Fatal(err)
	}
	return s, srv.Pool(b)
}

// benchPopped enqueues and pops n tasks (not timed).
func benchPopped(b *testing.B, s *Store, c redis.Conn, n int) []string {
	b.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("t%07d", i)
	}
	for i := 0; i < n; i += 1000 {
		if err := enqueued(ids[i:min(i+1000, n)]...)(context.Background(), s, c); err != nil {
			b.Fatal(err)
		}
	}
	got, err := s.PopMany(context.Background(), c, "q", w1, n)
	if err != nil || len(got) != n {
		b.Fatalf("popped %d of %d: %v", len(got), n, err)
	}
	return got
}

func BenchmarkClaim(b *testing.B) {
	s, c, ctx := benchStore(b)
	ids := benchPopped(b, s, c, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for _, id := range ids {
		if _, res, err := s.Claim(ctx, c, w1, "q", id, t0+10, lease, false, nil); err != nil || res != Claimed {
			b.Fatal(res, err)
		}
	}
}

func benchClaimBatch(b *testing.B, k int) {
	s, c, ctx := benchStore(b)
	ids := benchPopped(b, s, c, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < len(ids); i += k {
		batch := ids[i:min(i+k, len(ids))]
		if _, _, err := s.ClaimBatch(ctx, c, w1, "q", batch, t0+10, lease, make([]ClaimState, len(batch)), false); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkClaimBatch8(b *testing.B)  { benchClaimBatch(b, 8) }
func BenchmarkClaimBatch32(b *testing.B) { benchClaimBatch(b, 32) }

// benchClaimed claims n popped tasks (not timed).
func benchClaimed(b *testing.B, s *Store, c redis.Conn, n int) []string {
	ids := benchPopped(b, s, c, n)
	for i := 0; i < n; i += 32 {
		batch := ids[i:min(i+32, n)]
		if _, _, err := s.ClaimBatch(context.Background(), c, w1, "q", batch, t0+10, lease, make([]ClaimState, len(batch)), false); err != nil {
			b.Fatal(err)
		}
	}
	return ids
}

func BenchmarkFinish(b *testing.B) {
	s, c, ctx := benchStore(b)
	ids := benchClaimed(b, s, c, b.N)
	done := func(*Record) Outcome { return Done }
	b.ReportAllocs()
	b.ResetTimer()
	for _, id := range ids {
		if _, _, err := s.Finish(ctx, c, w1, id, 1, t0+20, 60, done); err != nil {
			b.Fatal(err)
		}
	}
}

func benchFinishGroup(b *testing.B, k int) {
	s, c, ctx := benchStore(b)
	ids := benchClaimed(b, s, c, b.N)
	done := func(*Record) Outcome { return Done }
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < len(ids); i += k {
		var items []FinishItem
		for _, id := range ids[i:min(i+k, len(ids))] {
			items = append(items, FinishItem{ID: id, Run: 1, Now: t0 + 20, Decide: done})
		}
		if _, err := s.FinishGroup(ctx, c, w1, items, 60); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFinishGroup8(b *testing.B)  { benchFinishGroup(b, 8) }
func BenchmarkFinishGroup32(b *testing.B) { benchFinishGroup(b, 32) }

// BenchmarkMove: tasks moved from one due bucket to the ready list, 1,000
// per bucket.
func BenchmarkMove(b *testing.B) {
	s, c, ctx := benchStore(b)
	var members []string
	for i := 0; i < b.N; i += 1000 {
		var recs []*Record
		due := t0 - 1_000_000 + int64(i/1000)*1000
		for j := i; j < min(i+1000, b.N); j++ {
			recs = append(recs, newRec(fmt.Sprintf("m%07d", j), due))
		}
		if err := s.Enqueue(ctx, c, t0-2_000_000, recs); err != nil {
			b.Fatal(err)
		}
		members = append(members, Member("q", BucketTime(due, s.Resolution)))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for _, m := range members {
		if _, err := s.Move(ctx, c, []string{m}, 1000); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMoveSpread: tasks moved by MoveDue from one-task buckets (a
// spread backlog), on two connections as the dispatcher does; the
// per-bucket cost of a move. The ids are not of the generated shape, so
// each bucket is a list.
func BenchmarkMoveSpread(b *testing.B) { benchMoveSpread(b, false) }

// BenchmarkMoveSpreadInline is BenchmarkMoveSpread with every task an
// inline entry (ids of the generated shape, see Store.inline): a ZSCORE each
// instead of a bucket's WATCH, LRANGE, DEL and retry count.
func BenchmarkMoveSpreadInline(b *testing.B) { benchMoveSpread(b, true) }

func benchMoveSpread(b *testing.B, inline bool) {
	s, pool := benchStoreRes(b, 10)
	c, c2 := pool.Get(), pool.Get()
	b.Cleanup(func() { c.Close(); c2.Close() })
	ctx := context.Background()
	for i := 0; i < b.N; i += 1000 {
		var recs []*Record
		for j := i; j < min(i+1000, b.N); j++ {
			id := fmt.Sprintf("s%07d", j)
			if inline {
				id = fixedID(uint32(j))
			}
			recs = append(recs, newRec(id, t0-int64(b.N-j)*s.Resolution))
		}
		if err := s.Enqueue(ctx, c, t0-int64(b.N+1)*s.Resolution, recs); err != nil {
			b.Fatal(err)
		}
	}
	conns := []redis.Conn{c, c2}
	b.ReportAllocs()
	b.ResetTimer()
	moved := 0
	for moved < b.N {
		res, err := s.MoveDue(ctx, conns, MoveOpts{Now: t0, Chunk: 128, MaxTasks: 4096, Lookahead: 1024})
		if err != nil {
			b.Fatal(err)
		}
		if res.Tasks == 0 {
			b.Fatalf("moved %d of %d, then nothing", moved, b.N)
		}
		moved += res.Tasks
	}
}
