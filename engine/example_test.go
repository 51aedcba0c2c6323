package engine_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/bucketq/bucketq/engine"
	"github.com/gomodule/redigo/redis"
)

// newPool starts an in-memory Redis for the examples.
func newPool() (*redis.Pool, func()) {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", mr.Addr()) }}
	return pool, func() { pool.Close(); mr.Close() }
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func ExampleClient_Enqueue() {
	pool, done := newPool()
	defer done()
	ctx := context.Background()
	client, _ := engine.NewClient(engine.Config{Namespace: "example", Logger: quiet}, pool)

	task, err := client.Enqueue(ctx, "email.send", []byte(`{"to":"ada@example.com"}`), engine.In(time.Hour), engine.Queue("mail"), engine.MaxAttempts(5))
	if err != nil {
		panic(err)
	}
	fmt.Println(task.State, task.Queue, task.Due.Sub(task.Created).Round(time.Second))
	info, _ := client.Lookup(ctx, task.ID)
	fmt.Println(info.State, info.Queue, info.Type, info.MaxAttempts)

	_, err = client.Enqueue(ctx, "", nil)
	fmt.Println(errors.Is(err, engine.ErrInvalid))
	// Output:
	// scheduled mail 1h0m0s
	// scheduled mail email.send 5
	// true
}

func ExampleClient_Cancel() {
	pool, done := newPool()
	defer done()
	ctx := context.Background()
	client, _ := engine.NewClient(engine.Config{Namespace: "example", Logger: quiet}, pool)

	task, _ := client.Enqueue(ctx, "report.build", nil, engine.In(time.Minute))
	fmt.Println(client.Cancel(ctx, task.ID))
	info, _ := client.Lookup(ctx, task.ID)
	fmt.Println(info.State)
	fmt.Println(errors.Is(client.Cancel(ctx, task.ID), engine.ErrAlreadyDone))
	// Output:
	// <nil>
	// cancelled
	// true
}

func ExampleServer_Run() {
	pool, done := newPool()
	defer done()
	ctx := context.Background()
	cfg := engine.Config{Namespace: "example", Logger: quiet}
	client, _ := engine.NewClient(cfg, pool)

	ran := make(chan string, 1)
	mux := engine.NewMux()
	mux.HandleFunc("greet", func(ctx context.Context, t *engine.Task) error {
		ran <- "hello, " + string(t.Payload)
		return nil
	})
	srv, _ := engine.NewServer(cfg, mux, engine.AllRoles, pool)
	go srv.Run(ctx)

	task, _ := client.Enqueue(ctx, "greet", []byte("world"), engine.In(50*time.Millisecond))
	fmt.Println(<-ran)
	_ = srv.Shutdown(ctx)
	info, _ := client.Lookup(ctx, task.ID)
	fmt.Println(info.State, info.Attempt)
	// Output:
	// hello, world
	// done 1
}

// A producer that chooses the task's id can retry without fear of
// duplicates: the second Enqueue of an id writes nothing.
func ExampleTaskID() {
	pool, done := newPool()
	defer done()
	ctx := context.Background()
	client, _ := engine.NewClient(engine.Config{Namespace: "example", Logger: quiet}, pool)

	enqueue := func() error {
		_, err := client.Enqueue(ctx, "invoice.send", []byte("42"), engine.In(time.Hour), engine.TaskID("invoice-42"))
		return err
	}
	err := enqueue()
	for errors.Is(err, engine.ErrUncertain) {
		err = enqueue() // the reply was lost: the same id makes the retry safe
	}
	fmt.Println(err)
	fmt.Println(errors.Is(enqueue(), engine.ErrTaskExists))
	info, _ := client.Lookup(ctx, "invoice-42")
	fmt.Println(info.ID, info.State)
	// Output:
	// <nil>
	// true
	// invoice-42 scheduled
}

// A batch with an id that exists writes none of its tasks; the error
// names the ids that exist.
func ExampleExistsError() {
	pool, done := newPool()
	defer done()
	ctx := context.Background()
	client, _ := engine.NewClient(engine.Config{Namespace: "example", Logger: quiet}, pool)

	_, _ = client.Enqueue(ctx, "user.welcome", nil, engine.TaskID("welcome-ada"))
	_, err := client.EnqueueBatch(ctx, []engine.NewTask{
		{Type: "user.welcome", Options: []engine.Option{engine.TaskID("welcome-bob")}},
		{Type: "user.welcome", Options: []engine.Option{engine.TaskID("welcome-ada")}},
	})
	var exists *engine.ExistsError
	if errors.As(err, &exists) {
		fmt.Println(exists.IDs)
	}
	_, err = client.Lookup(ctx, "welcome-bob")
	fmt.Println(errors.Is(err, engine.ErrNotFound))
	// Output:
	// [welcome-ada]
	// true
}
