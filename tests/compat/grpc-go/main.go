// RocketMQ 5's Go client (github.com/apache/rocketmq-clients/golang/v5) against Shoal's gRPC
// endpoint, the same checks as tests/compat/grpc_python.py. Run by
// tests/compat/run-grpc-client.sh go, which starts `shoal dev` and creates the topics
// P5Normal (2 queues), P5Fifo (FIFO), P5Delay (DELAY), P5Tx (TRANSACTION) and P5Sql.
// Usage: rocketmq-go5-check GRPC_ENDPOINT. Exit 0 when every check passed.
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	rmq "github.com/apache/rocketmq-clients/golang/v5"
	"github.com/apache/rocketmq-clients/golang/v5/credentials"
)

var endpoint string

func check(cond bool, format string, args ...any) {
	what := fmt.Sprintf(format, args...)
	if !cond {
		fmt.Printf("FAILED: %s\n", what)
		os.Exit(1)
	}
	fmt.Printf("ok: %s\n", what)
}

func must(err error, what string) {
	if err != nil {
		fmt.Printf("FAILED: %s: %v\n", what, err)
		os.Exit(1)
	}
}

func config(group string) *rmq.Config {
	return &rmq.Config{Endpoint: endpoint, ConsumerGroup: group, Credentials: &credentials.SessionCredentials{}}
}

func producer(checker *rmq.TransactionChecker, topics ...string) rmq.Producer {
	opts := []rmq.ProducerOption{rmq.WithTopics(topics...)}
	if checker != nil {
		opts = append(opts, rmq.WithTransactionChecker(checker))
	}
	p, err := rmq.NewProducer(config(""), opts...)
	must(err, "new producer")
	must(p.Start(), "producer start")
	return p
}

func consumer(group, topic string, f *rmq.FilterExpression) rmq.SimpleConsumer {
	c, err := rmq.NewSimpleConsumer(config(group),
		rmq.WithSimpleAwaitDuration(2*time.Second),
		rmq.WithSimpleSubscriptionExpressions(map[string]*rmq.FilterExpression{topic: f}))
	must(err, "new simple consumer")
	must(c.Start(), "simple consumer start")
	return c
}

func message(topic, body string) *rmq.Message {
	return &rmq.Message{Topic: topic, Body: []byte(body)}
}

// receiveN receives until n messages came or the time passed. A receive that found nothing
// is an error of this client (MESSAGE_NOT_FOUND); it is not a failure here.
func receiveN(c rmq.SimpleConsumer, n int, invisible time.Duration) []*rmq.MessageView {
	var got []*rmq.MessageView
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		mvs, err := c.Receive(context.Background(), 16, invisible)
		if err != nil && !notFound(err) {
			fmt.Printf("receive: %v\n", err)
			time.Sleep(200 * time.Millisecond)
		}
		got = append(got, mvs...)
	}
	return got
}

func notFound(err error) bool {
	if s, ok := rmq.AsErrRpcStatus(err); ok {
		return s.GetCode() == 40401 // MESSAGE_NOT_FOUND
	}
	return false
}

func bodies(mvs []*rmq.MessageView, sorted bool) []string {
	out := []string{}
	for _, m := range mvs {
		out = append(out, string(m.GetBody()))
	}
	if sorted {
		sort.Strings(out)
	}
	return out
}

func eq(a, b []string) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

func normalAndSimpleConsumer() {
	p := producer(nil, "P5Normal")
	defer p.GracefulStop()
	c := consumer("go-simple", "P5Normal", rmq.SUB_ALL)
	defer c.GracefulStop()
	for i := 0; i < 4; i++ {
		m := message("P5Normal", "m"+strconv.Itoa(i))
		m.SetTag("t")
		m.SetKeys("k-m" + strconv.Itoa(i))
		m.AddProperty("origin", "go")
		r, err := p.Send(context.Background(), m)
		must(err, "send")
		check(len(r) == 1 && r[0].MessageID != "", "send m%d: message id %s", i, r[0].MessageID)
	}
	got := receiveN(c, 4, 2*time.Second)
	check(eq(bodies(got, true), []string{"m0", "m1", "m2", "m3"}), "received each message once: %v", bodies(got, true))
	var stale *rmq.MessageView
	for _, m := range got {
		b := string(m.GetBody())
		check(m.GetDeliveryAttempt() == 1 && m.GetTag() != nil && *m.GetTag() == "t" &&
			eq(m.GetKeys(), []string{"k-" + b}) && m.GetProperties()["origin"] == "go",
			"%s: attempt 1, tag, keys and property kept", b)
	}
	for _, m := range got {
		switch string(m.GetBody()) {
		case "m2":
			// A new lease, and an ack with the new receipt.
			must(c.ChangeInvisibleDuration(m, 30*time.Second), "change invisible duration")
			must(c.Ack(context.Background(), m), "ack after a lease change")
		case "m3":
			stale = m // no ack: it comes again after its 2 s lease
		default:
			must(c.Ack(context.Background(), m), "ack")
		}
	}
	again := receiveN(c, 1, 2*time.Second)
	check(len(again) == 1 && string(again[0].GetBody()) == "m3" && again[0].GetDeliveryAttempt() == 2,
		"the unacknowledged message redelivered after its lease, attempt 2")
	check(stale.GetReceiptHandle() != again[0].GetReceiptHandle(), "the redelivery has a new receipt")
	// This client's Ack returns nil whatever the status (it does not read the answer's code),
	// so the refusal shows in what follows: the lapsed receipt's ack must not end the new
	// lease, and the message comes a third time after it.
	must(c.Ack(context.Background(), stale), "ack of the lapsed receipt (the client ignores the status)")
	third := receiveN(c, 1, 10*time.Second)
	check(len(third) == 1 && string(third[0].GetBody()) == "m3" && third[0].GetDeliveryAttempt() == 3,
		"the lapsed receipt's ack was refused: the message came again, attempt 3")
	must(c.Ack(context.Background(), third[0]), "ack of the third delivery")
	more, err := c.Receive(context.Background(), 16, 2*time.Second)
	check(len(more) == 0 && notFound(err), "nothing left after the acks (%v)", err)
}

