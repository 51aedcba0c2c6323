package redisinfo

import (
	"strings"
	"testing"
)

const info24 = "redis_version:2.4.18\r\nprocess_id:4242\r\nuptime_in_seconds:7\r\nrole:master\r\n"

const info7 = "# Server\r\nredis_version:7.0.15\r\nprocess_id:17\r\nuptime_in_seconds:3600\r\n\r\n# Replication\r\nrole:slave\r\nmaster_host:127.0.0.1\r\n"

func TestField(t *testing.T) {
	for _, c := range []struct {
		info, name, want string
		ok               bool
	}{
		{info24, "redis_version", "2.4.18", true},
		{info24, "role", "master", true},
		{info7, "role", "slave", true},
		{info7, "master_host", "127.0.0.1", true},
		{info7, "master", "", false}, // a prefix of a name is not the name
		{info7, "Server", "", false},
		{"", "role", "", false},
	} {
		if got, ok := Field(c.info, c.name); got != c.want || ok != c.ok {
			t.Errorf("Field(%q, %q) = %q, %v; want %q, %v", c.info, c.name, got, ok, c.want, c.ok)
		}
	}
}

func TestInt(t *testing.T) {
	if n, ok := Int(info24, "process_id"); !ok || n != 4242 {
		t.Errorf("process_id: %d, %v", n, ok)
	}
	if n, ok := Int(info7, "uptime_in_seconds"); !ok || n != 3600 {
		t.Errorf("uptime_in_seconds: %d, %v", n, ok)
	}
	if _, ok := Int(info7, "role"); ok {
		t.Error("role read as an integer")
	}
	if _, ok := Int(info7, "loading"); ok {
		t.Error("a missing field read as an integer")
	}
}

// FuzzField: any reply, any name: no panic, and a value found is within
// one line.
func FuzzField(f *testing.F) {
	f.Add(info24, "role")
	f.Add(info7, "uptime_in_seconds")
	f.Add("a:b:c\n:\r\n", "a")
	f.Fuzz(func(t *testing.T, info, name string) {
		v, ok := Field(info, name)
		if !ok && v != "" {
			t.Fatalf("not found, yet %q", v)
		}
		if strings.Contains(v, "\n") {
			t.Fatalf("value %q holds a line end", v)
		}
		_, _ = Int(info, name)
	})
}
