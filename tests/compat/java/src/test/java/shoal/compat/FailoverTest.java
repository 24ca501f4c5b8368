package shoal.compat;

import static org.junit.jupiter.api.Assertions.*;
import static shoal.compat.Clients.*;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;
import org.junit.jupiter.api.Test;

/**
 * The official clients through a failover: a replicated group of three (`shoal dev --replicas
 * 3`), a producer sending every 20 ms, a push consumer and a lite pull consumer in groups of
 * their own; the master is SIGKILLed under load, the producer keeps sending, and every
 * acknowledged message must reach each consumer afterwards (duplicates allowed). Prints the time
 * from the kill until sends and consumption resume, per client.
 *
 * Official clients learn routes by polling the name server every `pollNameServerInterval`
 * (30 s by default); the test uses `-Dfailover.pollMs` (default 1000 ms). A pull held at the
 * master when it dies is answered by nobody: 5.x clients fail it when the connection closes,
 * 4.9 clients wait for its timeout (`consumerTimeoutMillisWhenSuspend`, 30 s: a constant of the
 * push consumer; the lite pull consumer's must exceed its broker suspend time, 20 s).
 */
class FailoverTest {
    static final long POLL_MS = Long.getLong("failover.pollMs", 1000L);
    static final long AFTER_KILL_MS = Long.getLong("failover.sendAfterKillMs", 8000L) + POLL_MS;

    /** Messages one consumer received: key → first receipt (System.nanoTime()). */
    static final class Seen {
        final Map<String, Long> first = new ConcurrentHashMap<>();
        final AtomicInteger total = new AtomicInteger();

        void got(MessageExt m) {
            total.incrementAndGet();
            first.putIfAbsent(m.getKeys(), System.nanoTime());
        }
    }

    /** An acknowledged send: its key, when the send began, when it was acknowledged. */
    record Ack(String key, String msgId, long startedAt, long ackedAt) {}

