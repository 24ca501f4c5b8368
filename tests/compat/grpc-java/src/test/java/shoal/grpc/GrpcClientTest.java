package shoal.grpc;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;
import org.apache.rocketmq.remoting.protocol.subscription.SubscriptionGroupConfig;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;
import org.junit.jupiter.api.Test;

/**
 * rocketmq-client-java 5.x on Shoal's gRPC endpoint: Producer (normal, FIFO, delay,
 * transactional with check-back), SimpleConsumer (receive, ack, change invisible duration,
 * redelivery after a missed ack, SQL92), PushConsumer (concurrent and FIFO).
 */
class GrpcClientTest {
    private static final ClientServiceProvider PROVIDER = ClientServiceProvider.loadService();

    static ClientConfiguration config(Shoal s) {
        return ClientConfiguration.newBuilder()
            .setEndpoints(s.grpc)
            .enableSsl(false)
            .setRequestTimeout(Duration.ofSeconds(10))
            .build();
    }

    static Producer producer(Shoal s, String... topics) throws Exception {
        return PROVIDER.newProducerBuilder().setClientConfiguration(config(s)).setTopics(topics).build();
    }

    static Message message(String topic, String body) {
        return PROVIDER.newMessageBuilder().setTopic(topic).setTag("t").setKeys("k-" + body)
            .setBody(body.getBytes(StandardCharsets.UTF_8)).build();
    }

    static String body(MessageView m) {
        return StandardCharsets.UTF_8.decode(m.getBody()).toString();
    }

    static SimpleConsumer simple(Shoal s, String group, String topic, FilterExpression f) throws Exception {
        return PROVIDER.newSimpleConsumerBuilder().setClientConfiguration(config(s)).setConsumerGroup(group)
            .setAwaitDuration(Duration.ofSeconds(2))
            .setSubscriptionExpressions(Map.of(topic, f)).build();
    }

    /** Receives until `n` messages came or 20 s passed. */
    static List<MessageView> receiveN(SimpleConsumer c, int n, Duration invisible) throws Exception {
        List<MessageView> out = new ArrayList<>();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        while (out.size() < n && System.nanoTime() < deadline) {
            out.addAll(c.receive(16, invisible));
        }
        return out;
    }

    @Test
    void producerAndSimpleConsumer() throws Exception {
        Shoal s = Shoal.shared();
        s.cli("topic", "create", "GNormal", "--queues", "2");
        try (Producer p = producer(s, "GNormal");
             SimpleConsumer c = simple(s, "g-simple", "GNormal", new FilterExpression("*", FilterExpressionType.TAG))) {
            for (int i = 0; i < 4; i++) {
                SendReceipt r = p.send(message("GNormal", "m" + i));
                assertFalse(r.getMessageId().toString().isEmpty());
            }
            List<MessageView> got = receiveN(c, 4, Duration.ofSeconds(2));
            assertEquals(4, got.size(), s.log());
            List<String> bodies = new ArrayList<>();
            for (MessageView m : got) {
                bodies.add(body(m));
                assertEquals(1, m.getDeliveryAttempt());
                assertEquals("t", m.getTag().orElse(""));
            }
            Collections.sort(bodies);
            assertEquals(List.of("m0", "m1", "m2", "m3"), bodies);
            // m0, m1 acked; m2's lease changed, then acked; m3's ack missed: it comes again.
            MessageView m3 = null;
            for (MessageView m : got) {
                switch (body(m)) {
                    case "m2" -> {
                        c.changeInvisibleDuration(m, Duration.ofSeconds(30));
                        c.ack(m);
                    }
                    case "m3" -> m3 = m;
                    default -> c.ack(m);
                }
            }
            List<MessageView> again = receiveN(c, 1, Duration.ofSeconds(10));
            assertEquals(1, again.size(), s.log());
            assertEquals("m3", body(again.get(0)));
            assertEquals(2, again.get(0).getDeliveryAttempt());
            c.ack(again.get(0));
            MessageView stale = m3;
            assertThrows(Exception.class, () -> c.ack(stale), "the lapsed receipt is refused");
        }
    }

    @Test
    void fifoDelayAndTypeChecks() throws Exception {
        Shoal s = Shoal.shared();
        s.cli("topic", "create", "GFifo", "--queues", "2", "--message-type", "FIFO");
        s.cli("topic", "create", "GDelay", "--queues", "1", "--message-type", "DELAY");
        try (Producer p = producer(s, "GFifo", "GDelay");
             SimpleConsumer c = simple(s, "g-delay", "GDelay", new FilterExpression("*", FilterExpressionType.TAG))) {
            // A plain message to a FIFO topic is refused (the client checks the route's types).
            assertThrows(Exception.class, () -> p.send(message("GFifo", "plain")));
            for (int i = 0; i < 3; i++) {
                p.send(PROVIDER.newMessageBuilder().setTopic("GFifo").setMessageGroup("order-1")
                    .setBody(("f" + i).getBytes(StandardCharsets.UTF_8)).build());
            }
            long due = System.currentTimeMillis() + 2_000;
            p.send(PROVIDER.newMessageBuilder().setTopic("GDelay").setDeliveryTimestamp(due)
                .setBody("later".getBytes(StandardCharsets.UTF_8)).build());
            List<MessageView> got = receiveN(c, 1, Duration.ofSeconds(10));
            assertEquals(1, got.size(), s.log());
            assertTrue(System.currentTimeMillis() >= due, "delivered before its time");
            assertEquals("later", body(got.get(0)));
            c.ack(got.get(0));
        }
    }

