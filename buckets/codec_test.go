package buckets

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func sample() *Record {
	return &Record{ID: "id", Queue: "mail", Type: "send.welcome", Payload: []byte(`{"to":"a@b"}`),
		State: StateRetry, Attempts: 2, Recoveries: 1, Runs: 4, MaxAttempts: 25, TimeoutMs: 30000,
		Created: 1700000000000, Due: 1700000005000, Started: 1700000001000, Finished: 0,
		Deadline: 1700000031000, Worker: "w", LastError: "boom"}
}

func TestRecordRoundTrip(t *testing.T) {
	r := sample()
	got, err := DecodeRecord("id", r.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, r)
	}
	// Compact: the fixed part stays small, which is most of a task's memory.
	if over := len(r.Encode()) - len(r.Payload) - len(r.Queue) - len(r.Type) - len(r.Worker) - len(r.LastError); over > 48 {
		t.Fatalf("record overhead %d bytes", over)
	}
}

// The default encoding allocates exactly the record's length, whatever
// the widths of its numbers and strings: a record is written per task.
func TestEncodeExactSize(t *testing.T) {
	long := &Record{ID: "x", Queue: strings.Repeat("q", 200), Type: "t", Payload: bytes.Repeat([]byte{1}, 300),
		State: StateRunning, Attempts: 1 << 20, Runs: 127, MaxAttempts: 128, TimeoutMs: 1 << 35,
		Created: 1 << 45, Worker: "w", LastError: strings.Repeat("e", 16384)}
	withSections := sample()
	withSections.Periodic, withSections.Unique, withSections.UniqueTTL = "every", "u", 60
	withSections.Metadata = map[string]string{"trace": "abc"}
	for name, r := range map[string]*Record{"sample": sample(), "zero": {ID: "z", State: StateWaiting},
		"wide": long, "sections": withSections} {
		b := r.Encode()
		if len(b) != cap(b) {
			t.Errorf("%s: %d bytes in a buffer of %d", name, len(b), cap(b))
		}
		if _, err := DecodeRecord(r.ID, b); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	good := sample().Encode()
	for name, b := range map[string][]byte{
		"empty": nil, "magic": append([]byte{'X'}, good[1:]...), "version": append([]byte{'B', 9}, good[2:]...),
		"state": append([]byte{'B', 3, 'z'}, good[3:]...), "truncated": good[:len(good)-1],
		"trailing": append(append([]byte{}, good...), 0), "json": []byte(`{"id":1}`),
	} {
		if _, err := DecodeRecord("id", b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

func TestValidate(t *testing.T) {
	ok := sample()
	if err := ok.Validate(1 << 10); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		mut  func(*Record)
		want error
	}{
		"queue":   {func(r *Record) { r.Queue = "" }, ErrInvalidName},
		"type":    {func(r *Record) { r.Type = "" }, ErrInvalidName},
		"ctrl":    {func(r *Record) { r.Type = "a\x00" }, ErrInvalidName},
		"long":    {func(r *Record) { r.Type = string(bytes.Repeat([]byte("a"), MaxTypeLen+1)) }, ErrInvalidName},
		"payload": {func(r *Record) { r.Payload = make([]byte, 1025) }, ErrTooLarge},
	} {
		r := sample()
		tc.mut(r)
		if err := r.Validate(1 << 10); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}

// TestRecordVersion2: earlier releases wrote a record with a periodic
// field as version 2 (version 1 plus the trailing section), one without as
// version 1; both decode, and a trailing section that is out of order, empty or
// unknown is malformed.
func TestRecordVersion2(t *testing.T) {
	plain := &Record{Queue: "q", Type: "t", Payload: []byte("x"), State: StateWaiting}
	v1 := encodeLegacy(plain)
	if v1[1] != 1 {
		t.Fatalf("a record without optional fields is version %d", v1[1])
	}
	withP := *plain
	withP.Periodic, withP.SkipIfRunning = "e", true
	v2 := encodeLegacy(&withP)
	if v2[1] != 2 || !bytes.Equal(v2[2:len(v1)], v1[2:]) {
		t.Fatalf("version 2 is not version 1 plus a trailer: %q vs %q", v2, v1)
	}
	r, err := DecodeRecord("id", v2)
	if err != nil || r.Periodic != "e" || !r.SkipIfRunning {
		t.Fatalf("decode v2: %+v %v", r, err)
	}
	bare := append([]byte{}, v1...)
	bare[1] = 2
	if r, err := DecodeRecord("id", bare); err != nil || r.Periodic != "" {
		t.Fatalf("version 2 without a trailer: %+v %v", r, err)
	}
	// Out of tag order, empty, a bad flag, truncated. (A section of an
	// unknown tag is kept, not refused: TestRecordUnknownSectionKept.)
	for _, trailer := range [][]byte{{2, 1, 1, 1, 1, 'e'}, {1, 0}, {2, 1, 7}, {1, 5, 'e'}} {
		b := append(append([]byte{}, bare...), trailer...)
		if _, err := DecodeRecord("id", b); !errors.Is(err, ErrMalformed) {
			t.Errorf("trailer %v: %v, want ErrMalformed", trailer, err)
		}
	}
}

// TestIntern: intern returns the bytes' string whatever the table holds
// (names that share a slot, long names, empty ones), a copy the caller's
// later writes to b do not change, and, for a name seen just before, the
// same string without allocating.
func TestIntern(t *testing.T) {
	var names []string
	for i := 0; i < 2000; i++ {
		names = append(names, fmt.Sprintf("queue-%d", i))
	}
	names = append(names, "", strings.Repeat("x", 65))
	for round := 0; round < 2; round++ {
		for _, n := range names {
			b := []byte(n)
			got := intern(b)
			if got != n {
				t.Fatalf("intern(%q) = %q", n, got)
			}
			if len(b) > 0 {
				b[0] = '!'
				if got != n {
					t.Fatalf("intern(%q) changed with its input: %q", n, got)
				}
			}
		}
	}
	b := []byte("default")
	intern(b)
	if n := testing.AllocsPerRun(100, func() { intern(b) }); n != 0 {
		t.Errorf("intern of a name just seen: %v allocations", n)
	}
}
