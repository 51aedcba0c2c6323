package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/gomodule/redigo/redis"
)

var listeningRe = regexp.MustCompile(`HTTP server listening" addr=http://\S+:(\d+)/`)

// serveInProc runs `engine args...` in process until the test ends and
// returns the base URL its HTTP server logged, and its log.
func serveInProc(t *testing.T, a *app, logs *syncBuffer, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- a.main(ctx, args) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("engine %s did not stop", args[0])
		}
	})
	timeout := time.After(20 * time.Second)
	for {
		log, wrote := logs.next()
		if m := listeningRe.FindStringSubmatch(log); m != nil {
			return "http://127.0.0.1:" + m[1]
		}
		select {
		case code := <-done:
			t.Fatalf("engine %s exited (%d):\n%s", args[0], code, logs.String())
		case <-wrote:
		case <-timeout:
			t.Fatalf("the HTTP server did not start:\n%s", logs.String())
		}
	}
}

func getWith(t *testing.T, u, bearer string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", u, nil)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

var exposedRe = regexp.MustCompile(`level=ERROR msg="the dashboard and /metrics are open to every host[^\n]*addr=0\.0\.0\.0:\d+`)

// A dashboard on a non-loopback address without a read token says so at
// start, as an error naming the address and what is open.
func TestHTTPOpenDashboardLogged(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, _, logs := inproc(t, srv)
	serveInProc(t, a, logs, "dashboard", "--http", "0.0.0.0:0")
	if !exposedRe.MatchString(logs.String()) {
		t.Errorf("no error line about the open dashboard:\n%s", logs.String())
	}
}

// With a read token (a file given by flag) the dashboard and /metrics
// need it, nothing is logged as open, and the token still acts.
func TestHTTPReadTokenFile(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	rt := filepath.Join(dir, "read-token")
	if err := os.WriteFile(rt, []byte("reader-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, _, logs := inproc(t, srv, "ENGINE_HTTP_TOKEN=writer-456", "ENGINE_HTTP_SECURE_COOKIES=true")
	base := serveInProc(t, a, logs, "dashboard", "--http", "0.0.0.0:0", "--http-read-token-file", rt)
	if exposedRe.MatchString(logs.String()) {
		t.Errorf("the open-dashboard error was logged with a read token:\n%s", logs.String())
	}
	for _, path := range []string{"/", "/metrics", "/dead"} {
		if code := getWith(t, base+path, ""); code != http.StatusSeeOther && code != http.StatusUnauthorized {
			t.Errorf("GET %s without a token: %d, want 303 or 401", path, code)
		}
		for _, tok := range []string{"reader-123", "writer-456"} {
			if code := getWith(t, base+path, tok); code != http.StatusOK {
				t.Errorf("GET %s with a token: %d, want 200", path, code)
			}
		}
	}
	if code := getWith(t, base+"/healthz", ""); code != http.StatusOK {
		t.Errorf("/healthz needs no token: %d", code)
	}
	if code := httpPostForm(t, base+"/queues/default/pause", nil, "reader-123"); code != http.StatusForbidden {
		t.Errorf("pause with the read token: %d, want 403", code)
	}
	if code := httpPostForm(t, base+"/queues/default/pause", nil, "writer-456"); code != http.StatusOK {
		t.Errorf("pause with the token: %d, want 200", code)
	}
	resp, err := http.Get(base + "/login")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if !c.Secure {
			t.Errorf("cookie %s is not Secure with http.secure_cookies", c.Name)
		}
	}
}

// `engine run --http` gives the dashboard and /metrics a small pool of
// their own, not the workers', with shards too.
func TestRunHTTPOwnPool(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	t.Run("one server", func(t *testing.T) { t.Parallel(); runHTTPOwnPool(t, srv) })
	t.Run("shards", func(t *testing.T) {
		t.Parallel()
		runHTTPOwnPool(t, srv, "ENGINE_SHARDS_LANES="+srv.Addr+","+srv.Addr)
	})
}

func runHTTPOwnPool(t *testing.T, srv *redistest.Server, env ...string) {
	a, _, logs := inproc(t, srv, env...)
	pools := make(chan [2]*redis.Pool, 1)
	a.testPools = func(workers, http *redis.Pool) { pools <- [2]*redis.Pool{workers, http} }
	base := serveInProc(t, a, logs, "run", "--http", "127.0.0.1:0")
	var p [2]*redis.Pool
	select {
	case p = <-pools:
	default:
		t.Fatal("engine run --http made no pool of its own for the HTTP side")
	}
	if p[0] == p[1] || p[1].MaxActive%dashboardPoolSize != 0 || p[1].MaxActive >= p[0].MaxActive {
		t.Errorf("HTTP pool %p (%d connections), workers' %p (%d): want another, smaller pool of %d a lane",
			p[1], p[1].MaxActive, p[0], p[0].MaxActive, dashboardPoolSize)
	}
	if code := getWith(t, base+"/", ""); code != http.StatusOK {
		t.Errorf("the dashboard: %d", code)
	}
	if code := getWith(t, base+"/metrics", ""); code != http.StatusOK {
		t.Errorf("/metrics: %d", code)
	}
}

// Neither HTTP token reaches a handler command.
func TestHandlerEnvDropsHTTPTokens(t *testing.T) {
	t.Parallel()
	got := handlerEnv([]string{"ENGINE_HTTP_TOKEN=w", "ENGINE_HTTP_READ_TOKEN=r", "KEPT=1", "ENGINE_HTTP_READ_TOKEN_FILE=/f"})
	if len(got) != 2 || got[0] != "KEPT=1" || got[1] != "ENGINE_HTTP_READ_TOKEN_FILE=/f" {
		t.Errorf("handler environment %q, want KEPT=1 and the file's name only", got)
	}
}
