// Apache RocketMQ's Go client (github.com/apache/rocketmq-client-go/v2) against Shoal: admin
// (create, list and delete topics), a producer with tags and keys, a push consumer with a tag
// expression (TagA || TagB), ordered sends and an orderly consumer, two broadcasting
// consumers, and retries (a message failed once comes back with reconsumeTimes 1).
// Usage: rocketmq-go-check NAMESRV BROKER_ADDR; the failover (failover.go) and a consumer that
// prints what it receives (consume.go) have modes of their own.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
)

var (
	ns     string
	broker string
	run    = strconv.FormatInt(time.Now().UnixNano()%1_000_000, 10)
)

func check(ok bool, format string, args ...any) {
	what := fmt.Sprintf(format, args...)
	if !ok {
		fmt.Println("FAILED:", what)
		os.Exit(1)
	}
	fmt.Println("ok:", what)
}

func must(err error, what string) {
	if err != nil {
		check(false, "%s: %v", what, err)
	}
}

// Waits up to `limit` for cond.
func waitFor(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return cond()
}

func adminClient() admin.Admin {
	a, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver([]string{ns})))
	must(err, "admin client")
	return a
}

func createTopic(a admin.Admin, topic string, queues int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	must(a.CreateTopic(ctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(broker),
		admin.WithReadQueueNums(queues), admin.WithWriteQueueNums(queues)), "create topic "+topic)
}

func newProducer(group string, opts ...producer.Option) rocketmq.Producer {
	p, err := rocketmq.NewProducer(append([]producer.Option{
		producer.WithNsResolver(primitive.NewPassthroughResolver([]string{ns})),
		producer.WithGroupName(group + "-" + run),
		producer.WithInstanceName(group),
		producer.WithRetry(2),
	}, opts...)...)
	must(err, "producer")
	must(p.Start(), "producer start")
	return p
}

func newConsumer(group string, opts ...consumer.Option) rocketmq.PushConsumer {
	c, err := rocketmq.NewPushConsumer(append([]consumer.Option{
		consumer.WithNsResolver(primitive.NewPassthroughResolver([]string{ns})),
		consumer.WithGroupName(group),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
	}, opts...)...)
	must(err, "consumer "+group)
	return c
}

func adminChecks() {
	a := adminClient()
	defer a.Close()
	for _, t := range []string{"GoTags", "GoOrder", "GoBroad", "GoRetry", "GoScratch"} {
		createTopic(a, t, 4)
	}
	check(waitFor(10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		list, err := a.FetchAllTopicList(ctx)
		if err != nil {
			return false
		}
		found := 0
		for _, t := range list.TopicList {
			if strings.HasPrefix(t, "Go") {
				found++
			}
		}
		return found == 5
	}), "admin: 5 topics created on %s and listed by the name server", broker)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	must(a.DeleteTopic(ctx, admin.WithTopicDelete("GoScratch"), admin.WithBrokerAddrDelete(broker),
		admin.WithNameSrvAddr([]string{ns})), "delete topic")
	list, err := a.FetchAllTopicList(ctx)
	must(err, "list topics")
	for _, t := range list.TopicList {
		if t == "GoScratch" {
			check(false, "admin: GoScratch still listed after its deletion")
		}
	}
	check(true, "admin: topic deleted from broker and name server")
}

// A push consumer subscribed with a tag expression gets exactly the messages of its tags.
func tags(p rocketmq.Producer) {
	tagOf := []string{"TagA", "TagB", "TagC"}
	want := map[string]bool{}
	for i := 0; i < 30; i++ {
		tag := tagOf[i%3]
		body := fmt.Sprintf("tags-%d-%s", i, tag)
		msg := primitive.NewMessage("GoTags", []byte(body)).WithTag(tag).WithKeys([]string{"key-" + strconv.Itoa(i)})
		r, err := p.SendSync(context.Background(), msg)
		must(err, "send")
		if r.Status != primitive.SendOK {
			check(false, "send %d: status %v", i, r.Status)
		}
		if tag != "TagC" {
			want[body] = true
		}
	}
	var mu sync.Mutex
	got := map[string]int{}
	other := 0
	c := newConsumer("go-tags-" + run)
	must(c.Subscribe("GoTags", consumer.MessageSelector{Type: consumer.TAG, Expression: "TagA || TagB"},
		func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range msgs {
				if m.GetTags() == "TagC" || !want[string(m.Body)] {
					other++
				}
				got[string(m.Body)]++
				k := m.GetKeys()
				if !strings.HasPrefix(k, "key-") {
					other++
				}
			}
			return consumer.ConsumeSuccess, nil
		}), "subscribe with tags")
	must(c.Start(), "consumer start")
	defer c.Shutdown()
	ok := waitFor(40*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == len(want)
	})
	time.Sleep(time.Second) // anything else still to come would show now
	mu.Lock()
	defer mu.Unlock()
	check(ok, "push consumer with \"TagA || TagB\": %d of %d messages of its tags received", len(got), len(want))
	check(other == 0, "no message of another tag, keys kept (%d unexpected)", other)
}

