package shoal.compat;

import static org.junit.jupiter.api.Assertions.*;
import static shoal.compat.Clients.*;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;
import org.junit.jupiter.api.Test;

/**
 * One consumer group (AVG allocation) with Java and Shoal (`shoal consume`) members: after a
 * join and a leave of each kind (Java join, Shoal join, Java shutdown, Shoal SIGTERM, Shoal
 * SIGKILL) every queue has exactly one owner (from the members' own running info, read with
 * DefaultMQAdminExt), and every message sent during the test is consumed.
 */
class MixedGroupTest {
    static final int QUEUES = 8;

    /** Collected by the Java members: body -> deliveries. */
    final Map<String, AtomicInteger> javaGot = new ConcurrentHashMap<>();

    DefaultMQPushConsumer javaMember(ShoalServer s, String group, String topic) throws Exception {
        DefaultMQPushConsumer c = push(s, group);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.subscribe(topic, "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) javaGot.computeIfAbsent(str(m.getBody()), k -> new AtomicInteger()).incrementAndGet();
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        return c;
    }

    Process shoalMember(ShoalServer s, String group, String topic, String name) throws Exception {
        ProcessBuilder pb = new ProcessBuilder(ShoalServer.bin(), "consume", topic, "--group", group, "--from", "first",
            "--json", "--namesrv", s.namesrvAddr, "--instance", name);
        pb.redirectOutput(s.dir.resolve(name + ".out").toFile());
        pb.redirectError(s.dir.resolve(name + ".err").toFile());
        return pb.start();
    }

    /** Owners per queue of `topic`, from every member's running info. */
    static Map<Integer, List<String>> owners(DefaultMQAdminExt admin, String group, String topic) throws Exception {
        Map<Integer, List<String>> owners = new TreeMap<>();
        var conns = admin.examineConsumerConnectionInfo(group);
        for (var conn : conns.getConnectionSet()) {
            var info = admin.getConsumerRunningInfo(group, conn.getClientId(), false);
            for (var e : info.getMqTable().entrySet()) {
                MessageQueue q = e.getKey();
                if (q.getTopic().equals(topic) && !e.getValue().isDroped()) {
                    owners.computeIfAbsent(q.getQueueId(), k -> new ArrayList<>()).add(conn.getClientId());
                }
            }
        }
        return owners;
    }

    /** Waits until every queue has exactly one owner and there are `members` members. */
    static void awaitExclusiveAndComplete(DefaultMQAdminExt admin, String group, String topic, int members, String step)
        throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(90);
        Map<Integer, List<String>> last = null;
        int lastMembers = -1;
        while (System.nanoTime() < deadline) {
            try {
                lastMembers = admin.examineConsumerConnectionInfo(group).getConnectionSet().size();
                last = owners(admin, group, topic);
                boolean ok = lastMembers == members && last.size() == QUEUES
                    && last.values().stream().allMatch(o -> o.size() == 1);
                Set<String> distinct = new HashSet<>();
                last.values().forEach(distinct::addAll);
                if (ok && distinct.size() == Math.min(members, QUEUES)) {
                    System.out.println(step + ": exclusive and complete: " + last);
                    return;
                }
            } catch (Exception e) {
                // a member that just left may not answer; look again
            }
            Thread.sleep(200);
        }
        fail(step + ": no exclusive and complete assignment within 90 s (" + lastMembers + " members): " + last);
    }

    static final Pattern BODY = Pattern.compile("\"body\":\"([^\"]*)\"");

    /** Bodies printed by a `shoal consume --json` member. */
    static List<String> shoalGot(Path out) throws Exception {
        List<String> bodies = new ArrayList<>();
        if (!Files.exists(out)) return bodies;
        for (String line : Files.readAllLines(out, StandardCharsets.UTF_8)) {
            Matcher m = BODY.matcher(line);
            if (m.find()) bodies.add(m.group(1));
        }
        return bodies;
    }

