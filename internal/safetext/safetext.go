// Package safetext makes text that came from outside (task ids, types,
// queue names, payloads, a handler's stderr, a Redis address) safe to put
// in an error message or on an operator's terminal: no control or
// bidirectional-override character reaches it as is, no secret in a URL,
// and no unbounded echo of what a caller sent.
package safetext

import (
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxEcho is how many bytes of a caller's input Quote repeats.
const MaxEcho = 64

// Quote is s as Go quotes it (%q: control and invisible characters
// escaped), cut to its first MaxEcho bytes followed by "… (N bytes)" when
// it is longer: for echoing ids, types and names in errors.
func Quote(s string) string {
	if len(s) <= MaxEcho {
		return strconv.Quote(s)
	}
	cut := MaxEcho
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:cut]), len(s))
}

// Redact is addr with the password of any user information replaced by
// "xxxxx" (url.URL.Redacted), whether or not it has a scheme:
// "redis://:pw@host" gives "redis://:xxxxx@host". Text that is no URL but
// holds an '@' loses what comes before the last one.
func Redact(addr string) string {
	at := strings.LastIndexByte(addr, '@')
	if at < 0 {
		return addr
	}
	if u, err := url.Parse(addr); err == nil && u.User != nil {
		return u.Redacted()
	}
	if !strings.Contains(addr, "://") {
		if u, err := url.Parse("x://" + addr); err == nil && u.User != nil {
			return strings.TrimPrefix(u.Redacted(), "x://")
		}
	}
	return "xxxxx" + addr[at:]
}

// Line is s for one line of a terminal: every control character (C0,
// DEL, C1, including newlines and tabs), every bidirectional control
// (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069), the line and
// paragraph separators, and every byte that is not UTF-8 are written as
// Go escapes (\x1b, \n, \u202e); the rest is kept.
func Line(s string) string { return escape(s, false) }

// Block is Line for text shown as several lines (a handler's stderr): it
// keeps newlines and tabs, and escapes the rest as Line does.
func Block(s string) string { return escape(s, true) }

func escape(s string, block bool) string {
	clean := true
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if unsafeRune(r, n, block) {
			clean = false
			break
		}
		i += n
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case !unsafeRune(r, n, block):
			b.WriteString(s[i : i+n])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += n
	}
	return b.String()
}

func unsafeRune(r rune, n int, block bool) bool {
	switch {
	case r == utf8.RuneError && n <= 1:
		return true
	case block && (r == '\n' || r == '\t'):
		return false
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069,
		r == 0x2028, r == 0x2029:
		return true
	}
	return false
}

// Writer is w with Block applied to everything written to it: for the
// tables and JSON a command prints task data in (JSON stays valid: the
// encoder writes no raw C0 character, and the rest become \u escapes).
// A character cut across two writes is escaped byte by byte.
func Writer(w io.Writer) io.Writer {
	if _, ok := w.(*writer); ok {
		return w
	}
	return &writer{w: w}
}

type writer struct{ w io.Writer }

func (e *writer) Write(p []byte) (int, error) {
	s := string(p)
	if t := Block(s); t != s {
		if _, err := io.WriteString(e.w, t); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return e.w.Write(p)
}
