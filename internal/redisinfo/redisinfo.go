// Package redisinfo reads fields of an INFO reply: lines of "name:value"
// under "# Section" headers (2.6 and later) or none (2.4), with CRLF ends.
package redisinfo

import (
	"strconv"
	"strings"
)

// Field returns the value of field name in info, INFO's reply, and whether
// info has it.
func Field(info, name string) (string, bool) {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v, true
		}
	}
	return "", false
}

// Int returns field name of info as an integer, and whether info has it
// and it is one.
func Int(info, name string) (int64, bool) {
	v, ok := Field(info, name)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

// Fields returns every field of info by name.
func Fields(info string) map[string]string {
	m := map[string]string{}
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m
}
