package buckets

import (
	"errors"
	"strings"
	"testing"
)

// Earlier releases stored a record without the optional fields as version
// 1; with them, as version 2, which decodes back; a field
// this decoder does not know is refused as malformed, saying to upgrade,
// when it is a required one (a tag below 'a').
func TestRecordVersion2UniqueReply(t *testing.T) {
	plain := &Record{ID: "x", Queue: "q", Type: "t", Payload: []byte("p"), State: StateWaiting, MaxAttempts: 1, TimeoutMs: 1}
	if b := encodeLegacy(plain); b[1] != 1 {
		t.Fatalf("a record without optional fields is version %d, want 1", b[1])
	}
	full := *plain
	full.Unique, full.UniqueTTL, full.ReplyTo = "k:key", 3600, "replies"
	b := encodeLegacy(&full)
	if b[1] != 2 {
		t.Fatalf("version %d, want 2", b[1])
	}
	got, err := DecodeRecord("x", b)
	if err != nil || got.Unique != "k:key" || got.UniqueTTL != 3600 || got.ReplyTo != "replies" {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	// The version 1 part is the same bytes: only the section is added.
	if v1 := encodeLegacy(plain); string(b[2:len(v1)]) != string(v1[2:]) {
		t.Fatalf("version 2 does not extend version 1")
	}
	unknown := append(append([]byte{}, b...), 'Z', 1, 'x')
	if _, err := DecodeRecord("x", unknown); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "upgrade") {
		t.Fatalf("unknown field: %v, want ErrMalformed saying to upgrade", err)
	}
	disordered := append(append([]byte{}, encodeLegacy(plain)...), sectionReplyTo, 1, 'r', sectionUnique, 1, 'u')
	disordered[1] = 2
	if _, err := DecodeRecord("x", disordered); !errors.Is(err, ErrMalformed) {
		t.Fatalf("fields out of order: %v", err)
	}
	if _, err := DecodeRecord("x", append(b, sectionReplyTo+1)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("truncated field: %v", err)
	}
}
