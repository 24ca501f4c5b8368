package shoal.compat;

import static org.junit.jupiter.api.Assertions.*;
import static shoal.compat.Clients.*;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CopyOnWriteArrayList;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;
import org.apache.rocketmq.tools.command.MQAdminStartup;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** DefaultMQAdminExt (rocketmq-tools) and mqadmin commands against Shoal. */
class AdminTest {
    static ShoalServer server;
    static DefaultMQProducer producer;
    static DefaultMQAdminExt admin;

    @BeforeAll
    static void start() throws Exception {
        server = ShoalServer.start();
        producer = producer(server, unique("PG"));
        admin = admin(server);
    }

    @AfterAll
    static void stop() throws Exception {
        if (admin != null) admin.shutdown();
        if (producer != null) producer.shutdown();
        if (server != null) server.close();
    }

    @Test
    void topicsAndCluster() throws Exception {
        var cluster = admin.examineBrokerClusterInfo();
        assertTrue(cluster.getClusterAddrTable().get("DefaultCluster").contains("broker-a"));
        assertEquals(server.brokerAddr, cluster.getBrokerAddrTable().get("broker-a").getBrokerAddrs().get(0L));

        String topic = unique("AdminTopic");
        admin.createAndUpdateTopicConfig(server.brokerAddr, new TopicConfig(topic, 3, 3, 6));
        await("route of the new topic", 20, () -> {
            try {
                var route = admin.examineTopicRouteInfo(topic);
                return route.getQueueDatas().size() == 1 && route.getQueueDatas().get(0).getWriteQueueNums() == 3;
            } catch (Exception e) {
                return false;
            }
        });
        var route = admin.examineTopicRouteInfo(topic);
        assertEquals(3, route.getQueueDatas().get(0).getReadQueueNums());
        assertEquals(6, route.getQueueDatas().get(0).getPerm());
        assertEquals(server.brokerAddr, route.getBrokerDatas().get(0).getBrokerAddrs().get(0L));
        assertTrue(admin.fetchAllTopicList().getTopicList().contains(topic));
        var stats = admin.examineTopicStats(topic);
        assertEquals(3, stats.getOffsetTable().size());

        admin.deleteTopicInBroker(Set.of(server.brokerAddr), topic);
        admin.deleteTopicInNameServer(Set.of(server.namesrvAddr), topic, "DefaultCluster");
        await("topic gone", 20, () -> {
            try {
                return !admin.fetchAllTopicList().getTopicList().contains(topic);
            } catch (Exception e) {
                return false;
            }
        });
        assertThrows(Exception.class, () -> admin.examineTopicRouteInfo(topic));
    }

