package buckets_test

import (
	"fmt"
	"time"

	"github.com/bucketq/bucketq/buckets"
)

// A generated id carries the millisecond it was made in; IDTime reads it
// back, with or without a lane suffix. An id of another shape carries
// none.
func ExampleIDTime() {
	made := time.Date(2026, 11, 24, 6, 0, 0, 123e6, time.UTC)
	id := buckets.NewID(made.UnixMilli())
	for _, s := range []string{id, id + "~3", "order-7"} {
		ms, ok := buckets.IDTime(s)
		fmt.Println(ok, time.UnixMilli(ms).UTC().Format(time.RFC3339Nano))
	}
	// Output:
	// true 2026-11-24T06:00:00.123Z
	// true 2026-11-24T06:00:00.123Z
	// false 1970-01-01T00:00:00Z
}
