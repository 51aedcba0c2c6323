package dashboard

import (
	"context"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/redistest"
)

// pageMeter is a Backend that keeps the bytes each listing read.
type pageMeter struct {
	Backend
	mu   sync.Mutex
	read []int64
}

func (m *pageMeter) ListTasks(ctx context.Context, o engine.ListOptions) (*engine.TaskPage, error) {
	p, err := m.Backend.ListTasks(ctx, o)
	if err == nil {
		m.mu.Lock()
		m.read = append(m.read, p.BytesRead)
		m.mu.Unlock()
	}
	return p, err
}

var stoppedMsg = regexp.MustCompile(`Search stopped after [1-9][0-9]* MiB`)

var nextLink = regexp.MustCompile(`href="([^"]*)" id="next"`)

// A search over large scheduled tasks reads about the budget a page and
// says where it stopped; following Next finds the one match at the end.
func TestSearchByteBudget(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := engine.DefaultConfig()
	cfg.Namespace = redistest.Namespace(t)
	cfg.Logger = slog.New(slog.DiscardHandler)
	client, err := engine.NewClient(cfg, srv.Pool(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n, size = 60, 128 << 10
	var batch []engine.NewTask
	for i := range n {
		mark := "plain"
		if i == n-1 {
			mark = "zzzz"
		}
		batch = append(batch, engine.NewTask{Type: "t", Payload: []byte(mark + strings.Repeat("x", size)),
			Options: []engine.Option{engine.Queue("bigq"), engine.In(time.Hour + time.Duration(i)*time.Millisecond)}})
	}
	// In batches under the one write-size rule (engine.MaxWriteBytes).
	for len(batch) > 0 {
		k := min(len(batch), 16)
		if _, err := client.EnqueueBatch(ctx, batch[:k]); err != nil {
			t.Fatal(err)
		}
		batch = batch[k:]
	}
	in, err := engine.NewInspector(cfg, srv.Pool(t))
	if err != nil {
		t.Fatal(err)
	}
	m := &pageMeter{Backend: in}
	d := newTestDashboard(t, m, Options{})
	d.budget = 1 << 20
	path := "/queues/bigq?state=scheduled&q=zzzz"
	found := false
	for pages := 0; ; pages++ {
		resp := do(d, "GET", path, "", nil, nil)
		page := readBody(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", path, resp.StatusCode)
		}
		found = found || strings.Contains(page, "zzzzxxx")
		next := nextLink.FindStringSubmatch(page)
		if next == nil {
			break
		}
		if pages == 0 && !stoppedMsg.MatchString(page) {
			t.Errorf("the first page does not say where the search stopped")
		}
		path = strings.ReplaceAll(next[1], "&amp;", "&")
		if pages > n {
			t.Fatal("paging does not end")
		}
	}
	if !found {
		t.Error("the match at the end was not found by following Next")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, b := range m.read {
		if b > d.budget+16*(size+1024) {
			t.Errorf("page %d read %d bytes, over the budget %d and one batch", i, b, d.budget)
		}
	}
	if len(m.read) < 2 {
		t.Errorf("%d pages, want several", len(m.read))
	}
}
