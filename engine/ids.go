package engine

import (
	"strings"
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

// reservedID says why id has the form of an id the engine gives its own
// tasks, which TaskID refuses ("" when it has not): a caller holding such
// an id would have its task run in place of the engine's (a periodic
// firing finding its id taken leaves it alone). A workflow step's form
// ("<workflow>~<i>") is also a lane's ("~k"), so the store refuses it
// only while that workflow exists (buckets.ErrReserved).
func reservedID(id string) string {
	switch {
	case strings.HasPrefix(id, "p:") && strings.Contains(id, "@"):
		return "ids starting with \"p:\" and holding an '@' are periodic firings' (p:<entry>@<time>)"
	case strings.HasSuffix(id, laneSep+"cb"):
		return "ids ending in \"~cb\" are group callbacks' (<group>~cb)"
	case replyParent(id) != id:
		return "ids ending in \"~r<run>.<finished>\" are reply tasks' (ReplyTo)"
	}
	return ""
}
