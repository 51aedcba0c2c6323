package enginetest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/enginetest"
)

// signUp is the code under test: it enqueues a chain that creates the
// account, then sends a welcome mail with the account's id, then a day
// later asks how it went.
func signUp(ctx context.Context, c *engine.Client, email string) error {
	_, err := c.EnqueueChain(ctx, "signup-"+email,
		engine.Step{Type: "account.create", Payload: []byte(email)},
		engine.Step{Type: "mail.welcome", PassResult: true},
		engine.Step{Type: "mail.survey", PassResult: true, Delay: 24 * time.Hour},
	)
	return err
}

// testSignUp is a user's test; in a _test.go file it would be
// func TestSignUp(t *testing.T).
func testSignUp(t testing.TB) {
	ctx := context.Background()
	env := enginetest.New(t, engine.Config{})
	start := env.Now()
	if err := signUp(ctx, env.Client(), "ada@example.com"); err != nil {
		t.Fatal(err)
	}
	env.RequireEnqueued(ctx, t, enginetest.Match{Type: "account.create", Payload: []byte("ada@example.com")})

	mux := engine.NewMux()
	mux.HandleFunc("account.create", func(ctx context.Context, task *engine.Task) error {
		return engine.SetResult(ctx, []byte("user-1"))
	})
	mux.HandleFunc("mail.welcome", func(ctx context.Context, task *engine.Task) error {
		fmt.Printf("welcome mail to %s\n", task.Workflow.Input)
		return engine.SetResult(ctx, task.Workflow.Input)
	})
	mux.HandleFunc("mail.survey", func(ctx context.Context, task *engine.Task) error {
		fmt.Printf("survey mail to %s\n", task.Workflow.Input)
		return nil
	})
	res, err := env.Drain(ctx, mux)
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range res.Runs {
		fmt.Println(run.Type, run.Attempt, run.State)
	}
	fmt.Println("done:", res.States[engine.StateDone])
	fmt.Println("clock moved:", env.Now().Sub(start).Round(time.Hour))
}

func Example() {
	t := &exampleT{}
	defer t.cleanup()
	testSignUp(t)
	// Output:
	// welcome mail to user-1
	// survey mail to user-1
	// account.create 1 done
	// mail.welcome 1 done
	// mail.survey 1 done
	// done: 3
	// clock moved: 24h0m0s
}

// exampleT stands in for the *testing.T an Example does not have.
type exampleT struct {
	testing.TB // nil: the methods below are all that is called
	cleanups   []func()
}

func (t *exampleT) Helper()                   {}
func (t *exampleT) Cleanup(f func())          { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Logf(string, ...any)       {}
func (t *exampleT) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (t *exampleT) Errorf(f string, a ...any) { fmt.Println("FAIL:", fmt.Sprintf(f, a...)) }
func (t *exampleT) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }

func (t *exampleT) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
