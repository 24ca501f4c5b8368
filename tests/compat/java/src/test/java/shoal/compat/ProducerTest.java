package shoal.compat;

import static org.junit.jupiter.api.Assertions.*;
import static shoal.compat.Clients.*;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** DefaultMQProducer against a Shoal broker. */
class ProducerTest {
    static ShoalServer server;
    static DefaultMQProducer producer;

    @BeforeAll
    static void start() throws Exception {
        server = ShoalServer.start();
        producer = producer(server, unique("PG"));
    }

    @AfterAll
    static void stop() throws Exception {
        if (producer != null) producer.shutdown();
        if (server != null) server.close();
    }

    @Test
    void syncSendWithTagsKeysAndUserProperties() throws Exception {
        String topic = unique("TopicSync");
        List<String> ids = new ArrayList<>();
        for (int i = 0; i < 10; i++) {
            Message m = new Message(topic, i % 2 == 0 ? "tagA" : "tagB", "key-" + i, utf8("sync-" + i));
            m.putUserProperty("seq", Integer.toString(i));
            m.putUserProperty("origin", "java");
            SendResult r = producer.send(m);
            assertEquals(SendStatus.SEND_OK, r.getSendStatus());
            assertNotNull(r.getMsgId());
            assertNotNull(r.getOffsetMsgId());
            assertTrue(r.getQueueOffset() >= 0);
            ids.add(r.getMsgId());
        }
        List<MessageExt> got = Read.all(server, topic, 10);
        assertEquals(10, got.size(), "every sync send is stored once");
        for (MessageExt m : got) {
            int i = Integer.parseInt(m.getUserProperty("seq"));
            assertEquals("sync-" + i, str(m.getBody()));
            assertEquals(i % 2 == 0 ? "tagA" : "tagB", m.getTags());
            assertEquals("key-" + i, m.getKeys());
            assertEquals("java", m.getUserProperty("origin"));
            assertEquals(ids.get(i), m.getMsgId(), "the client's unique id is the message id");
            assertEquals(topic, m.getTopic());
            assertTrue(m.getStoreTimestamp() >= m.getBornTimestamp() - 1000);
        }
    }

    @Test
    void asyncAndOnewaySends() throws Exception {
        String topic = unique("TopicAsync");
        producer.send(new Message(topic, utf8("warm-up"))); // creates the topic and its route
        int n = 50;
        CountDownLatch done = new CountDownLatch(n);
        AtomicInteger ok = new AtomicInteger();
        for (int i = 0; i < n; i++) {
            producer.send(new Message(topic, "async", utf8("async-" + i)), new SendCallback() {
                @Override
                public void onSuccess(SendResult r) {
                    if (r.getSendStatus() == SendStatus.SEND_OK) ok.incrementAndGet();
                    done.countDown();
                }

                @Override
                public void onException(Throwable e) {
                    e.printStackTrace();
                    done.countDown();
                }
            });
        }
        assertTrue(done.await(30, TimeUnit.SECONDS));
        assertEquals(n, ok.get());
        for (int i = 0; i < n; i++) {
            producer.sendOneway(new Message(topic, "oneway", utf8("oneway-" + i)));
        }
        List<MessageExt> got = Read.all(server, topic, 1 + 2 * n);
        assertEquals(1 + 2 * n, got.size(), () -> "every send stored once; repeated: " + repeated(got));
        assertEquals(n, got.stream().filter(m -> "oneway".equals(m.getTags())).count());
    }

    /**
     * The message ids read more than once, each with where it was read from: one stored
     * position read twice is the reader's doing, two positions are two stored copies.
     */
    static String repeated(List<MessageExt> got) {
        Map<String, List<String>> at = new HashMap<>();
        for (MessageExt m : got) {
            at.computeIfAbsent(m.getMsgId(), k -> new ArrayList<>())
                .add(m.getQueueId() + "@" + m.getQueueOffset() + " " + str(m.getBody()));
        }
        StringBuilder b = new StringBuilder();
        at.forEach((id, where) -> {
            if (where.size() > 1) b.append(id).append(" at ").append(where).append("; ");
        });
        return b.length() == 0 ? "none (" + got.size() + " distinct)" : b.toString();
    }

