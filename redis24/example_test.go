package redis24_test

import (
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/bucketq/bucketq/redis24"
	"github.com/gomodule/redigo/redis"
)

func ExampleCheck() {
	err := redis24.Check("SET", "job:1", "payload", "EX", 60)
	fmt.Println(errors.Is(err, redis24.ErrNot24))

	var v *redis24.Violation
	if errors.As(err, &v) {
		fmt.Println(v.Reason)
	}
	fmt.Println(redis24.Check("SETEX", "job:1", 60, "payload"))
	// Output:
	// true
	// SET with EX option needs Redis 2.6.12
	// <nil>
}

func ExampleWrap() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()

	raw, err := redis.Dial("tcp", m.Addr())
	if err != nil {
		panic(err)
	}
	census := redis24.NewCensus()
	conn := redis24.Wrap(raw, redis24.WithCensus(census), redis24.OnViolation(func(v *redis24.Violation) {
		fmt.Println("refused:", v.Reason)
	}))
	defer conn.Close()

	_, err = conn.Do("BLPOP", "queue", 0.5) // refused, never sent
	fmt.Println(errors.Is(err, redis24.ErrNot24))
	reply, err := conn.Do("SETEX", "k", 10, "v")
	fmt.Println(reply, err)
	fmt.Println(census.Commands())
	// Output:
	// refused: BLPOP timeout "0.5" is not a non-negative integer number of seconds (float timeouts need Redis 6.0)
	// true
	// OK <nil>
	// [blpop setex]
}
