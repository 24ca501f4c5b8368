// The Java kafka-clients through a failover of a replicated broker group (see
// crates/shoal/tests/kafka_failover.rs): the counterpart of `kafka_cluster.py failover`.
// BOOTSTRAP lists every replica's Kafka listener. An idempotent acks=all producer sends one
// record every 10 ms to the topic's 4 partitions; a KIP-848 consumer (group.protocol=consumer)
// and a classic (cooperative-sticky) consumer, in groups of their own, read and commit every
// 200 ms. The program prints READY and waits for a line on standard input (the test SIGKILLs
// the master meanwhile), keeps sending for 8 s, then checks that every acknowledged record was
// consumed by both groups and prints the times until sends and consumption resumed.
// It prints what it checked and exits non-zero on the first failed check.
// Run: java -cp 'kafka-java-lib/*' KafkaFailover.java BOOTSTRAP TOPIC

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Predicate;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.serialization.*;

public class KafkaFailover {
    static final int PARTITIONS = 4;
    static String bs, topic;

    static void check(boolean ok, String what) {
        if (!ok) {
            System.out.println("FAILED: " + what);
            System.out.flush();
            System.exit(1);
        }
        System.out.println("ok: " + what);
    }

    /** Seconds on one clock for every time the program records. */
    static double now() {
        return System.nanoTime() / 1e9;
    }

    static String secs(Double x) {
        return x == null ? "never" : String.format("%.2f s", x);
    }

    /** One consumed record: its partition, offset, value, when and the leader epoch of its batch. */
    record Seen(int partition, long offset, String value, double at, int epoch) {}

    /** A consumer in a thread that records what it consumed and what it owns. */
    static class Member implements Runnable {
        final String protocol, group;
        final KafkaConsumer<String, String> c;
        final List<Seen> seen = Collections.synchronizedList(new ArrayList<>());
        final Set<Integer> owned = ConcurrentHashMap.newKeySet();
        final AtomicBoolean stop = new AtomicBoolean();
        volatile Exception error;
        final Thread t;

