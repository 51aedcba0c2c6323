package buckets

import (
	"bytes"
	"encoding/binary"
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
	t.Parallel()
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

// Encode allocates exactly the record's length, whatever the widths of its
// numbers and strings: a record is written per task.
func TestEncodeExactSize(t *testing.T) {
	t.Parallel()
	long := &Record{ID: "x", Queue: strings.Repeat("q", 200), Type: "t", Payload: bytes.Repeat([]byte{1}, 300),
		State: StateRunning, Attempts: 1 << 20, Runs: 127, MaxAttempts: 128, TimeoutMs: 1 << 35,
		Created: 1 << 45, Worker: "w", LastError: strings.Repeat("e", 16384)}
	sectioned := sample()
	sectioned.Periodic, sectioned.Unique, sectioned.UniqueTTL = "every", "u", 60
	sectioned.Metadata = map[string]string{"trace": "abc"}
	for name, r := range map[string]*Record{"sample": sample(), "zero": {ID: "z", State: StateWaiting},
		"wide": long, "sections": sectioned} {
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
	t.Parallel()
	r := sample()
	good := r.Encode()
	for name, b := range map[string][]byte{
		"empty": nil, "magic": append([]byte{'X'}, good[1:]...), "version": append([]byte{'B', 9}, good[2:]...),
		"state":     (&Record{ID: "id", Type: "t", State: 'z'}).Encode(),
		"truncated": good[:len(good)-len(r.Payload)-1], // in the type
		"json":      []byte(`{"id":1}`),
	} {
		if _, err := DecodeRecord("id", b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

// A record of any version but this release's is refused, whatever follows
// the version byte, with an error that names its version: such a record is
// buried as undecodable, never read as this format.
func TestDecodeOtherVersion(t *testing.T) {
	t.Parallel()
	good := sample().Encode()
	for _, v := range []byte{0, 1, 2, 3, 5, 255} {
		b := append([]byte{'B', v}, good[2:]...)
		_, err := DecodeRecord("id", b)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), fmt.Sprintf("record version %d unknown (this release reads version 4)", v)) {
			t.Errorf("version %d: %v; want ErrMalformed naming the version", v, err)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	ok := sample()
	if err := ok.Validate(1 << 10); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		mut  func(*Record)
		want error
	}{
		"queue":   {func(r *Record) { r.Queue = "" }, ErrInvalid},
		"type":    {func(r *Record) { r.Type = "" }, ErrInvalid},
		"ctrl":    {func(r *Record) { r.Type = "a\x00" }, ErrInvalid},
		"long":    {func(r *Record) { r.Type = string(bytes.Repeat([]byte("a"), MaxTypeLen+1)) }, ErrInvalid},
		"payload": {func(r *Record) { r.Payload = make([]byte, 1025) }, ErrTooLarge},
	} {
		r := sample()
		tc.mut(r)
		if err := r.Validate(1 << 10); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}

// withSections returns r's record, which has no trailing sections of its
// own, with the given sections (each a tag byte, a uvarint length and the
// bytes) in their place: built by hand, so that a test can store what
// Encode never writes (out of order, unknown, malformed).
func withSections(r *Record, sections ...[]byte) []byte {
	b := r.Encode()
	h, n := binary.Uvarint(b[2:])
	if n <= 0 || h>>3&fSections != 0 {
		panic("withSections: a record with sections of its own")
	}
	block := bytes.Join(sections, nil)
	out := binary.AppendUvarint([]byte{recordMagic, recordVersion}, h|fSections<<3)
	out = append(out, b[2+n:len(b)-len(r.Payload)]...)
	out = appendLen(out, block)
	return append(out, r.Payload...)
}

// TestRecordSections: the optional fields travel in trailing sections and
// decode back; a record without them has none. Sections out of tag order,
// empty, with a bad flag, truncated or of a required tag this release
// does not know (saying to upgrade) are malformed.
func TestRecordSections(t *testing.T) {
	t.Parallel()
	plain := &Record{ID: "x", Queue: "q", Type: "t", Payload: []byte("p"), State: StateWaiting, MaxAttempts: 1, TimeoutMs: 1}
	if h, _ := binary.Uvarint(plain.Encode()[2:]); h>>3&fSections != 0 {
		t.Fatalf("a record without optional fields has sections")
	}
	full := *plain
	full.Periodic, full.SkipIfRunning, full.HoldsSlot = "e", true, true
	full.Unique, full.UniqueTTL, full.ReplyTo = "k:key", 3600, "replies"
	got, err := DecodeRecord("x", full.Encode())
	if err != nil || !reflect.DeepEqual(got, &full) {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, &full)
	}
	if r, err := DecodeRecord("x", withSections(plain, []byte{sectionPeriodic, 1, 'e'}, []byte{sectionFlags, 1, flagSkipIfRunning})); err != nil || r.Periodic != "e" || !r.SkipIfRunning {
		t.Fatalf("hand-built sections: %+v, %v", r, err)
	}
	if r, err := DecodeRecord("x", withSections(plain, []byte{sectionFlags, 1, flagHoldsSlot})); err != nil || r.SkipIfRunning || !r.HoldsSlot {
		t.Fatalf("the slot flag alone: %+v, %v", r, err)
	}
	for name, secs := range map[string][][]byte{
		"out of order":     {{sectionFlags, 1, flagSkipIfRunning}, {sectionPeriodic, 1, 'e'}},
		"twice":            {{sectionUnique, 1, 'u'}, {sectionUnique, 1, 'v'}},
		"empty periodic":   {{sectionPeriodic, 0}},
		"bad flag":         {{sectionFlags, 1, 8}},
		"bad key":          {{sectionKey, 2, 'a', ':'}},
		"no flag":          {{sectionFlags, 1, 0}},
		"truncated":        {{sectionPeriodic, 5, 'e'}},
		"unknown required": {{'Z', 1, 'x'}},
	} {
		_, err := DecodeRecord("x", withSections(plain, secs...))
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
		if name == "unknown required" && (err == nil || !strings.Contains(err.Error(), "upgrade")) {
			t.Errorf("unknown required section: %v, want it to say to upgrade", err)
		}
	}
}

// TestIntern: intern returns the bytes' string whatever the table holds
// (names that share a slot, long names, empty ones), a copy the caller's
// later writes to b do not change, and, for a name seen just before, the
// same string without allocating.
func TestIntern(t *testing.T) {
	// Not parallel: testing.AllocsPerRun refuses to run in a parallel test.
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

// TestRecordPriority: a level above 1 travels in section 8 and decodes
// back; level 1 (0 or 1 in the record) stores no section, so a record of
// level 1 is the record of a queue that never used levels, byte for byte.
// A section 8 at 1, 0, above MaxLevel or of trailing bytes is malformed.
func TestRecordPriority(t *testing.T) {
	t.Parallel()
	plain := &Record{ID: "x", Queue: "q", Type: "t", Payload: []byte("p"), State: StateWaiting, MaxAttempts: 1, TimeoutMs: 1}
	one := *plain
	one.Priority = 1
	if !bytes.Equal(one.Encode(), plain.Encode()) {
		t.Fatalf("level 1 encodes as %q, a record without a level as %q", one.Encode(), plain.Encode())
	}
	for lvl := 2; lvl <= MaxLevel; lvl++ {
		r := *plain
		r.Priority = lvl
		b := r.Encode()
		if !bytes.Contains(b, []byte{sectionPriority, 1, byte(lvl)}) {
			t.Errorf("level %d: no section 8 in %q", lvl, b)
		}
		got, err := DecodeRecord("x", b)
		if err != nil || !reflect.DeepEqual(got, &r) {
			t.Errorf("level %d: decoded %+v, %v; want %+v", lvl, got, err, &r)
		}
		if got.Level() != lvl || got.Place() != Place("q", lvl) {
			t.Errorf("level %d: Level %d, place %q", lvl, got.Level(), got.Place())
		}
	}
	if r, err := DecodeRecord("x", withSections(plain, []byte{sectionPriority, 1, 3})); err != nil || r.Priority != 3 {
		t.Fatalf("hand-built section 8: %+v, %v", r, err)
	}
	for name, sec := range map[string][]byte{
		"level 0": {sectionPriority, 1, 0}, "level 1": {sectionPriority, 1, 1}, "level 5": {sectionPriority, 1, MaxLevel + 1},
		"trailing": {sectionPriority, 2, 2, 0}, "empty": {sectionPriority, 0},
	} {
		if _, err := DecodeRecord("x", withSections(plain, sec)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	bad := *plain
	bad.Priority = MaxLevel + 1
	if err := bad.Validate(1 << 10); !errors.Is(err, ErrInvalid) {
		t.Errorf("Validate of level %d: %v, want ErrInvalid", bad.Priority, err)
	}
}

// TestPlace: a level's place names its queue and level, and parses back;
// index members and bucket keys of a level carry its place.
func TestPlace(t *testing.T) {
	t.Parallel()
	for lvl := 0; lvl <= MaxLevel+1; lvl++ {
		p := Place("mail.x-1", lvl)
		q, got := SplitPlace(p)
		want := lvl
		if lvl < 2 || lvl > MaxLevel {
			want = 1
			if p != "mail.x-1" {
				t.Errorf("level %d: place %q, want the queue itself", lvl, p)
			}
		}
		if q != "mail.x-1" || got != want {
			t.Errorf("SplitPlace(%q) = %q, %d; want mail.x-1, %d", p, q, got, want)
		}
		mq, ts, err := ParseMember(Member(p, 42))
		if err != nil || mq != p || ts != 42 {
			t.Errorf("ParseMember(Member(%q, 42)) = %q, %d, %v", p, mq, ts, err)
		}
	}
	k, _ := NewKeys("ns")
	if got := k.Stats(Place("q", 3)); got != k.Stats("q") {
		t.Errorf("a level's counters are %s, want its queue's %s", got, k.Stats("q"))
	}
	if got := k.Notify(Place("q", 2)); got != k.Notify("q") {
		t.Errorf("a level's wake-up list is %s, want its queue's %s", got, k.Notify("q"))
	}
	for _, m := range []string{"q@1:5", "q@5:5", "@2:5", "q@@2:5"} {
		if _, _, err := ParseMember(m); err == nil {
			t.Errorf("ParseMember(%q): no error", m)
		}
	}
}
