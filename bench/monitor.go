package main

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Monitor records the commands a Redis server executes, through MONITOR on
// a raw connection. It tells commands sent by clients from those run inside
// Lua scripts (MONITOR marks these "[<db> lua]"), which INFO commandstats
// counts alike. It is meant for quiet periods: MONITOR slows a busy server.
type Monitor struct {
	conn net.Conn
	done chan struct{}
	mu   sync.Mutex
	seen []monitored
	err  error
}

// monitored is one command seen by MONITOR.
type monitored struct {
	at  float64 // server time, unix seconds
	lua bool
	cmd string
}

// maxMonitored bounds what a Monitor keeps.
const maxMonitored = 5_000_000

// StartMonitor opens a connection to addr and issues MONITOR.
func StartMonitor(addr string) (*Monitor, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		conn.Close()
		return nil, err
	}
	br := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	first, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "+OK") {
		conn.Close()
		return nil, fmt.Errorf("MONITOR: %q %v", first, err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	m := &Monitor{conn: conn, done: make(chan struct{})}
	go m.read(br)
	return m, nil
}

func (m *Monitor) read(br *bufio.Reader) {
	defer close(m.done)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		e, ok := parseMonitorLine(line)
		if !ok {
			continue
		}
		m.mu.Lock()
		if len(m.seen) < maxMonitored {
			m.seen = append(m.seen, e)
		} else if m.err == nil {
			m.err = fmt.Errorf("MONITOR: more than %d commands", maxMonitored)
		}
		m.mu.Unlock()
	}
}

// parseMonitorLine parses `+1700000000.123456 [0 127.0.0.1:5555] "get" "k"`.
func parseMonitorLine(line string) (monitored, bool) {
	line = strings.TrimRight(line, "\r\n")
	rest, ok := strings.CutPrefix(line, "+")
	if !ok {
		return monitored{}, false
	}
	ts, rest, ok := strings.Cut(rest, " ")
	if !ok {
		return monitored{}, false
	}
	at, err := strconv.ParseFloat(ts, 64)
	if err != nil {
		return monitored{}, false
	}
	src, rest, ok := strings.Cut(strings.TrimPrefix(rest, "["), "] ")
	if !ok {
		return monitored{}, false
	}
	cmd := rest
	if q := strings.Index(rest[1:], `"`); len(rest) > 1 && rest[0] == '"' && q >= 0 {
		cmd = rest[1 : q+1]
	}
	return monitored{at: at, lua: strings.HasSuffix(src, " lua"), cmd: strings.ToLower(cmd)}, true
}

// Stop ends the monitor.
func (m *Monitor) Stop() error {
	m.conn.Close()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Counts returns, per command, how many clients sent and how many scripts
// ran between from and to (server time), leaving out the given commands.
func (m *Monitor) Counts(from, to time.Time, skip ...string) (client, script map[string]int64) {
	lo := float64(from.UnixNano()) / 1e9
	hi := float64(to.UnixNano()) / 1e9
	client, script = map[string]int64{}, map[string]int64{}
	m.mu.Lock()
	defer m.mu.Unlock()
next:
	for _, e := range m.seen {
		if e.at < lo || e.at > hi {
			continue
		}
		for _, s := range skip {
			if e.cmd == s {
				continue next
			}
		}
		if e.lua {
			script[e.cmd]++
		} else {
			client[e.cmd]++
		}
	}
	return client, script
}
