package engine

import (
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/google/uuid"
)

// idLen and base62 are the shape of a generated task id
// (buckets.NewID): 22 base62 digits of 128 bits, the Unix millisecond it
// was made in the top 48 and random bits below.
const (
	idLen  = buckets.IDLen
	base62 = buckets.Base62
)

// newID returns a new task id made now.
func newID() string { return newIDAt(time.Now()) }

// newIDAt returns a new task id made at now, whose time a record then
// need not store (buckets.IDTime): the task's Created is that millisecond.
func newIDAt(now time.Time) string { return buckets.NewID(ms(now)) }

// generatedID reports whether id has the shape of an id this package
// generates without a lane: newID's (22 base62 digits of at most 128
// bits) or a canonical UUID (what earlier releases generated).
func generatedID(id string) bool {
	switch len(id) {
	case idLen:
		// The largest 128-bit value in base 62 starts with '7'.
		if id[0] < '0' || id[0] > '7' {
			return false
		}
		for i := 0; i < len(id); i++ {
			if !isBase62(id[i]) {
				return false
			}
		}
		return true
	case 36:
		_, err := uuid.Parse(id)
		return err == nil
	}
	return false
}

func isBase62(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z'
}