    @Test
    void consumerStatsConnectionsRunningInfoAndReset() throws Exception {
        String topic = unique("AdminConsumed");
        String group = unique("AG");
        for (int i = 0; i < 10; i++) producer.send(new Message(topic, "t", "k" + i, utf8("before-" + i)));
        List<String> got = new CopyOnWriteArrayList<>();
        DefaultMQPushConsumer c = push(server, group);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.subscribe(topic, "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) got.add(str(m.getBody()));
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        try {
            await("10 consumed", 60, () -> got.size() >= 10);
            // Java consumers persist offsets every second (Clients.push), the first time 10 s
            // after they start.
            await("consume stats show the committed offsets", 30, () -> {
                try {
                    var cs = admin.examineConsumeStats(group);
                    long consumer = 0, broker = 0;
                    for (var e : cs.getOffsetTable().entrySet()) {
                        if (e.getKey().getTopic().equals(topic)) {
                            consumer += e.getValue().getConsumerOffset();
                            broker += e.getValue().getBrokerOffset();
                        }
                    }
                    return broker == 10 && consumer == 10;
                } catch (Exception e) {
                    return false;
                }
            });

            var conn = admin.examineConsumerConnectionInfo(group);
            assertEquals(1, conn.getConnectionSet().size());
            String clientId = conn.getConnectionSet().iterator().next().getClientId();
            assertEquals("CONSUME_PASSIVELY", conn.getConsumeType().name());
            assertEquals("CLUSTERING", conn.getMessageModel().name());
            assertTrue(conn.getSubscriptionTable().containsKey(topic));

            var running = admin.getConsumerRunningInfo(group, clientId, false);
            assertNotNull(running, "running info forwarded to the client");
            long owned = running.getMqTable().keySet().stream().filter(q -> q.getTopic().equals(topic)).count();
            assertEquals(4, owned, "the only member owns every queue");
            assertTrue(running.getSubscriptionSet().stream().anyMatch(s -> s.getTopic().equals(topic)));

            var byWho = admin.queryTopicConsumeByWho(topic);
            assertTrue(byWho.getGroupList().contains(group));

            // Reset to a time before everything: the live consumer gets all 10 again.
            long before = System.currentTimeMillis() - 3_600_000;
            got.clear();
            Map<MessageQueue, Long> reset = admin.resetOffsetByTimestamp(topic, group, before, true);
            assertEquals(4, reset.size());
            for (long o : reset.values()) assertEquals(0L, o);
            await("10 consumed again after the reset", 60, () -> got.size() >= 10);
        } finally {
            c.shutdown();
        }
    }

    @Test
    void messagesByIdAndKeyAndBrokerStats() throws Exception {
        String topic = unique("AdminMessages");
        SendResult r = producer.send(new Message(topic, "tagX", "order-42", utf8("find me")));
        MessageExt byUniq = admin.viewMessage(topic, r.getMsgId());
        assertEquals("find me", str(byUniq.getBody()));
        assertEquals("order-42", byUniq.getKeys());
        MessageExt byOffset = admin.viewMessage(topic, r.getOffsetMsgId());
        assertEquals("find me", str(byOffset.getBody()));
        var q = admin.queryMessage(topic, "order-42", 32, 0, Long.MAX_VALUE);
        assertEquals(1, q.getMessageList().size());
        assertEquals(r.getMsgId(), q.getMessageList().get(0).getMsgId());

        var kv = admin.fetchBrokerRuntimeStats(server.brokerAddr);
        Map<String, String> t = kv.getTable();
        for (String key : List.of("brokerVersionDesc", "msgPutTotalTodayNow", "msgGetTotalTodayNow",
            "putTps", "getTransferredTps", "earliestMessageTimeStamp", "brokerActive", "msgPutTotalTodayMorning")) {
            assertTrue(t.containsKey(key), "runtime stats have " + key + ": " + t.keySet());
        }
        assertTrue(Long.parseLong(t.get("msgPutTotalTodayNow")) >= 1);
    }

    /** Runs an mqadmin sub command in this JVM; returns what it printed. */
    static String mqadmin(String... args) {
        mqadminHome();
        PrintStream out = System.out;
        PrintStream err = System.err;
        ByteArrayOutputStream buf = new ByteArrayOutputStream();
        PrintStream both = new PrintStream(buf, true);
        System.setOut(both);
        System.setErr(both); // commands print their exceptions' stack traces
        try {
            MQAdminStartup.main0(args, null);
        } finally {
            System.setOut(out);
            System.setErr(err);
        }
        String text = buf.toString();
        System.out.println("mqadmin " + String.join(" ", args) + "\n" + text);
        assertFalse(text.contains("Exception"), "mqadmin " + args[0] + " failed:\n" + text);
        return text;
    }

    /** mqadmin 4.x reads ROCKETMQ_HOME/conf/logback_tools.xml: give it a minimal one. */
    static synchronized void mqadminHome() {
        if (System.getProperty("rocketmq.home.dir") != null) return;
        try {
            java.nio.file.Path home = java.nio.file.Files.createTempDirectory("mqadmin-home");
            java.nio.file.Files.createDirectories(home.resolve("conf"));
            java.nio.file.Files.writeString(home.resolve("conf/logback_tools.xml"), "<configuration/>\n");
            // Removed when the test JVM exits (deleteOnExit runs in reverse order: file first).
            home.toFile().deleteOnExit();
            home.resolve("conf").toFile().deleteOnExit();
            home.resolve("conf/logback_tools.xml").toFile().deleteOnExit();
            System.setProperty("rocketmq.home.dir", home.toString());
        } catch (java.io.IOException e) {
            throw new RuntimeException(e);
        }
    }

    @Test
    void mqadminCommands() throws Exception {
        String ns = server.namesrvAddr;
        String topic = unique("MqadminTopic");
        String out = mqadmin("updateTopic", "-n", ns, "-c", "DefaultCluster", "-t", topic, "-r", "2", "-w", "2");
        assertTrue(out.contains("create topic to " + server.brokerAddr + " success"), out);
        await("route", 20, () -> mqadmin("topicList", "-n", ns).contains(topic));
        producer.send(new Message(topic, "t", "mk", utf8("x")));
        out = mqadmin("topicRoute", "-n", ns, "-t", topic);
        assertTrue(out.contains("\"writeQueueNums\":2") || out.contains("\"writeQueueNums\" : 2"), out);
        out = mqadmin("topicStatus", "-n", ns, "-t", topic);
        assertTrue(out.contains("broker-a"), out);
        out = mqadmin("clusterList", "-n", ns);
        assertTrue(out.contains("DefaultCluster") && out.contains("broker-a"), out);
        assertFalse(out.contains("Exception"), out);
        out = mqadmin("brokerStatus", "-n", ns, "-b", server.brokerAddr);
        assertTrue(out.contains("msgPutTotalTodayNow"), out);
        out = mqadmin("queryMsgByKey", "-n", ns, "-t", topic, "-k", "mk");
        assertTrue(out.contains("#Message ID") && out.split("\n").length >= 2, out);

        String group = unique("MG");
        DefaultMQPushConsumer c = push(server, group);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.subscribe(topic, "*");
        List<String> got = new CopyOnWriteArrayList<>();
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) got.add(str(m.getBody()));
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        try {
            await("consumed", 60, () -> !got.isEmpty());
            out = mqadmin("consumerProgress", "-n", ns, "-g", group);
            assertTrue(out.contains(topic) && out.contains("broker-a"), out);
            out = mqadmin("consumerConnection", "-n", ns, "-g", group);
            assertTrue(out.contains("CONSUME_PASSIVELY") && out.contains(topic), out);
            out = mqadmin("consumerStatus", "-n", ns, "-g", group);
            assertTrue(out.contains("Same subscription in the same group of consumer") && out.contains("Rebalance OK"), out);
            out = mqadmin("resetOffsetByTime", "-n", ns, "-g", group, "-t", topic, "-s", "now");
            assertTrue(out.contains("broker-a"), out);
        } finally {
            c.shutdown();
        }
    }
}
