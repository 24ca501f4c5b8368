// franz-go (Go Kafka client) against Shoal's Kafka listener: round trips with keys, headers
// and every compression (idempotent producer, franz-go's default), and a consumer group of
// three (cooperative-sticky, franz-go's default balancer) with a join and a leave.
// Usage: kafka-go-check BOOTSTRAP
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

var bs string

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

func createTopic(name string, partitions int32) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(bs))
	must(err, "client")
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	r, err := adm.CreateTopic(ctx, partitions, 1, nil, name)
	must(err, "create topic")
	must(r.Err, "create topic "+name)
}

func roundTrip() {
	codecs := map[string]kgo.CompressionCodec{
		"none": kgo.NoCompression(), "gzip": kgo.GzipCompression(), "snappy": kgo.SnappyCompression(),
		"lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression(),
	}
	names := []string{"none", "gzip", "snappy", "lz4", "zstd"}
	for _, name := range names {
		topic := "GoRound-" + name
		createTopic(topic, 3)
		p, err := kgo.NewClient(kgo.SeedBrokers(bs), kgo.ProducerBatchCompression(codecs[name]))
		must(err, "producer")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var recs []*kgo.Record
		for i := 0; i < 30; i++ {
			recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i)),
				Value: []byte(fmt.Sprintf("%s-v%d", name, i)),
				Headers: []kgo.RecordHeader{{Key: "h", Value: []byte(fmt.Sprintf("hv%d", i))}}})
		}
		must(p.ProduceSync(ctx, recs...).FirstErr(), "produce "+name)
		cancel()
		p.Close()
		check(true, "idempotent producer, %s: 30 records acknowledged", name)
		c, err := kgo.NewClient(kgo.SeedBrokers(bs), kgo.ConsumerGroup("go-"+name), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		must(err, "consumer")
		got := 0
		deadline := time.Now().Add(30 * time.Second)
		for got < 30 && time.Now().Before(deadline) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			fs := c.PollFetches(ctx)
			cancel()
			fs.EachRecord(func(r *kgo.Record) {
				var i int
				fmt.Sscanf(string(r.Key), "k%d", &i)
				if string(r.Value) != fmt.Sprintf("%s-v%d", name, i) || len(r.Headers) != 1 ||
					string(r.Headers[0].Value) != fmt.Sprintf("hv%d", i) {
					check(false, "record %s came back as %s %v", r.Key, r.Value, r.Headers)
				}
				got++
			})
		}
		c.Close()
		check(got == 30, "%s: 30 records with keys, values and headers read back by a group consumer", name)
	}
}

type member struct {
	cl    *kgo.Client
	mu    sync.Mutex
	owned map[int32]bool
	seen  map[string]bool
	done  chan struct{}
}

func newMember(group, topic string) *member {
	m := &member{owned: map[int32]bool{}, seen: map[string]bool{}, done: make(chan struct{})}
	cl, err := kgo.NewClient(kgo.SeedBrokers(bs), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.SessionTimeout(10*time.Second),
		kgo.HeartbeatInterval(500*time.Millisecond),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
			m.mu.Lock()
			for _, p := range a[topic] {
				m.owned[p] = true
			}
			m.mu.Unlock()
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, r map[string][]int32) {
			m.mu.Lock()
			for _, p := range r[topic] {
				delete(m.owned, p)
			}
			m.mu.Unlock()
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, r map[string][]int32) {
			m.mu.Lock()
			for _, p := range r[topic] {
				delete(m.owned, p)
			}
			m.mu.Unlock()
		}))
	must(err, "member")
	m.cl = cl
	go func() {
		defer close(m.done)
		for {
			fs := cl.PollFetches(context.Background())
			if fs.IsClientClosed() {
				return
			}
			fs.EachRecord(func(r *kgo.Record) {
				m.mu.Lock()
				m.seen[fmt.Sprintf("%d:%d", r.Partition, r.Offset)] = true
				m.mu.Unlock()
			})
		}
	}()
	return m
}

func (m *member) snapshot() []int32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ps []int32
	for p := range m.owned {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	return ps
}

func converged(ms []*member, partitions int, what string) {
	start := time.Now()
	for time.Since(start) < 60*time.Second {
		union, total, min, max := map[int32]bool{}, 0, 1<<30, 0
		var view [][]int32
		for _, m := range ms {
			s := m.snapshot()
			view = append(view, s)
			for _, p := range s {
				union[p] = true
			}
			total += len(s)
			if len(s) < min {
				min = len(s)
			}
			if len(s) > max {
				max = len(s)
			}
		}
		if len(union) == partitions && total == partitions && min > 0 && max-min <= 1 {
			check(true, "%s: %d members own %d partitions once each after %v %v", what, len(ms), partitions,
				time.Since(start).Round(time.Millisecond), view)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	check(false, "%s: no convergence", what)
}

func group() {
	topic, partitions := "GoGroup", 6
	createTopic(topic, int32(partitions))
	p, err := kgo.NewClient(kgo.SeedBrokers(bs), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	must(err, "producer")
	produce := func(from, to int) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var recs []*kgo.Record
		for i := from; i < to; i++ {
			recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(i % partitions), Value: []byte(fmt.Sprint(i))})
		}
		must(p.ProduceSync(ctx, recs...).FirstErr(), "produce")
	}
	ms := []*member{newMember("go-group", topic)}
	converged(ms, partitions, "franz-go cooperative-sticky, first member")
	ms = append(ms, newMember("go-group", topic), newMember("go-group", topic))
	produce(0, 300)
	converged(ms, partitions, "franz-go cooperative-sticky, two joined")
	leaving := ms[2]
	ms = ms[:2]
	leaving.cl.Close()
	<-leaving.done
	produce(300, 600)
	converged(ms, partitions, "franz-go cooperative-sticky, one left")
	p.Close()
	deadline := time.Now().Add(30 * time.Second)
	seen := map[string]bool{}
	for time.Now().Before(deadline) {
		for _, m := range append(ms, leaving) {
			m.mu.Lock()
			for k := range m.seen {
				seen[k] = true
			}
			m.mu.Unlock()
		}
		if len(seen) >= 600 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	check(len(seen) == 600, "franz-go group: all 600 messages consumed")
	for _, m := range ms {
		m.cl.Close()
	}
}

func main() {
	bs = os.Args[1]
	roundTrip()
	group()
	fmt.Println("franz-go: passed")
}
