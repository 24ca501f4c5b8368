// The Java kafka-clients against Shoal's Kafka listener: admin calls, round trips with keys,
// headers and every compression (idempotent producer, the default), and a consumer group of
// three with a join and a leave under the classic protocol (range and cooperative-sticky) and,
// with the argument "consumer", under group.protocol=consumer (KIP-848).
// Run: java -cp 'kafka-java-lib/*' KafkaCheck.java BOOTSTRAP [classic|consumer]...

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.*;

public class KafkaCheck {
    static String bs;

    static void check(boolean ok, String what) {
        if (!ok) {
            System.out.println("FAILED: " + what);
            System.exit(1);
        }
        System.out.println("ok: " + what);
    }

    static Properties consumerProps(String group, String protocol, String assignor) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bs);
        p.put("group.id", group);
        p.put("auto.offset.reset", "earliest");
        p.put("key.deserializer", StringDeserializer.class.getName());
        p.put("value.deserializer", StringDeserializer.class.getName());
        p.put("group.protocol", protocol);
        if (protocol.equals("classic")) {
            p.put("partition.assignment.strategy", assignor);
            p.put("session.timeout.ms", "10000");
            p.put("heartbeat.interval.ms", "500");
        }
        return p;
    }

    public static void main(String[] args) throws Exception {
        bs = args[0];
        List<String> modes = args.length > 1 ? Arrays.asList(args).subList(1, args.length) : List.of("classic");
        Properties ap = new Properties();
        ap.put("bootstrap.servers", bs);
        try (Admin admin = Admin.create(ap)) {
            admin.createTopics(List.of(new NewTopic("JRound", 3, (short) 1))).all().get(15, TimeUnit.SECONDS);
            TopicDescription d = admin.describeTopics(List.of("JRound")).allTopicNames().get().get("JRound");
            check(d.partitions().size() == 3, "admin: topic created with 3 partitions, described");
            ConfigResource r = new ConfigResource(ConfigResource.Type.TOPIC, "JRound");
            Config c = admin.describeConfigs(List.of(r)).all().get().get(r);
            check(c.get("retention.ms") != null, "admin: topic configs described (retention.ms=" + c.get("retention.ms").value() + ")");
            check(admin.listTopics().names().get().contains("JRound"), "admin: topic listed");
        }
        roundTrip();
        headers();
        for (String mode : modes) {
            if (mode.equals("classic")) {
                group("classic", "org.apache.kafka.clients.consumer.RangeAssignor");
                group("classic", "org.apache.kafka.clients.consumer.CooperativeStickyAssignor");
            } else {
                group("consumer", null);
            }
        }
        System.out.println("java kafka-clients: passed");
    }

    static void roundTrip() throws Exception {
        for (String comp : List.of("none", "gzip", "snappy", "lz4", "zstd")) {
            Properties pp = new Properties();
            pp.put("bootstrap.servers", bs);
            pp.put("compression.type", comp);
            pp.put("key.serializer", StringSerializer.class.getName());
            pp.put("value.serializer", StringSerializer.class.getName());
            pp.put("linger.ms", "5");
            Map<String, String> sent = new HashMap<>();
            try (KafkaProducer<String, String> p = new KafkaProducer<>(pp)) {
                List<Future<RecordMetadata>> acks = new ArrayList<>();
                for (int i = 0; i < 25; i++) {
                    String k = comp + "-k" + i, v = comp + "-value-" + i;
                    ProducerRecord<String, String> rec = new ProducerRecord<>("JRound", k, v);
                    rec.headers().add("h", ("hv" + i).getBytes(StandardCharsets.UTF_8));
                    sent.put(k, v);
                    acks.add(p.send(rec));
                }
                for (Future<RecordMetadata> a : acks) a.get(15, TimeUnit.SECONDS);
            }
            check(true, "idempotent producer (the default), " + comp + ": 25 records acknowledged");
            Properties cp = consumerProps("jg-" + comp, "classic", "org.apache.kafka.clients.consumer.RangeAssignor");
            int matched = 0;
            try (KafkaConsumer<String, String> c = new KafkaConsumer<>(cp)) {
                c.subscribe(List.of("JRound"));
                long end = System.currentTimeMillis() + 30000;
                while (matched < 25 && System.currentTimeMillis() < end) {
                    for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) {
                        if (!r.key().startsWith(comp + "-")) continue;
                        Header h = r.headers().lastHeader("h");
                        String hv = h == null ? null : new String(h.value(), StandardCharsets.UTF_8);
                        String n = r.key().substring(r.key().indexOf("-k") + 2);
                        if (!sent.get(r.key()).equals(r.value()) || !("hv" + n).equals(hv)) {
                            check(false, "record " + r.key() + " came back as " + r.value() + " / " + hv);
                        }
                        matched++;
                    }
                }
                c.commitSync();
            }
            check(matched == 25, comp + ": 25 records with their keys, values and headers read back by a classic-group consumer");
        }
    }

    /** The headers of issue 45: order, a repeated name, binary, empty and null values. */
    static final String[] H_NAMES = {"seq", "codec", "bin", "dup", "dup", "empty", "null"};
    static final byte[][] H_VALUES = {
        "0".getBytes(StandardCharsets.UTF_8), "gzip".getBytes(StandardCharsets.UTF_8),
        {0, (byte) 0xff, 0, '\n', '\r'}, "first".getBytes(StandardCharsets.UTF_8),
        "second".getBytes(StandardCharsets.UTF_8), new byte[0], null};

    static String show(Iterable<Header> hs) {
        StringBuilder b = new StringBuilder();
        for (Header h : hs) b.append(h.key()).append('=').append(h.value() == null ? "null" : Arrays.toString(h.value())).append(' ');
        return b.toString();
    }

    static void headers() throws Exception {
        for (String comp : List.of("none", "gzip", "snappy", "lz4", "zstd")) {
            String topic = "JHeaders-" + comp;
            Properties pp = new Properties();
            pp.put("bootstrap.servers", bs);
            pp.put("compression.type", comp);
            pp.put("key.serializer", StringSerializer.class.getName());
            pp.put("value.serializer", StringSerializer.class.getName());
            pp.put("linger.ms", "5");
            try (KafkaProducer<String, String> p = new KafkaProducer<>(pp)) {
                List<Future<RecordMetadata>> acks = new ArrayList<>();
                for (int i = 0; i < 3; i++) {
                    ProducerRecord<String, String> rec = new ProducerRecord<>(topic, "h" + i, "v" + i);
                    for (int j = 0; j < H_NAMES.length; j++) rec.headers().add(H_NAMES[j], H_VALUES[j]);
                    acks.add(p.send(rec));
                }
                for (Future<RecordMetadata> a : acks) a.get(15, TimeUnit.SECONDS);
            }
            Properties cp = consumerProps("jh-" + comp, "classic", "org.apache.kafka.clients.consumer.RangeAssignor");
            int matched = 0;
            try (KafkaConsumer<String, String> c = new KafkaConsumer<>(cp)) {
                c.subscribe(List.of(topic));
                long end = System.currentTimeMillis() + 30000;
                while (matched < 3 && System.currentTimeMillis() < end) {
                    for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) {
                        Header[] got = r.headers().toArray();
                        boolean same = got.length == H_NAMES.length;
                        for (int j = 0; same && j < got.length; j++) {
                            same = got[j].key().equals(H_NAMES[j]) && Arrays.equals(got[j].value(), H_VALUES[j]);
                        }
                        check(same, comp + ": headers of " + r.key() + " read back exactly: " + show(r.headers()));
                        matched++;
                    }
                }
            }
            check(matched == 3, comp + ": 3 records with repeated, binary, empty and null headers read back in order");
        }
    }

    static class Member implements Runnable {
        final KafkaConsumer<String, String> c;
        final Set<Integer> owned = ConcurrentHashMap.newKeySet();
        final List<Set<Integer>> revoked = new CopyOnWriteArrayList<>();
        final AtomicBoolean stop = new AtomicBoolean();
        final Set<String> seen = ConcurrentHashMap.newKeySet();
        volatile int polled;
        final Thread t;

        Member(Properties props, String topic) {
            c = new KafkaConsumer<>(props);
            c.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                public void onPartitionsRevoked(Collection<TopicPartition> ps) {
                    Set<Integer> s = new HashSet<>();
                    for (TopicPartition p : ps) { owned.remove(p.partition()); s.add(p.partition()); }
                    if (!s.isEmpty()) revoked.add(s);
                }
                public void onPartitionsAssigned(Collection<TopicPartition> ps) {
                    for (TopicPartition p : ps) owned.add(p.partition());
                }
                public void onPartitionsLost(Collection<TopicPartition> ps) {
                    for (TopicPartition p : ps) owned.remove(p.partition());
                }
            });
            t = new Thread(this);
            t.start();
        }

        public void run() {
            while (!stop.get()) {
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                    seen.add(r.partition() + ":" + r.offset());
                    polled++;
                }
            }
            c.close();
        }

        void close() throws InterruptedException {
            stop.set(true);
            t.join();
        }
    }

    static void converged(List<Member> ms, int partitions, String what) throws InterruptedException {
        long start = System.currentTimeMillis();
        while (System.currentTimeMillis() - start < 60000) {
            Set<Integer> union = new HashSet<>();
            int total = 0, min = Integer.MAX_VALUE, max = 0;
            for (Member m : ms) {
                union.addAll(m.owned);
                total += m.owned.size();
                min = Math.min(min, m.owned.size());
                max = Math.max(max, m.owned.size());
            }
            if (union.size() == partitions && total == partitions && max - min <= 1 && min > 0) {
                List<Set<Integer>> view = new ArrayList<>();
                for (Member m : ms) view.add(new TreeSet<>(m.owned));
                check(true, what + ": " + ms.size() + " members own " + partitions + " partitions once each after "
                      + (System.currentTimeMillis() - start) + " ms " + view);
                return;
            }
            Thread.sleep(200);
        }
        List<Set<Integer>> view = new ArrayList<>();
        for (Member m : ms) view.add(new TreeSet<>(m.owned));
        check(false, what + ": no convergence " + view);
    }

    static void group(String protocol, String assignor) throws Exception {
        String name = protocol.equals("classic") ? assignor.substring(assignor.lastIndexOf('.') + 1) : "Consumer";
        String label = protocol.equals("classic") ? "classic/" + name : "group.protocol=consumer";
        String topic = "JGroup" + name;
        int partitions = 6;
        Properties ap = new Properties();
        ap.put("bootstrap.servers", bs);
        try (Admin admin = Admin.create(ap)) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get(15, TimeUnit.SECONDS);
        }
        Properties pp = new Properties();
        pp.put("bootstrap.servers", bs);
        pp.put("key.serializer", StringSerializer.class.getName());
        pp.put("value.serializer", StringSerializer.class.getName());
        int produced = 0;
        String group = "jg-" + topic;
        List<Member> ms = new ArrayList<>();
        Member leaving;
        try (KafkaProducer<String, String> p = new KafkaProducer<>(pp)) {
            ms.add(new Member(consumerProps(group, protocol, assignor), topic));
            converged(ms, partitions, label + ", first member");
            for (int i = 0; i < 2; i++) ms.add(new Member(consumerProps(group, protocol, assignor), topic));
            for (; produced < 300; produced++) p.send(new ProducerRecord<>(topic, produced % partitions, null, "m" + produced));
            converged(ms, partitions, label + ", two joined");
            List<Set<Integer>> before = new ArrayList<>();
            List<Integer> revokes = new ArrayList<>();
            for (Member m : ms.subList(0, 2)) { before.add(new HashSet<>(m.owned)); revokes.add(m.revoked.size()); }
            leaving = ms.remove(2);
            leaving.close();
            for (; produced < 600; produced++) p.send(new ProducerRecord<>(topic, produced % partitions, null, "m" + produced));
            converged(ms, partitions, label + ", one left");
            if (!name.equals("RangeAssignor")) {
                boolean kept = true;
                for (int i = 0; i < 2; i++) kept &= ms.get(i).owned.containsAll(before.get(i)) && ms.get(i).revoked.size() == revokes.get(i);
                check(kept, label + ": the remaining members kept their partitions (nothing revoked)");
            }
            p.flush();
        }
        long end = System.currentTimeMillis() + 30000;
        Set<String> seen = new HashSet<>();
        int polled = 0;
        while (System.currentTimeMillis() < end) {
            seen.clear();
            polled = leaving.polled;
            seen.addAll(leaving.seen);
            for (Member m : ms) { seen.addAll(m.seen); polled += m.polled; }
            if (seen.size() >= produced) break;
            Thread.sleep(200);
        }
        check(seen.size() == produced, label + ": all " + produced + " messages consumed (" + (polled - seen.size()) + " duplicates)");
        for (Member m : ms) m.close();
    }
}