    @Test
    void transactionsCommittedAndCheckedBack() throws Exception {
        Shoal s = Shoal.shared();
        s.cli("topic", "create", "GTx", "--queues", "1", "--message-type", "TRANSACTION");
        AtomicInteger checks = new AtomicInteger();
        try (Producer p = PROVIDER.newProducerBuilder().setClientConfiguration(config(s)).setTopics("GTx")
                 .setTransactionChecker(m -> {
                     checks.incrementAndGet();
                     return TransactionResolution.COMMIT;
                 }).build();
             SimpleConsumer c = simple(s, "g-tx", "GTx", new FilterExpression("*", FilterExpressionType.TAG))) {
            Transaction t1 = p.beginTransaction();
            p.send(message("GTx", "committed"), t1);
            t1.commit();
            Transaction t2 = p.beginTransaction();
            p.send(message("GTx", "checked"), t2);
            // t2 is left open: the broker asks the producer, whose checker commits.
            List<MessageView> got = receiveN(c, 2, Duration.ofSeconds(10));
            List<String> bodies = new ArrayList<>();
            for (MessageView m : got) {
                bodies.add(body(m));
                c.ack(m);
            }
            Collections.sort(bodies);
            assertEquals(List.of("checked", "committed"), bodies, s.log());
            assertTrue(checks.get() >= 1);
        }
    }

    @Test
    void sql92SimpleConsumer() throws Exception {
        Shoal s = Shoal.shared();
        s.cli("topic", "create", "GSql", "--queues", "1");
        try (Producer p = producer(s, "GSql");
             SimpleConsumer c = simple(s, "g-sql", "GSql", new FilterExpression("amount > 5", FilterExpressionType.SQL92))) {
            for (int i = 0; i < 10; i++) {
                p.send(PROVIDER.newMessageBuilder().setTopic("GSql").addProperty("amount", String.valueOf(i))
                    .setBody(("a" + i).getBytes(StandardCharsets.UTF_8)).build());
            }
            List<MessageView> got = receiveN(c, 4, Duration.ofSeconds(10));
            List<String> bodies = new ArrayList<>();
            for (MessageView m : got) {
                bodies.add(body(m));
                c.ack(m);
            }
            Collections.sort(bodies);
            assertEquals(List.of("a6", "a7", "a8", "a9"), bodies);
        }
    }

    @Test
    void pushConsumersConcurrentAndFifo() throws Exception {
        Shoal s = Shoal.shared();
        s.cli("topic", "create", "GPush", "--queues", "2");
        s.cli("topic", "create", "GPushFifo", "--queues", "2", "--message-type", "FIFO");
        // A FIFO consumer group (consumeMessageOrderly), as mqadmin updateSubGroup -o true makes it.
        DefaultMQAdminExt admin = new DefaultMQAdminExt();
        admin.setNamesrvAddr(s.namesrv);
        admin.setInstanceName("grpc-compat-admin");
        admin.start();
        try {
            SubscriptionGroupConfig g = new SubscriptionGroupConfig();
            g.setGroupName("g-push-fifo");
            g.setConsumeMessageOrderly(true);
            admin.createAndUpdateSubscriptionGroupConfig(s.broker, g);
        } finally {
            admin.shutdown();
        }
        Map<String, Integer> seen = new ConcurrentHashMap<>();
        CountDownLatch all = new CountDownLatch(10);
        List<String> order = new CopyOnWriteArrayList<>();
        CountDownLatch fifo = new CountDownLatch(5);
        try (Producer p = producer(s, "GPush", "GPushFifo");
             PushConsumer c = PROVIDER.newPushConsumerBuilder().setClientConfiguration(config(s))
                 .setConsumerGroup("g-push")
                 .setSubscriptionExpressions(Map.of("GPush", new FilterExpression("*", FilterExpressionType.TAG)))
                 .setMessageListener(m -> {
                     seen.merge(body(m), 1, Integer::sum);
                     all.countDown();
                     return ConsumeResult.SUCCESS;
                 }).build();
             PushConsumer f = PROVIDER.newPushConsumerBuilder().setClientConfiguration(config(s))
                 .setConsumerGroup("g-push-fifo")
                 .setSubscriptionExpressions(Map.of("GPushFifo", new FilterExpression("*", FilterExpressionType.TAG)))
                 .setMessageListener(m -> {
                     order.add(body(m));
                     fifo.countDown();
                     return ConsumeResult.SUCCESS;
                 }).build()) {
            for (int i = 0; i < 10; i++) {
                p.send(message("GPush", "p" + i));
            }
            for (int i = 0; i < 5; i++) {
                p.send(PROVIDER.newMessageBuilder().setTopic("GPushFifo").setMessageGroup("g")
                    .setBody(("o" + i).getBytes(StandardCharsets.UTF_8)).build());
            }
            assertTrue(all.await(30, TimeUnit.SECONDS), "push consumer got " + seen + "\n" + s.log());
            assertTrue(fifo.await(30, TimeUnit.SECONDS), "FIFO push consumer got " + order + "\n" + s.log());
            assertEquals(10, seen.size());
            assertEquals(List.of("o0", "o1", "o2", "o3", "o4"), order.subList(0, 5));
        }
    }
}