// Ordered sends by key; an orderly consumer sees each key's messages in order.
func orderly() {
	p := newProducer("go-order-producer", producer.WithQueueSelector(producer.NewHashQueueSelector()))
	defer p.Shutdown()
	const keys, per = 4, 10
	for i := 0; i < per; i++ {
		for k := 0; k < keys; k++ {
			msg := primitive.NewMessage("GoOrder", []byte(fmt.Sprintf("order-%d-%d", k, i)))
			msg.WithShardingKey("order-" + strconv.Itoa(k))
			_, err := p.SendSync(context.Background(), msg)
			must(err, "ordered send")
		}
	}
	var mu sync.Mutex
	next := map[int]int{}
	bad := 0
	total := 0
	c := newConsumer("go-order-"+run, consumer.WithConsumerOrder(true))
	must(c.Subscribe("GoOrder", consumer.MessageSelector{},
		func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range msgs {
				var k, i int
				if _, err := fmt.Sscanf(string(m.Body), "order-%d-%d", &k, &i); err != nil || i != next[k] {
					bad++
				}
				next[k] = i + 1
				total++
			}
			return consumer.ConsumeSuccess, nil
		}), "subscribe orderly")
	must(c.Start(), "orderly consumer start")
	defer c.Shutdown()
	ok := waitFor(40*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return total >= keys*per
	})
	mu.Lock()
	defer mu.Unlock()
	check(ok && bad == 0, "orderly consumer: %d messages, each key in send order (%d out of order)", total, bad)
}

// Two broadcasting consumers of one group each get every message.
func broadcast(p rocketmq.Producer) {
	const n = 12
	var mu sync.Mutex
	seen := []map[string]bool{{}, {}}
	var cs []rocketmq.PushConsumer
	for i := 0; i < 2; i++ {
		i := i
		c := newConsumer("go-broad-"+run, consumer.WithConsumerModel(consumer.BroadCasting),
			consumer.WithInstance("broad-"+strconv.Itoa(i)))
		must(c.Subscribe("GoBroad", consumer.MessageSelector{},
			func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
				mu.Lock()
				defer mu.Unlock()
				for _, m := range msgs {
					seen[i][string(m.Body)] = true
				}
				return consumer.ConsumeSuccess, nil
			}), "subscribe broadcasting")
		must(c.Start(), "broadcasting consumer start")
		cs = append(cs, c)
	}
	defer func() {
		for _, c := range cs {
			c.Shutdown()
		}
	}()
	for i := 0; i < n; i++ {
		_, err := p.SendSync(context.Background(), primitive.NewMessage("GoBroad", []byte(fmt.Sprintf("broad-%d", i))))
		must(err, "send")
	}
	ok := waitFor(40*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen[0]) == n && len(seen[1]) == n
	})
	check(ok, "broadcasting: both consumers got all %d messages (%d, %d)", n, len(seen[0]), len(seen[1]))
}

// A message failed once (reconsume later, delay level 1) comes back with reconsumeTimes 1.
func retries(p rocketmq.Producer) {
	const n = 5
	var mu sync.Mutex
	first := map[string]bool{}
	again := map[string]int32{}
	c := newConsumer("go-retry-" + run)
	must(c.Subscribe("GoRetry", consumer.MessageSelector{},
		func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			mu.Lock()
			defer mu.Unlock()
			failed := false
			for _, m := range msgs {
				b := string(m.Body)
				if !first[b] {
					first[b] = true
					failed = true
				} else {
					again[b] = m.ReconsumeTimes
				}
			}
			if failed {
				if cc, ok := primitive.GetConcurrentlyCtx(ctx); ok {
					cc.DelayLevelWhenNextConsume = 1
				}
				return consumer.ConsumeRetryLater, nil
			}
			return consumer.ConsumeSuccess, nil
		}), "subscribe for retries")
	must(c.Start(), "retry consumer start")
	defer c.Shutdown()
	for i := 0; i < n; i++ {
		_, err := p.SendSync(context.Background(), primitive.NewMessage("GoRetry", []byte(fmt.Sprintf("retry-%d", i))))
		must(err, "send")
	}
	ok := waitFor(60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(again) == n
	})
	mu.Lock()
	defer mu.Unlock()
	times := true
	for _, t := range again {
		times = times && t == 1
	}
	check(ok && times, "retries: %d of %d failed messages redelivered with reconsumeTimes 1 (%v)", len(again), n, again)
}

func main() {
	rlog.SetLogLevel("error")
	if len(os.Args) == 5 && os.Args[1] == "failover" {
		ns = os.Args[2]
		pid, err := strconv.Atoi(os.Args[4])
		must(err, "master pid")
		failover(os.Args[3], pid)
		fmt.Println("rocketmq go client failover: passed")
		return
	}
	if len(os.Args) == 6 && os.Args[1] == "consume" {
		ns = os.Args[2]
		consume(os.Args[3], os.Args[4], os.Args[5])
		return
	}
	if len(os.Args) != 3 {
		fmt.Println("usage: rocketmq-go-check NAMESRV BROKER_ADDR | failover NAMESRV MASTER_ADDR MASTER_PID | consume NAMESRV GROUP TOPIC INSTANCE")
		os.Exit(2)
	}
	ns, broker = os.Args[1], os.Args[2]
	adminChecks()
	p := newProducer("go-producer")
	defer p.Shutdown()
	tags(p)
	orderly()
	broadcast(p)
	retries(p)
	fmt.Println("rocketmq go client: passed")
}
