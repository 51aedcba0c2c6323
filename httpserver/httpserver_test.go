package httpserver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/httpserver"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/internal/testwait"
)

// start serves s on a free loopback port until the test ends and returns
// its base URL.
func start(t *testing.T, opts httpserver.Options) string {
	t.Helper()
	opts.Addr = "127.0.0.1:0"
	s, err := httpserver.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Handle("/metrics", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "mounted\n") }))
	ln, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// await polls url until it answers code, for at most within; it logs
// each other answer it gets on the way.
func await(t *testing.T, url string, code int, within time.Duration) string {
	t.Helper()
	var body, seen string
	testwait.Until(t, within, fmt.Sprintf("%s to answer %d", url, code), func() bool {
		var got int
		got, body = get(t, url)
		if a := fmt.Sprintf("%d %q", got, body); got != code && a != seen {
			seen = a
			t.Logf("%s: %s, want %d", url, a, code)
		}
		return got == code
	})
	return body
}

func TestHealthzAndMount(t *testing.T) {
	t.Parallel()
	base := start(t, httpserver.Options{})
	if code, body := get(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q, want 200 ok", code, body)
	}
	if code, body := get(t, base+"/metrics"); code != 200 || body != "mounted\n" {
		t.Errorf("/metrics = %d %q, want the mounted handler", code, body)
	}
	if code, _ := get(t, base+"/nothing"); code != 404 {
		t.Errorf("/nothing = %d, want 404", code)
	}
}

// TestReadyzFollowsRedis stops the test's own Redis: /readyz turns 503
// within a few seconds, and 200 again once the server is back.
func TestReadyzFollowsRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Private()) // it stops and restarts the server
	base := start(t, httpserver.Options{Pool: srv.Pool(t), PingTimeout: 500 * time.Millisecond})
	if code, body := get(t, base+"/readyz"); code != 200 || body != "ready\n" {
		t.Fatalf("/readyz = %d %q, want 200 ready", code, body)
	}
	srv.Stop(t)
	body := await(t, base+"/readyz", http.StatusServiceUnavailable, 3*time.Second)
	if !strings.Contains(body, "redis:") {
		t.Errorf("/readyz body %q does not name Redis", body)
	}
	// /healthz says the process is alive regardless.
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d with Redis down, want 200", code)
	}
	srv.Restart(t)
	await(t, base+"/readyz", http.StatusOK, 5*time.Second)
}

func TestReadyzComponents(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var up atomic.Bool
	ready := func(context.Context) error {
		if !up.Load() {
			return errors.New("worker not started")
		}
		return nil
	}
	base := start(t, httpserver.Options{Pool: srv.Pool(t), Ready: ready})
	code, body := get(t, base+"/readyz")
	if code != 503 || !strings.Contains(body, "worker not started") {
		t.Errorf("/readyz = %d %q, want 503 naming the component", code, body)
	}
	up.Store(true)
	if code, _ := get(t, base+"/readyz"); code != 200 {
		t.Errorf("/readyz = %d once ready, want 200", code)
	}
}

func TestResolveAddr(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{":9090": "127.0.0.1:9090", "0.0.0.0:80": "0.0.0.0:80",
		"localhost:1": "localhost:1", "[::1]:9": "[::1]:9"} {
		if got, err := httpserver.ResolveAddr(in); err != nil || got != want {
			t.Errorf("ResolveAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "9090", "host", "host:"} {
		if _, err := httpserver.ResolveAddr(bad); err == nil {
			t.Errorf("ResolveAddr(%q) = nil error", bad)
		}
	}
}

// TestReadyzDetail: Detail's lines follow the verdict, ready or not, and
// an error in it is shown in its place.
func TestReadyzDetail(t *testing.T) {
	t.Parallel()
	var up, broken atomic.Bool
	base := start(t, httpserver.Options{
		Ready: func(context.Context) error {
			if !up.Load() {
				return errors.New("worker not started")
			}
			return nil
		},
		Detail: func(context.Context) (string, error) {
			if broken.Load() {
				return "", errors.New("CONFIG GET timed out")
			}
			return "redis memory: maxmemory 100 bytes, policy noeviction\n", nil
		},
	})
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.HasSuffix(body, "\nredis memory: maxmemory 100 bytes, policy noeviction\n") {
		t.Errorf("/readyz = %d %q, want 503 followed by the detail", code, body)
	}
	up.Store(true)
	if code, body := get(t, base+"/readyz"); code != 200 || body != "ready\nredis memory: maxmemory 100 bytes, policy noeviction\n" {
		t.Errorf("/readyz = %d %q, want ready and the detail", code, body)
	}
	broken.Store(true)
	if code, body := get(t, base+"/readyz"); code != 200 || body != "ready\ndetail unavailable: CONFIG GET timed out\n" {
		t.Errorf("/readyz = %d %q, want ready and the detail's error", code, body)
	}
}
