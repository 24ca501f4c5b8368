// A load generator for RocketMQ 5's gRPC endpoints with the Go client
// (github.com/apache/rocketmq-clients/golang/v5): Shoal's broker or Apache RocketMQ's proxy.
// Used by benches/peers/grpc_vs_proxy.sh.
//
//	grpc-bench produce ENDPOINT TOPIC COUNT PRODUCERS SIZE
//	grpc-bench consume ENDPOINT TOPIC GROUP COUNT CONSUMERS BATCH
//
// produce: PRODUCERS goroutines share one producer and send COUNT messages of SIZE bytes
// (synchronous sends). consume: CONSUMERS simple consumers of GROUP (one client each) receive
// up to BATCH messages at a time (invisible 30 s) and ack each, until COUNT distinct messages
// are acked. Each prints one JSON line: count, elapsed seconds, messages per second, errors
// (and for consume the duplicates: messages received again after their ack was sent).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rmq "github.com/apache/rocketmq-clients/golang/v5"
	"github.com/apache/rocketmq-clients/golang/v5/credentials"
)

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		fmt.Fprintf(os.Stderr, "not a number: %s\n", s)
		os.Exit(2)
	}
	return n
}

func report(v map[string]any) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

func produce(endpoint, topic string, count, producers, size int) {
	p, err := rmq.NewProducer(&rmq.Config{Endpoint: endpoint, Credentials: &credentials.SessionCredentials{}},
		rmq.WithTopics(topic))
	if err != nil {
		panic(err)
	}
	if err := p.Start(); err != nil {
		panic(err)
	}
	defer p.GracefulStop()
	body := make([]byte, size)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	var next, errs atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < producers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(count) {
				if _, err := p.Send(context.Background(), &rmq.Message{Topic: topic, Body: body}); err != nil {
					errs.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	report(map[string]any{"mode": "produce", "count": count, "elapsed_s": el,
		"msgs_per_s": float64(count) / el, "errors": errs.Load()})
}

func consume(endpoint, topic, group string, count, consumers, batch int) {
	var acked, dups, errs atomic.Int64
	var mu sync.Mutex
	seen := make(map[string]bool, count)
	done := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	cs := make([]rmq.SimpleConsumer, consumers)
	for i := range cs {
		c, err := rmq.NewSimpleConsumer(&rmq.Config{Endpoint: endpoint, ConsumerGroup: group,
			Credentials: &credentials.SessionCredentials{}},
			rmq.WithSimpleAwaitDuration(5*time.Second),
			rmq.WithSimpleSubscriptionExpressions(map[string]*rmq.FilterExpression{topic: rmq.SUB_ALL}))
		if err != nil {
			panic(err)
		}
		if err := c.Start(); err != nil {
			panic(err)
		}
		cs[i] = c
	}
	start := time.Now()
	for _, c := range cs {
		wg.Add(1)
		go func(c rmq.SimpleConsumer) {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				mvs, err := c.Receive(context.Background(), int32(batch), 30*time.Second)
				if err != nil {
					if s, ok := rmq.AsErrRpcStatus(err); !ok || s.GetCode() != 40401 {
						errs.Add(1)
					}
					continue
				}
				for _, m := range mvs {
					mu.Lock()
					dup := seen[m.GetMessageId()]
					seen[m.GetMessageId()] = true
					mu.Unlock()
					if dup {
						dups.Add(1)
					}
					if err := c.Ack(context.Background(), m); err != nil {
						errs.Add(1)
						continue
					}
					if !dup && acked.Add(1) >= int64(count) {
						once.Do(func() { close(done) })
					}
				}
			}
		}(c)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
	}
	el := time.Since(start).Seconds()
	n := acked.Load()
	report(map[string]any{"mode": "consume", "count": n, "elapsed_s": el,
		"msgs_per_s": float64(n) / el, "duplicates": dups.Load(), "errors": errs.Load()})
	// Receives in flight end within their long polling; the process exits without waiting.
	os.Exit(0)
}

func main() {
	rmq.EnableSsl = false
	rmq.ResetLogger()
	a := os.Args
	switch {
	case len(a) == 7 && a[1] == "produce":
		produce(a[2], a[3], atoi(a[4]), atoi(a[5]), atoi(a[6]))
	case len(a) == 8 && a[1] == "consume":
		consume(a[2], a[3], a[4], atoi(a[5]), atoi(a[6]), atoi(a[7]))
	default:
		fmt.Fprintln(os.Stderr, "usage: grpc-bench produce ENDPOINT TOPIC COUNT PRODUCERS SIZE | consume ENDPOINT TOPIC GROUP COUNT CONSUMERS BATCH")
		os.Exit(2)
	}
}
