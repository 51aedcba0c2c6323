package redistest

import (
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redisinfo"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/gomodule/redigo/redis"
)

// ReplicateFrom makes s a replica of master (SLAVEOF, as on Redis 2.4) and
// waits until its link is up and the initial sync is done. On these test
// servers the replica authenticates as master's admin user (the default
// user may run only the 2.4 table, which a modern replica's handshake
// exceeds); that is a detail of the test servers, not of the procedure.
// Real servers only.
func (s *Server) ReplicateFrom(t testing.TB, master *Server, timeout time.Duration) {
	t.Helper()
	s.requireReal(t, "ReplicateFrom")
	c := s.Admin(t)
	defer c.Close()
	for _, kv := range [][2]string{{"masteruser", "admin"}, {"masterauth", master.adminPassword}} {
		if _, err := c.Do("CONFIG", "SET", kv[0], kv[1]); err != nil {
			t.Fatalf("redistest: CONFIG SET %s: %v", kv[0], err)
		}
	}
	host, port, _ := strings.Cut(master.Addr, ":")
	if _, err := c.Do("SLAVEOF", host, port); err != nil {
		t.Fatalf("redistest: SLAVEOF %s: %v", master.Addr, err)
	}
	var info string
	testwait.UntilShowing(t, timeout, "the replica of "+master.Addr+" to be in sync", func() bool {
		var err error
		info, err = redis.String(c.Do("INFO", "replication"))
		if err != nil {
			t.Fatalf("redistest: INFO: %v", err)
		}
		f := redisinfo.Fields(info)
		return f["master_link_status"] == "up" && f["master_sync_in_progress"] == "0"
	}, func() string { return info })
}

// Promote makes s a master again (SLAVEOF NO ONE). Real servers only.
func (s *Server) Promote(t testing.TB) {
	t.Helper()
	s.requireReal(t, "Promote")
	c := s.Admin(t)
	defer c.Close()
	if _, err := c.Do("SLAVEOF", "NO", "ONE"); err != nil {
		t.Fatalf("redistest: SLAVEOF NO ONE: %v", err)
	}
}
