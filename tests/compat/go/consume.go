// A clustering push consumer that prints what it receives, for tests that run the Go client as
// one member of a consumer group among other processes
// (`rocketmq-go-check consume NAMESRV GROUP TOPIC INSTANCE`, run by
// crates/shoal/tests/replication_mixed.rs): it subscribes to TOPIC (from the first offset) as
// instance INSTANCE of GROUP and prints one JSON line per message received, with the broker
// group and queue it came from, its queue offset, its body and when the listener got it (µs
// since the epoch); it runs until it is killed.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// One message as the listener got it.
type received struct {
	MsgID       string `json:"msgId"`
	Broker      string `json:"broker"`
	Queue       int    `json:"queue"`
	QueueOffset int64  `json:"queueOffset"`
	Body        string `json:"body"`
	AtUs        int64  `json:"atUs"`
}

func consume(group, topic, instance string) {
	var mu sync.Mutex
	out := json.NewEncoder(os.Stdout)
	c := newConsumer(group, consumer.WithInstance(instance))
	must(c.Subscribe(topic, consumer.MessageSelector{},
		func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			at := time.Now().UnixMicro()
			mu.Lock()
			defer mu.Unlock()
			for _, m := range msgs {
				r := received{MsgID: m.MsgId, Body: string(m.Body), QueueOffset: m.QueueOffset, AtUs: at}
				if m.Queue != nil {
					r.Broker, r.Queue = m.Queue.BrokerName, m.Queue.QueueId
				}
				if err := out.Encode(r); err != nil {
					// Standard output closed: whoever read it is gone.
					os.Exit(1)
				}
			}
			return consumer.ConsumeSuccess, nil
		}), "subscribe")
	must(c.Start(), "consumer start")
	fmt.Fprintln(os.Stderr, "consumer started:", group, topic, instance)
	select {}
}
