package buckets

import (
	"errors"
	"math"
	"testing"
)

func TestProgressRoundTrip(t *testing.T) {
	t.Parallel()
	for _, p := range []Progress{{}, {Value: 42.5, Note: "page 4 of 10", At: 1795914934194}, {Value: -1, Note: "ü"}} {
		got, err := DecodeProgress(p.Encode())
		if err != nil || got != p {
			t.Errorf("round trip of %+v: %+v, %v", p, got, err)
		}
	}
	for _, b := range [][]byte{nil, {2}, {1}, {1, 0, 0}, Progress{Value: math.NaN()}.Encode(),
		Progress{Value: math.Inf(1)}.Encode(), Progress{Note: "\xff"}.Encode(), Progress{Note: string(make([]byte, MaxProgressNote+1))}.Encode()} {
		if _, err := DecodeProgress(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("DecodeProgress(%q) = %v, want ErrMalformed", b, err)
		}
	}
}

// FuzzDecodeProgress: DecodeProgress never panics, and what it accepts
// encodes back to the same bytes.
func FuzzDecodeProgress(f *testing.F) {
	f.Add(Progress{Value: 1, Note: "n", At: 5}.Encode())
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodeProgress(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not match ErrMalformed", err)
			}
			return
		}
		if enc := p.Encode(); string(enc) != string(b) {
			t.Fatalf("re-encoding %q gives %q", b, enc)
		}
	})
}
