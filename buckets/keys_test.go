package buckets

import (
	"errors"
	"testing"
)

func TestBucketTimeRoundsUp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ due, res, want int64 }{
		{1000, 10, 1000}, {1001, 10, 1010}, {1009, 10, 1010}, {1010, 10, 1010},
		{5, 1, 5}, {1, 1000, 1000}, {59999, 60000, 60000}, {60001, 60000, 120000}, {0, 10, 0},
	} {
		if got := BucketTime(tc.due, tc.res); got != tc.want || got < tc.due {
			t.Errorf("BucketTime(%d, %d) = %d, want %d", tc.due, tc.res, got, tc.want)
		}
	}
}

func TestKeys(t *testing.T) {
	t.Parallel()
	k, err := NewKeys("app")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ got, want string }{
		{k.Task("id"), "{app}:t:id"}, {k.Bucket("mail", 1500), "{app}:b:mail:1500"},
		{k.Schedule(), "{app}:sched"}, {k.Ready("mail"), "{app}:q:mail"}, {k.Notify("mail"), "{app}:n:mail"},
		{k.Wake(), "{app}:wake"}, {k.Queues(), "{app}:queues"}, {k.Stats("mail"), "{app}:st:mail"},
		{k.Workers(), "{app}:w"}, {k.Heartbeat("w1"), "{app}:hb:w1"}, {k.Inflight("w1"), "{app}:f:w1"},
		{k.Pending("w1"), "{app}:p:w1"}, {k.Dead(), "{app}:dead"}, {k.Quarantine("{app}:q:mail"), "{app}:bad:q:mail"},
	} {
		if tc.got != tc.want {
			t.Errorf("key %q, want %q", tc.got, tc.want)
		}
	}
	for _, bad := range []string{"", "a b", "{x}", "a:b", string(make([]byte, 65))} {
		if _, err := NewKeys(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewKeys(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestParseMember(t *testing.T) {
	t.Parallel()
	q, ts, err := ParseMember(Member("mail.v2", 1700000000123))
	if err != nil || q != "mail.v2" || ts != 1700000000123 {
		t.Fatalf("round trip: %q %d %v", q, ts, err)
	}
	for _, bad := range []string{"", ":1", "q:", "q:x", "q:-1", "a b:1", "q"} {
		if _, _, err := ParseMember(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseMember(%q) = %v, want ErrMalformed", bad, err)
		}
	}
}

func FuzzParseMember(f *testing.F) {
	f.Add("default:1700000000000")
	f.Add("q:0")
	f.Add("a:b:c")
	f.Fuzz(func(t *testing.T, m string) {
		q, ts, err := ParseMember(m)
		if err != nil {
			return
		}
		if q2, ts2, err := ParseMember(Member(q, ts)); err != nil || q2 != q || ts2 != ts {
			t.Fatalf("%q: round trip gave %q %d %v", m, q2, ts2, err)
		}
	})
}

// TestBucketOf: the bucket key a move builds from an index member is the
// one Bucket gives for the member's queue and time, however the member
// spells the time.
func TestBucketOf(t *testing.T) {
	t.Parallel()
	k, err := NewKeys("ns")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"q:1795000000000", "q:0", "q:007", "q:+5", "q:-0", "a:b:12", "q:00"} {
		q, ts, err := ParseMember(m)
		if err != nil {
			continue
		}
		if got, want := k.bucketOf(m, q, ts), k.Bucket(q, ts); got != want {
			t.Errorf("member %q: bucket %q, want %q", m, got, want)
		}
	}
}