func fifoAndDelay() {
	p := producer(nil, "P5Fifo", "P5Delay")
	defer p.GracefulStop()
	c := consumer("go-delay", "P5Delay", rmq.SUB_ALL)
	defer c.GracefulStop()
	f := consumer("go-fifo", "P5Fifo", rmq.SUB_ALL)
	defer f.GracefulStop()
	_, err := p.Send(context.Background(), message("P5Fifo", "plain"))
	fmt.Printf("plain message to a FIFO topic: %v\n", err)
	check(err != nil, "a plain message to a FIFO topic is refused")
	for i := 0; i < 3; i++ {
		m := message("P5Fifo", "f"+strconv.Itoa(i))
		m.SetMessageGroup("order-1")
		_, err := p.Send(context.Background(), m)
		must(err, "FIFO send")
	}
	got := receiveN(f, 3, 10*time.Second)
	check(eq(bodies(got, false), []string{"f0", "f1", "f2"}), "FIFO messages of one group in order: %v", bodies(got, false))
	for _, m := range got {
		check(m.GetMessageGroup() != nil && *m.GetMessageGroup() == "order-1", "the message group is kept")
		must(f.Ack(context.Background(), m), "FIFO ack")
	}
	due := time.Now().Add(2 * time.Second).Truncate(time.Millisecond)
	m := message("P5Delay", "later")
	m.SetDelayTimestamp(due)
	_, err = p.Send(context.Background(), m)
	must(err, "delayed send")
	got = receiveN(c, 1, 10*time.Second)
	now := time.Now()
	check(len(got) == 1 && string(got[0].GetBody()) == "later", "the delayed message is received")
	check(!now.Before(due), "not before its time (%v after)", now.Sub(due))
	check(got[0].GetDeliveryTimestamp() != nil && got[0].GetDeliveryTimestamp().Equal(due),
		"its delivery timestamp is kept (%v)", got[0].GetDeliveryTimestamp())
	must(c.Ack(context.Background(), got[0]), "delayed ack")
}

func transactions() {
	var checks atomic.Int32
	p := producer(&rmq.TransactionChecker{Check: func(m *rmq.MessageView) rmq.TransactionResolution {
		checks.Add(1)
		fmt.Printf("check-back for %s\n", m.GetBody())
		return rmq.COMMIT
	}}, "P5Tx")
	defer p.GracefulStop()
	c := consumer("go-tx", "P5Tx", rmq.SUB_ALL)
	defer c.GracefulStop()
	t1 := p.BeginTransaction()
	_, err := p.SendWithTransaction(context.Background(), message("P5Tx", "committed"), t1)
	must(err, "half message")
	must(t1.Commit(), "commit")
	t2 := p.BeginTransaction()
	_, err = p.SendWithTransaction(context.Background(), message("P5Tx", "rolled-back"), t2)
	must(err, "half message")
	must(t2.RollBack(), "rollback")
	t3 := p.BeginTransaction()
	_, err = p.SendWithTransaction(context.Background(), message("P5Tx", "checked"), t3)
	must(err, "half message")
	// t3 stays open: the broker asks this producer, whose checker commits.
	got := receiveN(c, 2, 10*time.Second)
	for _, m := range got {
		must(c.Ack(context.Background(), m), "ack")
	}
	check(eq(bodies(got, true), []string{"checked", "committed"}), "committed and checked-back transactions: %v", bodies(got, true))
	check(checks.Load() >= 1, "the broker checked back (%d checks)", checks.Load())
	more, err := c.Receive(context.Background(), 16, 2*time.Second)
	check(len(more) == 0 && notFound(err), "the rolled-back message is never delivered")
}

func sql92() {
	p := producer(nil, "P5Sql")
	defer p.GracefulStop()
	c := consumer("go-sql", "P5Sql", rmq.NewFilterExpressionWithType("amount > 5 AND origin = 'go'", rmq.SQL92))
	defer c.GracefulStop()
	for i := 0; i < 10; i++ {
		m := message("P5Sql", "a"+strconv.Itoa(i))
		m.AddProperty("amount", strconv.Itoa(i))
		m.AddProperty("origin", "go")
		_, err := p.Send(context.Background(), m)
		must(err, "send")
	}
	got := receiveN(c, 4, 10*time.Second)
	for _, m := range got {
		must(c.Ack(context.Background(), m), "ack")
	}
	check(eq(bodies(got, true), []string{"a6", "a7", "a8", "a9"}), "SQL92 filter: exactly the matching messages %v", bodies(got, true))
}

func main() {
	if len(os.Args) != 2 {
		fmt.Println("usage: rocketmq-go5-check GRPC_ENDPOINT")
		os.Exit(2)
	}
	endpoint = os.Args[1]
	rmq.EnableSsl = false
	// The client's own log goes to $HOME/logs/rocketmqlogs (the run script's work directory).
	rmq.ResetLogger()
	started := time.Now()
	normalAndSimpleConsumer()
	fifoAndDelay()
	transactions()
	sql92()
	fmt.Printf("go gRPC client: all checks passed in %.1f s\n", time.Since(started).Seconds())
}
