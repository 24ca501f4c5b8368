package shoal.grpc;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageRequestMode;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;
import org.junit.jupiter.api.Test;

/**
 * rocketmq-client 5.3 (remoting): the push consumer in POP mode (the broker assigns and
 * leases: setClientRebalance(false) after the admin set the group's request mode to POP), and
 * an SQL92 selector (MessageSelector.bySql).
 */
class RemotingPopTest {
    static DefaultMQProducer producer(Shoal s, String group) throws Exception {
        DefaultMQProducer p = new DefaultMQProducer(group);
        p.setNamesrvAddr(s.namesrv);
        p.setInstanceName(group);
        p.start();
        return p;
    }

    @Test
    void pushConsumerInPopMode() throws Exception {
        Shoal s = Shoal.shared();
        s.cli("topic", "create", "RPop", "--queues", "2");
        DefaultMQAdminExt admin = new DefaultMQAdminExt();
        admin.setNamesrvAddr(s.namesrv);
        admin.setInstanceName("pop-admin");
        admin.start();
        try {
            admin.setMessageRequestMode(s.broker, "RPop", "rpop-g", MessageRequestMode.POP, -1, 5_000);
        } finally {
            admin.shutdown();
        }
        DefaultMQProducer p = producer(s, "rpop-pg");
        Map<String, Integer> seen = new ConcurrentHashMap<>();
        CountDownLatch all = new CountDownLatch(8);
        DefaultMQPushConsumer c = new DefaultMQPushConsumer("rpop-g");
        try {
            for (int i = 0; i < 8; i++) {
                p.send(new Message("RPop", "t", ("r" + i).getBytes(StandardCharsets.UTF_8)));
            }
            c.setNamesrvAddr(s.namesrv);
            c.setInstanceName("rpop-c");
            c.setClientRebalance(false);
            c.subscribe("RPop", "*");
            c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    if (seen.merge(new String(m.getBody(), StandardCharsets.UTF_8), 1, Integer::sum) == 1) {
                        all.countDown();
                    }
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            c.start();
            assertTrue(all.await(40, TimeUnit.SECONDS), "POP consumer got " + seen + "\n" + s.log());
            assertEquals(8, seen.size());
            // The broker handed the messages out under leases: the group describes as POP.
            String describe = s.cli("group", "describe", "rpop-g", "--json");
            assertTrue(describe.contains("\"pop\""), describe);
        } finally {
            c.shutdown();
            p.shutdown();
        }
    }

    @Test
    void sql92Selector() throws Exception {
        Shoal s = Shoal.shared();
        s.cli("topic", "create", "RSql", "--queues", "1");
        DefaultMQProducer p = producer(s, "rsql-pg");
        Set<String> got = new TreeSet<>();
        CountDownLatch three = new CountDownLatch(3);
        DefaultMQPushConsumer c = new DefaultMQPushConsumer("rsql-g");
        try {
            for (int i = 0; i < 8; i++) {
                Message m = new Message("RSql", "t", ("s" + i).getBytes(StandardCharsets.UTF_8));
                m.putUserProperty("amount", String.valueOf(i));
                m.putUserProperty("region", i % 2 == 0 ? "eu" : "us");
                p.send(m);
            }
            c.setNamesrvAddr(s.namesrv);
            c.setInstanceName("rsql-c");
            c.setConsumeFromWhere(org.apache.rocketmq.common.consumer.ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            c.subscribe("RSql", MessageSelector.bySql("region = 'eu' AND amount > 1"));
            c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    synchronized (got) {
                        if (got.add(new String(m.getBody(), StandardCharsets.UTF_8))) {
                            three.countDown();
                        }
                    }
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            c.start();
            assertTrue(three.await(40, TimeUnit.SECONDS), "SQL92 consumer got " + got);
            synchronized (got) {
                assertEquals(Set.of("s2", "s4", "s6"), got);
            }
        } finally {
            c.shutdown();
            p.shutdown();
        }
    }
}
