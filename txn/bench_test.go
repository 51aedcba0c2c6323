package txn_test

import (
	"context"
	"testing"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/txn"
)

// BenchmarkRun is one small transaction (WATCH, GET, MULTI, SET, LPUSH,
// EXEC) on Redis 7 and on a real Redis 2.4, where every transaction reads
// the replies to its queued commands before EXEC: the cost of the one
// more round trip that keeps 2.4's transactions all or nothing.
// REDIS24_SERVER names the 2.4 binary; without it that half is skipped.
func BenchmarkRun(b *testing.B) {
	for name, start := range map[string]func(testing.TB, ...redistest.Option) *redistest.Server{
		"redis7": redistest.Start, "redis24": redistest.Start24,
	} {
		b.Run(name, func(b *testing.B) {
			s := start(b, redistest.Private())
			pool := s.Pool(b)
			conn := pool.Get()
			defer conn.Close()
			ns := redistest.Namespace(b)
			key, list := ns+":k", ns+":l"
			var r txn.Runner
			ctx := context.Background()
			fn := func(tx *txn.Tx) error {
				if _, err := tx.Do("GET", key); err != nil {
					return err
				}
				tx.Queue("SET", key, "v")
				tx.Queue("LPUSH", list, "x")
				tx.Queue("LTRIM", list, 0, 15)
				return nil
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := r.Run(ctx, conn, []string{key}, fn); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
