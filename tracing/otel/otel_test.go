package otel_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/redistest"
	bqotel "github.com/bucketq/bucketq/tracing/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestHandlerSpanIsChildOfProducer: a task enqueued under a producer span
// carries its context through Redis; each run's handler span is its
// child, with queue, type, attempt and id, and a failed run is marked so.
func TestHandlerSpanIsChildOfProducer(t *testing.T) {
	srv := redistest.Start(t)
	pool := srv.Pool(t)
	ns := redistest.Namespace(t)
	t.Cleanup(func() { srv.Cleanup(t, ns) })
	cfg := engine.Config{Namespace: ns, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RetryDelay: func(*engine.Task, int, error) time.Duration { return 0 }, Advanced: engine.AdvancedConfig{IdleWait: time.Second}}

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	client, err := engine.NewClient(cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	pctx, producer := tp.Tracer("producer").Start(t.Context(), "enqueue", trace.WithSpanKind(trace.SpanKindProducer))
	info, err := client.Enqueue(pctx, "email", []byte("hi"), engine.Queue("mail"), bqotel.Propagate(pctx))
	producer.End()
	if err != nil {
		t.Fatal(err)
	}
	// The context is stored in the record: Lookup shows it.
	got, err := client.Lookup(t.Context(), info.ID)
	if err != nil || got.Metadata["traceparent"] == "" {
		t.Fatalf("stored metadata %v, %v; want a traceparent", got.Metadata, err)
	}
	// Without a span, Propagate adds nothing.
	plain, err := client.Enqueue(t.Context(), "other", nil, engine.Queue("mail"), bqotel.Propagate(t.Context()))
	if err != nil || plain.Metadata != nil {
		t.Fatalf("enqueue without a span: metadata %v, %v", plain.Metadata, err)
	}

	done := make(chan struct{})
	mux := engine.NewMux()
	mux.Use(bqotel.Middleware(bqotel.WithTracerProvider(tp)))
	mux.HandleFunc("email", func(ctx context.Context, task *engine.Task) error {
		if !trace.SpanContextFromContext(ctx).IsValid() {
			t.Error("handler context has no span")
		}
		if task.Attempt == 1 {
			return errors.New("smtp down")
		}
		close(done)
		return nil
	})
	mux.HandleFunc("other", func(context.Context, *engine.Task) error { return nil })
	cfg.Queues = []engine.QueueConfig{{Name: "mail"}}
	s, err := engine.NewServer(cfg, mux, engine.RoleDispatcher|engine.RoleWorker, pool)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- s.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("task did not succeed")
	}
	stop()
	if err := <-runDone; err != nil {
		t.Fatal(err)
	}

	var runs []sdktrace.ReadOnlySpan
	for _, s := range exp.GetSpans().Snapshots() {
		if s.Name() == "email" {
			runs = append(runs, s)
		}
	}
	if len(runs) != 2 {
		t.Fatalf("%d handler spans for the task, want 2 (a failed run and its retry)", len(runs))
	}
	psc := producer.SpanContext()
	for i, s := range runs {
		if s.Parent().TraceID() != psc.TraceID() || s.Parent().SpanID() != psc.SpanID() || !s.Parent().IsRemote() {
			t.Errorf("run %d: parent %v, want the producer span %v", i+1, s.Parent(), psc)
		}
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("run %d: kind %v", i+1, s.SpanKind())
		}
		a := attrs(s)
		if a[bqotel.AttrQueue].AsString() != "mail" || a[bqotel.AttrType].AsString() != "email" ||
			a[bqotel.AttrTaskID].AsString() != info.ID || a[bqotel.AttrAttempt].AsInt64() != int64(i+1) {
			t.Errorf("run %d: attributes %v", i+1, a)
		}
	}
	if runs[0].Status().Code != codes.Error || runs[1].Status().Code == codes.Error {
		t.Errorf("statuses %v, %v; want the failed run marked as an error, the other not", runs[0].Status(), runs[1].Status())
	}
	// The task without a producer span got a root span.
	for _, s := range exp.GetSpans().Snapshots() {
		if s.Name() == "other" && s.Parent().IsValid() {
			t.Errorf("span of a task enqueued without a span has parent %v", s.Parent())
		}
	}
}
