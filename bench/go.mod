module github.com/bucketq/bucketq/bench

go 1.26.0

replace github.com/bucketq/bucketq => ../

require (
	github.com/adjust/rmq/v5 v5.2.0
	github.com/gomodule/redigo v1.9.3
	github.com/hibiken/asynq v0.26.0
	github.com/redis/go-redis/v9 v9.14.1
)

require github.com/jonboulle/clockwork v0.5.0 // indirect

require (
	github.com/alicebob/miniredis/v2 v2.40.0 // indirect
	github.com/bucketq/bucketq v0.0.0
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dgryski/go-rendezvous v0.0.0-20200823014737-9f7001d12a5f // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	github.com/spf13/cast v1.10.0 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/time v0.14.0 // indirect
	google.golang.org/protobuf v1.36.10 // indirect
)