    @Test
    void batchSend() throws Exception {
        String topic = unique("TopicBatch");
        List<Message> batch = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
            Message m = new Message(topic, "b", "bk" + i, utf8("batch-" + i));
            m.putUserProperty("i", Integer.toString(i));
            batch.add(m);
        }
        SendResult r = producer.send(batch);
        assertEquals(SendStatus.SEND_OK, r.getSendStatus());
        assertEquals(20, r.getMsgId().split(",").length, "one id per batch item");
        List<MessageExt> got = Read.all(server, topic, 20);
        assertEquals(20, got.size());
        for (MessageExt m : got) {
            assertEquals(r.getMessageQueue().getQueueId(), m.getQueueId(), "a batch goes to one queue");
            int i = Integer.parseInt(m.getUserProperty("i"));
            assertEquals("batch-" + i, str(m.getBody()));
            assertEquals("bk" + i, m.getKeys());
            assertEquals(r.getQueueOffset() + i, m.getQueueOffset(), "batch items are consecutive");
        }
    }

    @Test
    void delayLevel() throws Exception {
        String topic = unique("TopicDelay");
        producer.send(new Message(topic, utf8("warm-up")));
        Message m = new Message(topic, "delayed", utf8("later"));
        m.setDelayTimeLevel(2); // 5 s
        long sent = System.currentTimeMillis();
        assertEquals(SendStatus.SEND_OK, producer.send(m).getSendStatus());
        List<MessageExt> early = Read.all(server, topic, 2);
        long readAt = System.currentTimeMillis();
        if (readAt - sent < 4500) {
            assertEquals(1, early.size(), "a level-2 message is not visible before 5 s");
        }
        long deadline = sent + 30_000;
        List<MessageExt> got;
        do {
            got = Read.all(server, topic, 2);
        } while (got.size() < 2 && System.currentTimeMillis() < deadline);
        MessageExt d = got.stream().filter(x -> "delayed".equals(x.getTags())).findFirst().orElseThrow();
        assertTrue(d.getStoreTimestamp() - sent >= 4900, "delivered after its delay: " + (d.getStoreTimestamp() - sent));
        assertEquals("later", str(d.getBody()));
        assertEquals(topic, d.getTopic());
    }

    @Test
    void orderedSendsWithSelector() throws Exception {
        String topic = unique("TopicOrdered");
        producer.send(new Message(topic, utf8("warm-up")));
        Map<String, Integer> queueOfKey = new HashMap<>();
        for (int i = 0; i < 30; i++) {
            String key = "order-" + (i % 3);
            Message m = new Message(topic, "o", key, utf8(key + ":" + i));
            SendResult r = producer.send(m, (mqs, msg, arg) -> mqs.get(Math.abs(arg.hashCode()) % mqs.size()), key);
            Integer q = queueOfKey.putIfAbsent(key, r.getMessageQueue().getQueueId());
            if (q != null) assertEquals(q.intValue(), r.getMessageQueue().getQueueId());
        }
        List<MessageExt> got = Read.all(server, topic, 31);
        Map<String, List<Long>> offsets = new HashMap<>();
        Map<String, List<Integer>> seqs = new HashMap<>();
        got.stream().filter(m -> "o".equals(m.getTags())).sorted((a, b) -> Long.compare(a.getQueueOffset(), b.getQueueOffset())).forEach(m -> {
            String[] kv = str(m.getBody()).split(":");
            assertEquals(queueOfKey.get(kv[0]).intValue(), m.getQueueId());
            seqs.computeIfAbsent(kv[0], k -> new ArrayList<>()).add(Integer.parseInt(kv[1]));
        });
        for (var e : seqs.entrySet()) {
            List<Integer> s = e.getValue();
            assertEquals(10, s.size());
            for (int i = 1; i < s.size(); i++) assertTrue(s.get(i - 1) < s.get(i), "queue order is send order for " + e.getKey());
        }
    }

    @Test
    void largeBodiesAreCompressedAndReadBack() throws Exception {
        String topic = unique("TopicCompressed");
        StringBuilder sb = new StringBuilder();
        while (sb.length() < 64 * 1024) sb.append("compressible text ").append(sb.length()).append('\n');
        byte[] body = utf8(sb.toString());
        SendResult r = producer.send(new Message(topic, "big", body));
        assertEquals(SendStatus.SEND_OK, r.getSendStatus());
        List<MessageExt> got = Read.all(server, topic, 1);
        assertEquals(1, got.size());
        assertArrayEquals(body, got.get(0).getBody(), "the consumer gets the uncompressed body");
        // 4.x keeps the COMPRESSED flag on the decoded message, 5.x clears it; the stored size
        // tells in both.
        assertTrue(got.get(0).getStoreSize() < body.length / 4, "stored compressed: " + got.get(0).getStoreSize());
        try (var admin = new AutoCloseableAdmin(server)) {
            MessageExt viewed = admin.a.viewMessage(topic, r.getMsgId());
            assertArrayEquals(body, viewed.getBody());
        }
    }

    @Test
    void unknownTopicWithAutoCreateOffFails() throws Exception {
        try (ShoalServer strict = ShoalServer.start(false, "")) {
            DefaultMQProducer p = producer(strict, unique("PG"));
            try {
                MQClientException e = assertThrows(MQClientException.class,
                    () -> p.send(new Message("NoSuchTopic", utf8("x"))));
                assertTrue(e.getMessage().contains("No route info of this topic"), e.getMessage());
            } finally {
                p.shutdown();
            }
        }
    }

    @Test
    void oversizedBodyIsRefusedByTheBroker() throws Exception {
        try (ShoalServer small = ShoalServer.start(true, "max_message_bytes = 65536\n")) {
            DefaultMQProducer p = producer(small, unique("PG"));
            p.setCompressMsgBodyOverHowmuch(Integer.MAX_VALUE);
            p.setRetryTimesWhenSendFailed(0);
            try {
                p.send(new Message(unique("TopicSmall"), utf8("fits")));
                byte[] body = new byte[200 * 1024];
                new Random(7).nextBytes(body);
                MQBrokerException e = assertThrows(MQBrokerException.class,
                    () -> p.send(new Message(unique("TopicSmall"), body)));
                assertEquals(13, e.getResponseCode(), "MESSAGE_ILLEGAL: " + e.getMessage());
            } finally {
                p.shutdown();
            }
        }
    }

    /** DefaultMQAdminExt with try-with-resources. */
    static final class AutoCloseableAdmin implements AutoCloseable {
        final org.apache.rocketmq.tools.admin.DefaultMQAdminExt a;

        AutoCloseableAdmin(ShoalServer s) throws Exception {
            a = admin(s);
        }

        @Override
        public void close() {
            a.shutdown();
        }
    }
}
