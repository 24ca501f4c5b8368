// The Go client through a failover (`rocketmq-go-check failover NAMESRV MASTER_ADDR MASTER_PID`,
// run by tests/compat/run-failover.sh against `shoal dev --replicas 3`): a producer sending
// one message every 20 ms with SendSync and a clustering push consumer (from the first
// offset); once the consumer received 50 messages, and not sooner than 5 s after the clients
// started (FAILOVER_KILL_AFTER_S), the master's process is SIGKILLed; the producer goes on
// until sends are acknowledged again and 3 s more; then every acknowledged message (SendSync
// returned SEND_OK) must reach the consumer (duplicates allowed). Prints the time from the
// kill until the first send that began after it was acknowledged, and until the consumer
// first received a message sent after it.
//
// The client reads routes from the name server when it starts and every 30 s after that
// (`_PullNameServerInterval`, a constant of the client: no option lowers it), and until then
// sends to the dead master's address; so sends resume at the first route poll after the new
// master registered. A pull held at the master when it dies fails only at its 30 s timeout
// (a constant of the client), and the consumer pulls again 3 s later.
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
)

// One acknowledged send: when it began and when SEND_OK came back.
type ack struct {
	key              string
	started, ackedAt time.Time
}

// The longest the test waits for sends to resume after the kill: the client's 30 s route
// poll, the election and a margin.
const resumeLimit = 45 * time.Second

// The kill comes this long after the clients started, at the earliest: 5 s, or
// FAILOVER_KILL_AFTER_S seconds (to place the kill elsewhere in the route poll's period).
func killAfter() time.Duration {
	if s, err := strconv.ParseFloat(os.Getenv("FAILOVER_KILL_AFTER_S"), 64); err == nil && s >= 0 {
		return time.Duration(s * float64(time.Second))
	}
	return 5 * time.Second
}

func failover(masterAddr string, masterPid int) {
	topic := "GoFailover" + run
	broker = masterAddr
	a := adminClient()
	createTopic(a, topic, 4)
	// The master registers the new topic with the name server on its own; a consumer started
	// before that fails.
	check(waitFor(30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		mqs, err := a.FetchPublishMessageQueues(ctx, topic)
		return err == nil && len(mqs) == 4
	}), "the name server routes %s to its 4 queues", topic)
	a.Close()

	clientsStarted := time.Now()
	p := newProducer("go-failover-producer", producer.WithSendMsgTimeout(3*time.Second))
	defer p.Shutdown()

	var mu sync.Mutex
	first := map[string]time.Time{} // key → first receipt
	total := 0
	c := newConsumer("go-failover-" + run)
	must(c.Subscribe(topic, consumer.MessageSelector{},
		func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			for _, m := range msgs {
				total++
				if _, ok := first[m.GetKeys()]; !ok {
					first[m.GetKeys()] = now
				}
			}
			return consumer.ConsumeSuccess, nil
		}), "subscribe")
	must(c.Start(), "consumer start")
	defer c.Shutdown()

	var acks []ack
	var failed []time.Time // when each failed send began
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			key := "k-" + strconv.Itoa(i)
			msg := primitive.NewMessage(topic, []byte("failover "+strconv.Itoa(i))).WithKeys([]string{key})
			started := time.Now()
			r, err := p.SendSync(context.Background(), msg)
			mu.Lock()
			if err == nil && r.Status == primitive.SendOK {
				acks = append(acks, ack{key, started, time.Now()})
			} else {
				failed = append(failed, started)
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	defer func() {
		select {
		case <-done:
		default:
			close(stop)
			<-done
		}
	}()

	check(waitFor(60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(first) >= 50
	}), "the consumer receives before the kill")
	// Not sooner than 5 s after the clients started, like the C++ test (whose client polls
	// routes 3 s after it starts, then every 30 s): a kill at a point of the route poll's
	// period that does not depend on how fast the consumer started.
	time.Sleep(time.Until(clientsStarted.Add(killAfter())))
	must(syscall.Kill(masterPid, syscall.SIGKILL), "SIGKILL the master")
	killedAt := time.Now()
	fmt.Printf("master %s (pid %d) SIGKILLed %d ms after the clients started\n", masterAddr, masterPid,
		killedAt.Sub(clientsStarted).Milliseconds())

	firstAfter := func() (ack, bool) {
		for _, a := range acks {
			if a.started.After(killedAt) {
				return a, true
			}
		}
		return ack{}, false
	}
	resumed := waitFor(resumeLimit, func() bool {
		mu.Lock()
		defer mu.Unlock()
		_, ok := firstAfter()
		return ok
	})
	if resumed {
		time.Sleep(3 * time.Second)
	}
	close(stop)
	<-done
	mu.Lock()
	sendsOk, sendsFailed, sentAfter := len(acks), 0, map[string]bool{}
	for _, t := range failed {
		if t.After(killedAt) {
			sendsFailed++
		}
	}
	for _, a := range acks {
		if a.started.After(killedAt) {
			sentAfter[a.key] = true
		}
	}
	mu.Unlock()
	check(resumed, "a send that began after the kill acknowledged within %v (%d failed)", resumeLimit, sendsFailed)

	missing := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, a := range acks {
			if _, ok := first[a.key]; !ok {
				out = append(out, a.key)
			}
		}
		return out
	}
	ok := waitFor(60*time.Second, func() bool { return len(missing()) == 0 })
	m := missing()
	sort.Strings(m)
	if len(m) > 5 {
		m = m[:5]
	}
	check(ok, "every acknowledged message consumed after the failover (%d acknowledged, %d missing, e.g. %v)",
		sendsOk, len(missing()), m)

	mu.Lock()
	defer mu.Unlock()
	fa, _ := firstAfter()
	consumed := time.Time{}
	for k := range sentAfter {
		if t, ok := first[k]; ok && (consumed.IsZero() || t.Before(consumed)) {
			consumed = t
		}
	}
	fmt.Printf("failover (go client, route poll 30 s): %d acknowledged, %d sends failed after the kill; "+
		"first send acknowledged %d ms after the kill; consumer resumed %d ms after the kill "+
		"(first message sent after the kill received); received %d (%d distinct); 0 acknowledged lost\n",
		sendsOk, sendsFailed, fa.ackedAt.Sub(killedAt).Milliseconds(), consumed.Sub(killedAt).Milliseconds(),
		total, len(first))
}
