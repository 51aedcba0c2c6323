package cluster

import (
	"testing"

	"github.com/gomodule/redigo/redis"
)

func TestClusterSlot(t *testing.T) {
	// Values from the Redis Cluster specification and redis-cli CLUSTER KEYSLOT.
	cases := map[string]int{
		"123456789":            12739, // CRC16/XMODEM check value 0x31C3
		"foo":                  12182,
		"bar":                  5061,
		"{user1000}.following": Slot("user1000"),
		"{user1000}.followers": Slot("user1000"),
		"foo{}{bar}":           int(crc16("foo{}{bar}") % Slots), // empty tag: whole key
		"foo{{bar}}zap":        Slot("{bar"),                     // tag is "{bar"
		"foo{bar}{zap}":        Slot("bar"),                      // first tag only
		"{bq:default}:pending": Slot("bq:default"),
	}
	for key, want := range cases {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
}

func TestClusterParseRedirect(t *testing.T) {
	cases := []struct {
		reply string
		want  Redirect
		ok    bool
	}{
		{"MOVED 3999 127.0.0.1:6381", Redirect{Kind: KindMoved, Slot: 3999, Addr: "127.0.0.1:6381"}, true},
		{"ASK 3999 127.0.0.1:6381", Redirect{Kind: KindAsk, Slot: 3999, Addr: "127.0.0.1:6381"}, true},
		{"MOVED 12 :7000", Redirect{Kind: KindMoved, Slot: 12, Addr: "10.0.0.5:7000"}, true},
		{"TRYAGAIN Multiple keys request during rehashing of slot", Redirect{Kind: KindTryAgain}, true},
		{"CLUSTERDOWN The cluster is down", Redirect{Kind: KindClusterDown}, true},
		{"ERR unknown command", Redirect{}, false},
		{"MOVED notanumber 127.0.0.1:1", Redirect{}, false},
		{"MOVED 99999 127.0.0.1:1", Redirect{}, false},
	}
	for _, c := range cases {
		got, ok := ParseRedirect(redis.Error(c.reply), "10.0.0.5:6379")
		if ok != c.ok {
			t.Errorf("%q: ok = %v, want %v", c.reply, ok, c.ok)
			continue
		}
		if ok && *got != c.want {
			t.Errorf("%q: %+v, want %+v", c.reply, *got, c.want)
		}
	}
}

func TestClusterParseSlots(t *testing.T) {
	reply := []interface{}{
		[]interface{}{int64(5461), int64(10922),
			[]interface{}{[]byte("127.0.0.1"), int64(7001), []byte("id1")},
			[]interface{}{[]byte(""), int64(7004), []byte("id4")}},
		[]interface{}{int64(0), int64(5460),
			[]interface{}{[]byte("127.0.0.1"), int64(7000), []byte("id0")}},
	}
	got, err := parseSlots(reply, "127.0.0.9:7000")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Master != "127.0.0.1:7001" || got[0].Start != 5461 || got[0].End != 10922 ||
		len(got[0].Replicas) != 1 || got[0].Replicas[0] != "127.0.0.9:7004" || got[1].Master != "127.0.0.1:7000" {
		t.Errorf("parseSlots = %+v", got)
	}
	if _, err := parseSlots([]interface{}{[]interface{}{int64(10), int64(5)}}, "x:1"); err == nil {
		t.Error("parseSlots accepted a malformed range")
	}
}