        Member(String protocol) {
            this.protocol = protocol;
            this.group = "jfo-" + protocol + "-" + UUID.randomUUID().toString().substring(0, 6);
            Properties p = new Properties();
            p.put("bootstrap.servers", bs);
            p.put("group.id", group);
            p.put("auto.offset.reset", "earliest");
            p.put("key.deserializer", StringDeserializer.class.getName());
            p.put("value.deserializer", StringDeserializer.class.getName());
            // Commits as applications usually do (every 200 ms here), so a failover re-delivers
            // only what was consumed since the last commit.
            p.put("enable.auto.commit", "true");
            p.put("auto.commit.interval.ms", "200");
            p.put("group.protocol", protocol);
            if (protocol.equals("classic")) {
                p.put("partition.assignment.strategy", CooperativeStickyAssignor.class.getName());
                p.put("session.timeout.ms", "10000");
                p.put("heartbeat.interval.ms", "500");
            }
            c = new KafkaConsumer<>(p);
            c.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                public void onPartitionsRevoked(Collection<TopicPartition> ps) {
                    for (TopicPartition tp : ps) owned.remove(tp.partition());
                }

                public void onPartitionsAssigned(Collection<TopicPartition> ps) {
                    for (TopicPartition tp : ps) owned.add(tp.partition());
                }

                public void onPartitionsLost(Collection<TopicPartition> ps) {
                    for (TopicPartition tp : ps) owned.remove(tp.partition());
                }
            });
            t = new Thread(this, "consumer-" + protocol);
            t.start();
        }

        public void run() {
            while (!stop.get()) {
                try {
                    for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                        seen.add(new Seen(r.partition(), r.offset(), r.value(), now(), r.leaderEpoch().orElse(-1)));
                    }
                } catch (Exception e) {
                    error = e;
                }
            }
        }

        Set<String> values() {
            Set<String> v = new HashSet<>();
            synchronized (seen) {
                for (Seen s : seen) v.add(s.value());
            }
            return v;
        }

        List<Seen> snapshot() {
            synchronized (seen) {
                return new ArrayList<>(seen);
            }
        }

        /** Stops the polling thread (the consumer is then used from the caller's thread). */
        void halt() throws InterruptedException {
            stop.set(true);
            t.join();
        }

        void close() throws InterruptedException {
            halt();
            try {
                c.commitSync(Duration.ofSeconds(15));
            } catch (Exception e) {
                System.out.println(protocol + ": commit at close: " + e);
            }
            c.close(CloseOptions.timeout(Duration.ofSeconds(15)));
        }
    }

    /** A partition's leader, replicas and in-sync replicas as the metadata shows them. */
    record View(int leader, List<Integer> replicas, List<Integer> isr) {}

    /**
     * Partition -> view as a listener's metadata shows it, asked again for up to 10 s until
     * `settled` holds (registrations reach the listeners' route caches within about a second).
     */
    static Map<Integer, View> replicationView(Admin admin, Predicate<Map<Integer, View>> settled) throws Exception {
        double t0 = now();
        while (true) {
            Map<Integer, View> view = new TreeMap<>();
            try {
                TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get(15, TimeUnit.SECONDS).get(topic);
                for (TopicPartitionInfo p : d.partitions()) {
                    List<Integer> rs = new ArrayList<>(), is = new ArrayList<>();
                    p.replicas().forEach(n -> rs.add(n.id()));
                    p.isr().forEach(n -> is.add(n.id()));
                    Collections.sort(rs);
                    Collections.sort(is);
                    view.put(p.partition(), new View(p.leader() == null ? -1 : p.leader().id(), rs, is));
                }
            } catch (ExecutionException | TimeoutException e) {
                System.out.println("describe " + topic + ": " + e);
            }
            if (settled.test(view) || now() - t0 > 10) return view;
            Thread.sleep(200);
        }
    }

    static boolean fullySynced(Map<Integer, View> v) {
        return v.size() == PARTITIONS && v.values().stream()
            .allMatch(x -> x.replicas().size() == 3 && x.isr().size() == 3 && x.replicas().contains(x.leader()));
    }

    /** One acknowledged record: its value, when it was sent and when it was acknowledged. */
    record Acked(String value, double sent, double at) {}

    public static void main(String[] args) throws Exception {
        bs = args[0];
        topic = args[1];
        List<Acked> acked = Collections.synchronizedList(new ArrayList<>());
        List<String> failed = Collections.synchronizedList(new ArrayList<>());
        AtomicBoolean stop = new AtomicBoolean();
        long[] sentCount = {0};
        Thread producer = new Thread(() -> {
            Properties pp = new Properties();
            pp.put("bootstrap.servers", bs);
            pp.put("acks", "all");
            pp.put("enable.idempotence", "true");
            pp.put("linger.ms", "0");
            pp.put("delivery.timeout.ms", "30000");
            pp.put("request.timeout.ms", "10000");
            pp.put("key.serializer", StringSerializer.class.getName());
            pp.put("value.serializer", StringSerializer.class.getName());
            try (KafkaProducer<String, String> p = new KafkaProducer<>(pp)) {
                int i = 0;
                while (!stop.get()) {
                    String v = "fo-" + i;
                    double sentAt = now();
                    try {
                        p.send(new ProducerRecord<>(topic, i % PARTITIONS, null, v), (md, err) -> {
                            if (err == null) acked.add(new Acked(v, sentAt, now()));
                            else failed.add(v + ": " + err);
                        });
                    } catch (Exception e) {
                        failed.add(v + ": " + e);
                    }
                    sentCount[0] = ++i;
                    Thread.sleep(10);
                }
                p.flush();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }, "producer");
        producer.start();
        Map<String, Member> members = new LinkedHashMap<>();
        for (String protocol : List.of("consumer", "classic")) members.put(protocol, new Member(protocol));
        Member m = members.get("consumer");
        double t0 = now();
        while (now() - t0 < 60 && (members.values().stream().mapToInt(x -> x.seen.size()).min().orElse(0) < 50 || acked.size() < 50)) {
            Thread.sleep(100);
        }
        for (Member x : members.values()) {
            check(x.seen.size() >= 50, x.protocol + ": records flow through the first master (" + x.seen.size()
                  + " consumed; error " + x.error + ")");
        }
        Properties ap = new Properties();
        ap.put("bootstrap.servers", bs);
        Admin admin = Admin.create(ap);
        Map<Integer, View> before = replicationView(admin, KafkaFailover::fullySynced);
        check(fullySynced(before), "every partition has 3 replicas, all in sync: " + before);
        Set<Integer> epochsBefore = new TreeSet<>();
        for (Seen s : m.snapshot()) epochsBefore.add(s.epoch());
        // More than one when a lease lapsed before the kill (a loaded machine): each master's
        // records carry its epoch.
        check(!epochsBefore.isEmpty() && Collections.min(epochsBefore) >= 1,
              "records carry the master epoch as leader epoch: " + epochsBefore);
        // Both groups commit what they read (every 200 ms) before the kill, so what is
        // delivered twice measures the failover, not a group that had not committed yet.
        Thread.sleep(1000);
        System.out.println("READY");
        System.out.flush();
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
        double killed = now();
        Thread.sleep(8000);
        stop.set(true);
        producer.join();
        List<Acked> allAcked;
        List<String> fails;
        synchronized (acked) {
            allAcked = new ArrayList<>(acked);
        }
        synchronized (failed) {
            fails = new ArrayList<>(failed);
        }
        check(allAcked.size() + fails.size() == sentCount[0],
              "the producer delivered or failed every record (" + (sentCount[0] - allAcked.size() - fails.size()) + " left)");
        Set<String> want = new HashSet<>();
        for (Acked a : allAcked) want.add(a.value());
        double t1 = now();
        while (now() - t1 < 60 && !members.values().stream().allMatch(x -> x.values().containsAll(want))) {
            Thread.sleep(200);
        }
        for (Member x : members.values()) {
            if (x.values().containsAll(want)) continue;
            // What the consumer and the leaders say, to tell a stuck consumer from a lost record.
            x.halt();
            Set<String> missing = new TreeSet<>(want);
            missing.removeAll(x.values());
            Set<Integer> where = new TreeSet<>();
            for (String v : missing) where.add(Integer.parseInt(v.substring(3)) % PARTITIONS);
            System.out.println(x.protocol + ": missing " + missing.size() + " records of partitions " + where);
            try {
                Set<TopicPartition> assigned = x.c.assignment();
                Map<TopicPartition, Long> ends = x.c.endOffsets(assigned, Duration.ofSeconds(10));
                for (TopicPartition tp : assigned) {
                    System.out.println(x.protocol + ": partition " + tp.partition() + ": position "
                                       + x.c.position(tp, Duration.ofSeconds(10)) + ", end " + ends.get(tp));
                }
            } catch (Exception e) {
                System.out.println(x.protocol + ": positions: " + e);
            }
            System.out.println(x.protocol + ": consumer error: " + x.error + "; assignment " + new TreeSet<>(x.owned));
        }
        for (Member x : members.values()) x.close();
        for (Member x : members.values()) {
            Set<String> missing = new TreeSet<>(want);
            missing.removeAll(x.values());
            check(missing.isEmpty(), x.protocol + ": every acknowledged record consumed (" + want.size()
                  + "; missing " + missing.stream().limit(5).toList() + ")");
        }
        List<Double> acksAfter = new ArrayList<>();
        for (Acked a : allAcked) if (a.at() > killed) acksAfter.add(a.at());
        Collections.sort(acksAfter);
        double gap = 0, last = killed;
        for (double at : acksAfter) {
            gap = Math.max(gap, at - last);
            last = at;
        }
        Double firstAck = allAcked.stream().filter(a -> a.sent() > killed).map(a -> a.at() - killed).min(Double::compare).orElse(null);
        Set<String> sentAfter = new HashSet<>();
        for (Acked a : allAcked) if (a.sent() > killed) sentAfter.add(a.value());
        List<String> consumed = new ArrayList<>();
        for (Member x : members.values()) {
            List<Seen> s = x.snapshot();
            Double first = s.stream().filter(r -> sentAfter.contains(r.value())).map(r -> r.at() - killed).min(Double::compare).orElse(null);
            long dup = s.size() - x.values().size();
            consumed.add(x.protocol + " consumed it " + secs(first) + " after the kill, delivered twice: " + dup);
        }
        System.out.println(String.format("failover: %d acknowledged, %d failed (%s); longest time between acknowledgements "
                                         + "after the kill %.2f s; first record sent after the kill acknowledged %s; %s",
                                         want.size(), fails.size(), fails.stream().limit(2).toList(), gap, secs(firstAck),
                                         String.join("; ", consumed)));
        check(firstAck != null, "records sent after the kill were acknowledged");
        Map<Integer, View> after = replicationView(admin, v -> v.size() == PARTITIONS && v.entrySet().stream()
            .allMatch(e -> e.getValue().leader() != before.get(e.getKey()).leader() && e.getValue().isr().contains(e.getValue().leader())));
        check(after.size() == PARTITIONS && after.entrySet().stream()
                  .allMatch(e -> e.getValue().leader() != before.get(e.getKey()).leader() && e.getValue().isr().contains(e.getValue().leader())),
              "a new leader, in sync, for every partition: " + after);
        admin.close(Duration.ofSeconds(5));
        Set<Integer> epochsAfter = new TreeSet<>();
        for (Seen s : m.snapshot()) if (sentAfter.contains(s.value())) epochsAfter.add(s.epoch());
        check(!epochsAfter.isEmpty() && Collections.min(epochsAfter) > Collections.max(epochsBefore),
              "records written after the failover carry a later leader epoch: " + epochsAfter);
        System.exit(0);
    }
}