    @Test
    void masterKilledUnderLoad() throws Exception {
        String topic = unique("TopicFailover");
        try (ReplicatedGroup group = ReplicatedGroup.start()) {
            DefaultMQAdminExt admin = new DefaultMQAdminExt(5000);
            admin.setNamesrvAddr(group.namesrvAddr);
            admin.setInstanceName(unique("admin"));
            admin.start();
            String master;
            try {
                master = awaitMaster(admin, null, group);
                admin.createAndUpdateTopicConfig(master, new TopicConfig(topic, 4, 4, 6));
                await("the topic's route", 30, () -> {
                    try {
                        return !admin.examineTopicRouteInfo(topic).getQueueDatas().isEmpty();
                    } catch (Exception e) {
                        return false;
                    }
                });
            } finally {
                admin.shutdown();
            }

            DefaultMQProducer producer = new DefaultMQProducer(unique("PG"));
            producer.setNamesrvAddr(group.namesrvAddr);
            producer.setInstanceName(unique("p"));
            producer.setPollNameServerInterval((int) POLL_MS);
            producer.setSendLatencyFaultEnable(true);
            producer.setRetryTimesWhenSendFailed(2);
            producer.setSendMsgTimeout(3000);
            producer.start();

            Seen pushSeen = new Seen();
            DefaultMQPushConsumer push = new DefaultMQPushConsumer(unique("CG"));
            push.setNamesrvAddr(group.namesrvAddr);
            push.setInstanceName(unique("c"));
            push.setPollNameServerInterval((int) POLL_MS);
            push.setPersistConsumerOffsetInterval(1000);
            push.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            push.subscribe(topic, "*");
            push.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                msgs.forEach(pushSeen::got);
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            push.start();

            Seen liteSeen = new Seen();
            DefaultLitePullConsumer lite = new DefaultLitePullConsumer(unique("LG"));
            lite.setNamesrvAddr(group.namesrvAddr);
            lite.setInstanceName(unique("l"));
            lite.setPollNameServerInterval((int) POLL_MS);
            lite.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            lite.setAutoCommit(true);
            lite.subscribe(topic, "*");
            lite.start();
            AtomicBoolean running = new AtomicBoolean(true);
            Thread liteLoop = new Thread(() -> {
                while (running.get()) {
                    lite.poll(200).forEach(liteSeen::got);
                }
            }, "lite-pull");
            liteLoop.start();

            List<Ack> acks = new ArrayList<>();
            List<Long> failedAt = new ArrayList<>();
            AtomicBoolean sending = new AtomicBoolean(true);
            Thread sender = new Thread(() -> {
                for (int i = 0; sending.get(); i++) {
                    String key = "k-" + i;
                    long started = System.nanoTime();
                    try {
                        SendResult r = producer.send(new Message(topic, "t", key, utf8("failover " + i)));
                        if (r.getSendStatus() == SendStatus.SEND_OK) {
                            synchronized (acks) {
                                acks.add(new Ack(key, r.getMsgId(), started, System.nanoTime()));
                            }
                        } else {
                            synchronized (acks) {
                                failedAt.add(started);
                            }
                        }
                    } catch (Exception e) {
                        synchronized (acks) {
                            failedAt.add(started);
                        }
                    }
                    try {
                        Thread.sleep(20);
                    } catch (InterruptedException e) {
                        return;
                    }
                }
            }, "sender");

            long killedAt;
            Set<String> acked = new TreeSet<>();
            try {
                sender.start();
                await("both consumers receiving before the kill", 60,
                    () -> pushSeen.first.size() >= 50 && liteSeen.first.size() >= 50);
                group.kill(master);
                killedAt = System.nanoTime();
                Thread.sleep(AFTER_KILL_MS);
                sending.set(false);
                sender.join(30_000);
                synchronized (acks) {
                    for (Ack a : acks) acked.add(a.key());
                }
                assertTrue(acks.stream().anyMatch(a -> a.startedAt() > killedAt),
                    "a send acknowledged after the kill\n" + group.log());
                for (Seen s : List.of(pushSeen, liteSeen)) {
                    String who = s == pushSeen ? "push consumer" : "lite pull consumer";
                    await(who + " consuming every acknowledged message", 90,
                        () -> s.first.keySet().containsAll(acked));
                }
            } finally {
                sending.set(false);
                running.set(false);
                liteLoop.join(10_000);
                lite.shutdown();
                push.shutdown();
                producer.shutdown();
            }

            String newMaster;
            DefaultMQAdminExt admin2 = new DefaultMQAdminExt(5000);
            admin2.setNamesrvAddr(group.namesrvAddr);
            admin2.setInstanceName(unique("admin"));
            admin2.start();
            try {
                newMaster = awaitMaster(admin2, master, group);
            } finally {
                admin2.shutdown();
            }
            long firstAckAfter = acks.stream().filter(a -> a.startedAt() > killedAt)
                .mapToLong(Ack::ackedAt).min().orElseThrow();
            long failedAfter = failedAt.stream().filter(t -> t > killedAt).count();
            Set<String> sentAfter = new TreeSet<>();
            acks.stream().filter(a -> a.startedAt() > killedAt).forEach(a -> sentAfter.add(a.key()));
            System.out.printf("failover (client%d, pollNameServerInterval %d ms): master %s SIGKILLed, new master %s; "
                    + "%d acknowledged, %d sends failed after the kill; first send acknowledged %d ms after the kill; "
                    + "push consumer resumed %d ms, lite pull %d ms after the kill (first message sent after the kill "
                    + "received); push received %d (%d distinct), lite pull %d (%d distinct); 0 acknowledged lost%n",
                major(), POLL_MS, master, newMaster, acked.size(), failedAfter, ms(firstAckAfter - killedAt),
                ms(resumed(pushSeen, sentAfter) - killedAt), ms(resumed(liteSeen, sentAfter) - killedAt),
                pushSeen.total.get(), pushSeen.first.size(), liteSeen.total.get(), liteSeen.first.size());
        }
    }

    /** When `s` first received a message sent after the kill. */
    static long resumed(Seen s, Set<String> sentAfter) {
        return sentAfter.stream().map(s.first::get).filter(t -> t != null).mapToLong(Long::longValue).min()
            .orElseThrow();
    }

    static long ms(long nanos) {
        return TimeUnit.NANOSECONDS.toMillis(nanos);
    }

    /** The address of the group's brokerId 0 in the name server's cluster view, once it is not `old`. */
    static String awaitMaster(DefaultMQAdminExt admin, String old, ReplicatedGroup group) throws Exception {
        String[] found = new String[1];
        try {
            await("a master (brokerId 0) other than " + old, 60, () -> {
                try {
                    var data = admin.examineBrokerClusterInfo().getBrokerAddrTable().get("broker-a");
                    String addr = data == null ? null : data.getBrokerAddrs().get(0L);
                    if (addr != null && !addr.equals(old) && group.pids.containsKey(addr)) {
                        found[0] = addr;
                        return true;
                    }
                    return false;
                } catch (Exception e) {
                    return false;
                }
            });
        } catch (AssertionError e) {
            throw new AssertionError(e.getMessage() + "\n" + group.log(), e);
        }
        return found[0];
    }
}
