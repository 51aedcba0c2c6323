package main

import (
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
)

// httpAddr is the address a process logged for its HTTP server (it was
// given port 0).
func (p *proc) httpAddr() string {
	p.h.t.Helper()
	re := regexp.MustCompile(`HTTP server listening" addr=http://(127\.0\.0\.1:\d+)/`)
	var addr string
	p.h.eventually(10*time.Second, "the HTTP server to listen", func() bool {
		m := re.FindStringSubmatch(p.log())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	return "http://" + addr
}

func httpGet(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func httpPostForm(t *testing.T, u string, form url.Values, bearer string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
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

// TestE2ERunHTTP: `engine run --http` serves /healthz, /readyz and the
// dashboard; a change needs the token (from a file here), and with it
// runs a scheduled task now.
func TestE2ERunHTTP(t *testing.T) {
	h := newHarness(t, redistest.Private()) // it stops and restarts the server
	tokenFile := filepath.Join(h.dir, "token")
	if err := os.WriteFile(tokenFile, []byte("tok-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := h.startRun([]string{"ENGINE_HTTP_TOKEN_FILE=" + tokenFile}, "--http", "127.0.0.1:0")
	base := p.httpAddr()
	if code, body := httpGet(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d %q", code, body)
	}
	h.eventually(10*time.Second, "/readyz to answer 200", func() bool { code, _ := httpGet(t, base+"/readyz"); return code == 200 })
	if _, body := httpGet(t, base+"/readyz"); !strings.Contains(body, "\nredis memory: ") {
		t.Errorf("/readyz's body %q does not say the Redis memory policy", body)
	}
	if code, body := httpGet(t, base+"/"); code != 200 || !strings.Contains(body, "Overview") || !strings.Contains(body, "Redis memory: ") {
		t.Errorf("/ = %d, want the overview with the Redis memory policy:\n%s", code, body)
	}
	id := h.enqueue("--type", "append", "--payload", "later", "--in", "1h")
	form := url.Values{"verb": {"run"}, "id": {id}, "state": {"scheduled"}}
	if code := httpPostForm(t, base+"/actions", form, ""); code != http.StatusForbidden {
		t.Errorf("run now without the token: %d, want 403", code)
	}
	if code := httpPostForm(t, base+"/actions", form, "wrong"); code != http.StatusForbidden {
		t.Errorf("run now with a wrong token: %d, want 403", code)
	}
	if st := h.lookup(id).State; st != "scheduled" {
		t.Fatalf("a refused request changed the task: %s", st)
	}
	if code := httpPostForm(t, base+"/actions", form, "tok-123"); code != http.StatusOK {
		t.Errorf("run now with the token: %d, want 200", code)
	}
	h.eventually(10*time.Second, "the task made ready to run", func() bool { return h.lookup(id).State == "done" })

	// /metrics: the run counted, its lateness observed, the queue gauges
	// read from Redis (cached a few seconds).
	var metrics string
	h.eventually(10*time.Second, "/metrics to count the run", func() bool {
		_, metrics = httpGet(t, base+"/metrics")
		return strings.Contains(metrics, `bucketq_tasks_processed_total{queue="default",type="append"} 1`) &&
			strings.Contains(metrics, `bucketq_queue_tasks{queue="default",state="scheduled"} 0`)
	})
	for _, want := range []string{
		`bucketq_task_lateness_seconds_count{queue="default"} 1`,
		`bucketq_task_run_duration_seconds_count{queue="default",type="append"} 1`,
		`bucketq_queue_tasks{queue="default",state="dead"} 0`,
		`bucketq_workers_alive 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, metrics)
		}
	}

	// /readyz follows Redis: 503 within a few seconds of it going down,
	// 200 again once it is back; /healthz stays 200.
	h.srv.Stop(t)
	h.eventually(5*time.Second, "/readyz to answer 503", func() bool { code, _ := httpGet(t, base+"/readyz"); return code == 503 })
	if code, _ := httpGet(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d with Redis down, want 200", code)
	}
	h.srv.Restart(t)
	h.eventually(10*time.Second, "/readyz to answer 200 again", func() bool { code, _ := httpGet(t, base+"/readyz"); return code == 200 })
}

// TestE2EDashboardCmd: `engine dashboard` serves the dashboard alone,
// read-only without a token.
func TestE2EDashboardCmd(t *testing.T) {
	h := newHarness(t)
	p := h.start(nil, "dashboard", "--http", "127.0.0.1:0")
	base := p.httpAddr()
	h.eventually(10*time.Second, "/readyz to answer 200", func() bool { code, _ := httpGet(t, base+"/readyz"); return code == 200 })
	code, body := httpGet(t, base+"/")
	if code != 200 || !strings.Contains(body, "read-only: no token") {
		t.Errorf("/ = %d, want the overview, read-only:\n%s", code, body)
	}
	if code := httpPostForm(t, base+"/actions", url.Values{"verb": {"delete"}, "id": {"x"}}, "anything"); code != http.StatusForbidden {
		t.Errorf("an action without a configured token: %d, want 403", code)
	}
}

func TestHTTPSettings(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"http:\n  addr: 9090\n", "cfg.yaml:2: http.addr"},
		{"\nhttp:\n  read_only: maybe\n", "cfg.yaml:3: http.read_only"},
		{"http:\n  adr: x\n", "did you mean http.addr"},
	} {
		_, err := ParseConfig(strings.NewReader(c.yaml), "cfg.yaml")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.yaml, err, c.want)
		}
	}
	s, err := ParseConfig(strings.NewReader("http:\n  addr: ':9090'\n  token_file: /nonexistent/token\n"), "cfg.yaml")
	if err != nil {
		t.Fatal(err)
	}
	a := &app{}
	if _, err := a.httpToken(s); err == nil || !strings.Contains(err.Error(), "cfg.yaml:3: http.token_file") {
		t.Errorf("missing token file: %v, want an error naming cfg.yaml:3", err)
	}
	// The token from the environment is known (no warning) and never
	// reaches a handler command.
	env := []string{"ENGINE_HTTP_TOKEN=t", "PATH=/bin"}
	if w := unknownEnv(env); len(w) != 0 {
		t.Errorf("warnings %q for ENGINE_HTTP_TOKEN", w)
	}
	if got := handlerEnv(env); slices.Contains(got, "ENGINE_HTTP_TOKEN=t") {
		t.Errorf("handler environment %q holds the HTTP token", got)
	}
	a.environ = env
	s.HTTP.TokenFile = ""
	if tok, err := a.httpToken(s); err != nil || tok != "t" {
		t.Errorf("token from the environment = %q, %v", tok, err)
	}
}
