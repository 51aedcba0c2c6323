package buckets

import (
	"testing"

	"github.com/gomodule/redigo/redis"
)

// TestSettleReadError: an error reply to a settle's reads stops it, but a
// record's WRONGTYPE, which Claim buries with the reason.
func TestSettleReadError(t *testing.T) {
	t.Parallel()
	loading := redis.Error("LOADING Redis is loading the dataset in memory")
	wrong := redis.Error("WRONGTYPE Operation against a key holding the wrong kind of value")
	for _, c := range []struct {
		name string
		reps []interface{}
		fail bool
	}{
		{"all read", []interface{}{"list", int64(0), []byte("r")}, false},
		{"missing record", []interface{}{"none", int64(0), nil}, false},
		{"TYPE refused", []interface{}{loading, int64(0), []byte("r")}, true},
		{"EXISTS refused", []interface{}{"list", loading, []byte("r")}, true},
		{"GET refused", []interface{}{"list", int64(0), loading}, true},
		{"record of the wrong type", []interface{}{"list", int64(0), wrong}, false},
		{"TYPE of the wrong type", []interface{}{wrong, int64(0), nil}, true},
	} {
		if err := settleReadError(c.reps, 2); (err != nil) != c.fail {
			t.Errorf("%s: %v, want an error: %v", c.name, err, c.fail)
		}
	}
}
