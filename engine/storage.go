package engine

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/gomodule/redigo/redis"
)

// CompactStorage is the storage version StorageFormat reports for a
// namespace marked for compact storage (record version 4 and inline
// entries; Config.CompactRecords).
const CompactStorage = 4

// StorageFormat reads the namespace's format mark (the key {ns}:format):
// CompactStorage when the clients and workers that follow it (a Config
// with neither CompactRecords nor LegacyRecords) write compact storage, 0
// when they write the storage every release reads. A mark that is not a
// version is an error that says what it holds.
func (c *Client) StorageFormat(ctx context.Context) (int, error) {
	conn, err := c.conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	m, err := c.store.ReadFormat(ctx, conn)
	if err != nil {
		return 0, failed("read the storage format", err)
	}
	if m.Bad() {
		return 0, failed("read the storage format", fmt.Errorf("the format mark holds %q, not a storage version (SetStorageFormat sets it right)", m.Raw))
	}
	return m.Version, nil
}

// SetStorageFormat sets the namespace's format mark: compact lets every
// client and worker that follows it write compact storage, from its next
// look (within its Config.FormatRecheck, a minute by default); do it once
// every process on the namespace runs this release or a later one
// (docs/operations.md). !compact removes the mark: processes started from
// then on write the storage every release reads, while a running one that
// already writes compact storage goes on until it restarts (or set
// LegacyRecords on it). Everything written either way stays readable.
func (c *Client) SetStorageFormat(ctx context.Context, compact bool) error {
	conn, err := c.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := c.store.MarkFormat(ctx, conn, compact); err != nil {
		return failed("set the storage format", err)
	}
	return nil
}

// resolveFormat lets a client's or worker's store learn the namespace's
// format mark (buckets.Store.ResolveFormat) on conn: no round trip once it
// writes compact storage, at most one look per Config.FormatRecheck
// otherwise. A failure only keeps the storage every release reads; it is
// logged. It returns the connection for the caller's own command: conn,
// or, when the look's failure left conn unusable (its own bound,
// buckets.FormatLookTimeout, cut a read short) while ctx still runs, a
// fresh one from pool, conn being closed; the caller's command must not
// fail for the look's sake.
// The error is the pool's, when it has no connection to give.
func resolveFormat(ctx context.Context, st interface {
	ResolveFormat(context.Context, redis.Conn) (bool, error)
}, pool *redis.Pool, conn redis.Conn, log *slog.Logger) (redis.Conn, error) {
	if _, err := st.ResolveFormat(ctx, conn); err != nil {
		log.Warn("could not read the namespace's format mark; writing the storage every release reads", keyErr, err)
		// Once ctx has ended the caller's command fails on its own, and a
		// fresh connection it never used would only go back to the pool.
		dl, ok := ctx.Deadline()
		if conn.Err() != nil && ctx.Err() == nil && (!ok || time.Now().Before(dl)) {
			conn.Close()
			return pool.GetContext(ctx)
		}
	}
	return conn, nil
}