    @Test
    void javaAndShoalMembersShareAGroup() throws Exception {
        try (ShoalServer s = ShoalServer.start()) {
            String topic = unique("MixedTopic");
            String group = unique("MIXED");
            DefaultMQAdminExt admin = admin(s);
            DefaultMQProducer producer = producer(s, unique("PG"));
            admin.createAndUpdateTopicConfig(s.brokerAddr, new TopicConfig(topic, QUEUES, QUEUES, 6));
            await("route", 20, () -> {
                try {
                    return producer.fetchPublishMessageQueues(topic).size() == QUEUES;
                } catch (Exception e) {
                    return false;
                }
            });
            AtomicBoolean sending = new AtomicBoolean(true);
            AtomicInteger sent = new AtomicInteger();
            Thread sender = new Thread(() -> {
                while (sending.get()) {
                    try {
                        int i = sent.get();
                        producer.send(new Message(topic, "m", utf8("m-" + i)));
                        sent.incrementAndGet();
                        Thread.sleep(10);
                    } catch (Exception e) {
                        // retried with the same number
                    }
                }
            });
            sender.start();
            List<Process> shoal = new ArrayList<>();
            try {
                DefaultMQPushConsumer j1 = javaMember(s, group, topic);
                awaitExclusiveAndComplete(admin, group, topic, 1, "java j1 joined");
                shoal.add(shoalMember(s, group, topic, "s1"));
                awaitExclusiveAndComplete(admin, group, topic, 2, "shoal s1 joined");
                DefaultMQPushConsumer j2 = javaMember(s, group, topic);
                awaitExclusiveAndComplete(admin, group, topic, 3, "java j2 joined");
                shoal.add(shoalMember(s, group, topic, "s2"));
                awaitExclusiveAndComplete(admin, group, topic, 4, "shoal s2 joined");
                shoal.add(shoalMember(s, group, topic, "s3"));
                awaitExclusiveAndComplete(admin, group, topic, 5, "shoal s3 joined");
                j1.shutdown();
                awaitExclusiveAndComplete(admin, group, topic, 4, "java j1 left (shutdown)");
                shoal.get(0).destroy(); // SIGTERM: leaves gracefully
                assertTrue(shoal.get(0).waitFor(30, TimeUnit.SECONDS));
                awaitExclusiveAndComplete(admin, group, topic, 3, "shoal s1 left (SIGTERM)");
                shoal.get(1).destroyForcibly(); // SIGKILL: the broker sees the connection close
                assertTrue(shoal.get(1).waitFor(30, TimeUnit.SECONDS));
                awaitExclusiveAndComplete(admin, group, topic, 2, "shoal s2 killed (SIGKILL)");

                sending.set(false);
                sender.join(30_000);
                int total = sent.get();
                Set<String> want = new HashSet<>();
                for (int i = 0; i < total; i++) want.add("m-" + i);
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
                Set<String> got = new HashSet<>();
                Map<String, Integer> deliveries = new HashMap<>();
                while (System.nanoTime() < deadline) {
                    got.clear();
                    deliveries.clear();
                    javaGot.forEach((k, v) -> deliveries.merge(k, v.get(), Integer::sum));
                    for (String n : List.of("s1", "s2", "s3")) {
                        for (String b : shoalGot(s.dir.resolve(n + ".out"))) deliveries.merge(b, 1, Integer::sum);
                    }
                    got.addAll(deliveries.keySet());
                    if (got.containsAll(want)) break;
                    Thread.sleep(500);
                }
                Set<String> missing = new HashSet<>(want);
                missing.removeAll(got);
                long dups = deliveries.values().stream().filter(v -> v > 1).count();
                System.out.println("mixed group: sent " + total + ", consumed " + got.size() + " distinct, "
                    + dups + " delivered more than once (at-least-once across hand-overs and the SIGKILL)");
                assertTrue(missing.isEmpty(), "every message consumed; missing " + missing.size() + ": "
                    + missing.stream().limit(20).toList());
                j2.shutdown();
            } finally {
                sending.set(false);
                for (Process p : shoal) {
                    p.destroy();
                    if (!p.waitFor(20, TimeUnit.SECONDS)) p.destroyForcibly();
                }
                producer.shutdown();
                admin.shutdown();
            }
        }
    }
}
