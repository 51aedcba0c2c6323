package safetext

import (
	"strings"
	"testing"
)

func TestQuote(t *testing.T) {
	t.Parallel()
	if got := Quote("order-42"); got != `"order-42"` {
		t.Errorf("Quote(order-42) = %s", got)
	}
	long := strings.Repeat("a", 100000)
	if got, want := Quote(long), `"`+strings.Repeat("a", MaxEcho)+`"… (100000 bytes)`; got != want {
		t.Errorf("Quote of 100000 bytes = %s, want %s", got, want)
	}
	// The cut never splits a character.
	if got := Quote(strings.Repeat("é", 40)); !strings.HasPrefix(got, `"`+strings.Repeat("é", 32)+`"…`) {
		t.Errorf("Quote of 80 bytes of é = %s", got)
	}
	if got := Quote("a\x1b[2Jb\u202e"); got != `"a\x1b[2Jb\u202e"` {
		t.Errorf("Quote with escapes = %s", got)
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"redis://:S3cr3t@host:6379":     "redis://:xxxxx@host:6379",
		"redis://user:S3cr3t@host:6379": "redis://user:xxxxx@host:6379",
		"user:S3cr3t@host:6379":         "user:xxxxx@host:6379",
		":S3cr3t@host":                  ":xxxxx@host",
		"127.0.0.1:6379":                "127.0.0.1:6379",
		"rediss://h:1":                  "rediss://h:1",
		"a b%zz:S3cr3t@host":            "xxxxx@host",
	} {
		got := Redact(in)
		if got != want || strings.Contains(got, "S3cr3t") {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestEscape(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][2]string{
		"plain text, é ü 日本": {"plain text, é ü 日本", "plain text, é ü 日本"},
		"a\x1b]0;pwned\x07b": {`a\x1b]0;pwned\x07b`, `a\x1b]0;pwned\x07b`},
		"two\nlines\tx\r":    {`two\nlines\tx\r`, "two\nlines\tx\\r"},
		"c1\u009bx\x7f":      {`c1\u009bx\x7f`, `c1\u009bx\x7f`},
		"bidi\u202egnp.exe":  {`bidi\u202egnp.exe`, `bidi\u202egnp.exe`},
		"iso\u2066x\u2069":   {`iso\u2066x\u2069`, `iso\u2066x\u2069`},
		"bad\xffbyte":        {`bad\xffbyte`, `bad\xffbyte`},
	} {
		if got := Line(in); got != want[0] {
			t.Errorf("Line(%q) = %q, want %q", in, got, want[0])
		}
		if got := Block(in); got != want[1] {
			t.Errorf("Block(%q) = %q, want %q", in, got, want[1])
		}
	}
}
