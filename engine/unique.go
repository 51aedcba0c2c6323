package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/internal/safetext"
)

// ErrDuplicate: Enqueue of a task whose unique key (Unique, UniqueKey)
// another task holds; nothing was written. The error is a
// *ExistsError naming the holder.
var ErrDuplicate = fmt.Errorf("engine: duplicate of a unique task")

// MaxUniqueKeyLen is the longest key UniqueKey accepts, in bytes.
const maxUniqueKeyLen = 200

// Unique makes the task unique by its queue, type and payload (a SHA-256
// digest of the three): while a task enqueued with the same three and
// Unique is scheduled, ready, running or retrying, enqueueing another
// writes nothing and fails with an *ExistsError (ErrDuplicate) naming
// it. The key is released in the same transaction that makes its holder
// done, dead or cancelled, or when ttl passes (rounded up to whole
// seconds), whichever comes first; ttl 0 holds it until the task ends.
// docs/unique.md has the table of states.
func Unique(ttl time.Duration) Option {
	return optionFunc(func(o *taskOptions) error {
		secs, err := uniqueTTL(ttl)
		if err != nil {
			return err
		}
		o.unique, o.uniqueDigest, o.uniqueTTL = "", true, secs
		return nil
	})
}

// UniqueKey is Unique with the caller's key instead of the digest: 1 to
// 200 printable ASCII bytes. Keys are per namespace, not per queue.
func UniqueKey(key string, ttl time.Duration) Option {
	return optionFunc(func(o *taskOptions) error {
		if len(key) == 0 || len(key) > maxUniqueKeyLen {
			return fmt.Errorf("engine: UniqueKey(%s): want 1 to %d bytes: %w", safetext.Quote(key), maxUniqueKeyLen, ErrInvalid)
		}
		for i := 0; i < len(key); i++ {
			if c := key[i]; c < ' ' || c > '~' {
				return fmt.Errorf("engine: UniqueKey(%s): byte %d is %q; want printable ASCII: %w", safetext.Quote(key), i, c, ErrInvalid)
			}
		}
		secs, err := uniqueTTL(ttl)
		if err != nil {
			return err
		}
		o.unique, o.uniqueDigest, o.uniqueTTL = "k:"+key, false, secs
		return nil
	})
}

func uniqueTTL(ttl time.Duration) (int64, error) {
	if ttl < 0 {
		return 0, fmt.Errorf("engine: unique ttl %v: want 0 (until the task ends) or more: %w", ttl, ErrInvalid)
	}
	return int64((ttl + time.Second - 1) / time.Second), nil
}

// uniqueDigest is Unique's key for a task.
func uniqueDigest(queue, typ string, payload []byte) string {
	h := sha256.New()
	h.Write([]byte(queue))
	h.Write([]byte{0})
	h.Write([]byte(typ))
	h.Write([]byte{0})
	h.Write(payload)
	return "d:" + hex.EncodeToString(h.Sum(nil))[:32]
}

// ReplyTo makes the task's final transition (done, dead or cancelled)
// enqueue a reply task into queue q, in the same transaction: type
// ReplyType, the outcome as its payload (DecodeReply), an id of its own
// per outcome ("<id>~r<run>.<finished ms>"). Exactly one reply task per
// final outcome; a worker of q handles it like any task, with retries and
// crash recovery. This is the push way to learn an outcome; Client.Wait
// is the pull way.
func ReplyTo(q string) Option {
	return optionFunc(func(o *taskOptions) error {
		if !buckets.ValidName(q) {
			return fmt.Errorf("engine: ReplyTo(%s): want 1-64 of A-Z a-z 0-9 _ . -: %w", safetext.Quote(q), ErrInvalid)
		}
		o.replyTo = buckets.ReplyQueuePrefix + q
		return nil
	})
}

// ReplyType is the task type of the reply tasks ReplyTo enqueues.
const ReplyType = buckets.ReplyType
