package main

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
)

// fakeRedis24 answers INFO as Redis 2.4 does: plain INFO lists every
// field without sections, and INFO with an argument is refused.
func fakeRedis24(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					var n int
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					fmt.Sscanf(line, "*%d", &n)
					var args []string
					for range n {
						_, _ = r.ReadString('\n') // $len
						a, _ := r.ReadString('\n')
						args = append(args, strings.TrimSpace(a))
					}
					switch {
					case len(args) == 1 && strings.EqualFold(args[0], "INFO"):
						body := "redis_version:2.4.18\r\nused_memory:1000\r\nused_cpu_sys:0.5\r\nused_cpu_user:0.25\r\n"
						fmt.Fprintf(c, "$%d\r\n%s\r\n", len(body), body)
					default:
						fmt.Fprintf(c, "-ERR wrong number of arguments for '%s' command\r\n", strings.ToLower(args[0]))
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// Against Redis 2.4 the harness reads plain INFO instead of INFO
// <section>, says there are no commandstats, and skips asynq and rmq with
// a note while the engine and the naive design stay in.
func TestLegacyServer(t *testing.T) {
	a := NewAdmin(fakeRedis24(t))
	defer a.Close()
	info, err := a.Info("server")
	if err != nil || info["redis_version"] != "2.4.18" || !a.Legacy() {
		t.Fatalf("Info(server) = %v, %v (legacy %v)", info, err, a.Legacy())
	}
	if v, err := a.InfoInt("memory", "used_memory"); err != nil || v != 1000 {
		t.Errorf("used_memory = %d, %v", v, err)
	}
	if cpu, err := a.ServerCPU(); err != nil || cpu != 0.75 {
		t.Errorf("ServerCPU = %v, %v", cpu, err)
	}
	if _, err := a.CommandCalls(); err == nil {
		t.Errorf("CommandCalls on 2.4 gave no error")
	}
	h := NewHarness("unused", false, Sizes{}, 1, []string{"engine", "naive", "asynq", "rmq"}, 0, testLog{})
	h.Report = NewReport(nil)
	h.Admin = a
	h.legacyServer(info)
	for _, name := range []string{"asynq", "rmq"} {
		if h.skipped[name] == "" {
			t.Errorf("%s not skipped on 2.4", name)
		}
	}
	for _, name := range []string{"engine", "naive"} {
		if h.skipped[name] != "" {
			t.Errorf("%s skipped on 2.4: %s", name, h.skipped[name])
		}
	}
}
