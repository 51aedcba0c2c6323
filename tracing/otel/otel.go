// Package otel traces tasks with OpenTelemetry. Import it only if you
// want it: the engine itself depends on no tracing library.
//
// The producer's span context travels in the task, as W3C trace context
// pairs in the task's metadata (engine.Metadata, stored in the record):
//
//	client.Enqueue(ctx, "email", payload, otel.Propagate(ctx))
//
// and the worker's handler span, started by Middleware, is its child:
//
//	mux.Use(otel.Middleware())
//
// The handler span is named after the task type, of kind consumer, with
// the queue, type, attempt and task id as attributes.
package otel

import (
	"context"

	"github.com/bucketq/bucketq/engine"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the spans this package makes.
const ScopeName = "github.com/bucketq/bucketq/tracing/otel"

// Attribute keys set on handler spans.
const (
	AttrQueue   = attribute.Key("bucketq.queue")
	AttrType    = attribute.Key("bucketq.task.type")
	AttrAttempt = attribute.Key("bucketq.task.attempt")
	AttrTaskID  = attribute.Key("bucketq.task.id")
	AttrRun     = attribute.Key("bucketq.task.run")
)

// Option configures Propagate and Middleware.
type Option func(*config)

type config struct {
	tp   trace.TracerProvider
	prop propagation.TextMapPropagator
}

// WithTracerProvider sets the provider of the handler spans' tracer.
// Default: otel.GetTracerProvider() at the time Middleware is called.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithPropagator sets how the span context is written to and read from
// the task's metadata. Default: W3C trace context (traceparent,
// tracestate). Producer and worker must agree.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.prop = p }
}

func newConfig(opts []Option) config {
	c := config{prop: propagation.TraceContext{}}
	for _, o := range opts {
		o(&c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	return c
}

// Propagate is an enqueue option that stores ctx's span context in the
// task, so that the handler span is its child. Without a valid span
// context in ctx it adds nothing.
func Propagate(ctx context.Context, opts ...Option) engine.Option {
	c := newConfig(opts)
	carrier := propagation.MapCarrier{}
	c.prop.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return engine.Metadata(nil)
	}
	return engine.Metadata(carrier)
}

// Middleware starts a span around each handler call, a child of the span
// context the producer stored with Propagate (a root span when there is
// none), and ends it with the handler's error recorded.
func Middleware(opts ...Option) engine.Middleware {
	c := newConfig(opts)
	tracer := c.tp.Tracer(ScopeName)
	return func(next engine.Handler) engine.Handler {
		return engine.HandlerFunc(func(ctx context.Context, t *engine.Task) error {
			if len(t.Metadata) > 0 {
				ctx = c.prop.Extract(ctx, propagation.MapCarrier(t.Metadata))
			}
			ctx, span := tracer.Start(ctx, t.Type,
				trace.WithSpanKind(trace.SpanKindConsumer),
				trace.WithAttributes(
					AttrQueue.String(t.Queue),
					AttrType.String(t.Type),
					AttrAttempt.Int(t.Attempt),
					AttrTaskID.String(t.ID),
					AttrRun.Int(t.Run),
					attribute.String("messaging.system", "bucketq"),
					attribute.String("messaging.operation.type", "process"),
					attribute.String("messaging.destination.name", t.Queue),
					attribute.String("messaging.message.id", t.ID),
				))
			defer span.End()
			err := next.ProcessTask(ctx, t)
			if d, ok := engine.IsSnooze(err); ok {
				// Asked to run again later: not a failure.
				span.SetAttributes(attribute.String("bucketq.retry_after", d.String()))
			} else if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			return err
		})
	}
}
