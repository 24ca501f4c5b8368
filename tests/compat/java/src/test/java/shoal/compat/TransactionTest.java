package shoal.compat;

import static org.junit.jupiter.api.Assertions.*;
import static shoal.compat.Clients.*;

import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.junit.jupiter.api.Test;

/**
 * TransactionMQProducer against a Shoal broker: commit and rollback after the local
 * transaction, and an UNKNOW outcome checked back by the broker (CHECK_TRANSACTION_STATE,
 * answered by checkLocalTransaction: unknown twice, then commit).
 */
class TransactionTest {
    @Test
    void transactionMQProducer() throws Exception {
        // Checks every 500 ms, and enough of them that a slow consumer start cannot use them
        // up (after transaction_check_max checks the broker discards the half message, as
        // RocketMQ's does; at 15, CI once spent them all before the test allowed the commit).
        String config = "transaction_check_interval_ms = 500\ntransaction_timeout_ms = 1000\n"
            + "transaction_check_max = 100000\n";
        try (ShoalServer s = ShoalServer.start(true, config)) {
            String topic = unique("TxTopic");
            Map<String, AtomicInteger> checked = new ConcurrentHashMap<>();
            List<String> checkedTopics = new CopyOnWriteArrayList<>();
            // The undecided message stays UNKNOW until the test has seen that it is invisible
            // (checks come every 500 ms; a consumer can take longer than that to start).
            AtomicBoolean mayCommit = new AtomicBoolean(false);
            AtomicInteger checksAtCommit = new AtomicInteger(-1);
            TransactionMQProducer p = new TransactionMQProducer(unique("TXPG"));
            p.setNamesrvAddr(s.namesrvAddr);
            p.setInstanceName(unique("tx"));
            p.setHeartbeatBrokerInterval(1000);
            p.setTransactionListener(new TransactionListener() {
                @Override
                public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                    switch (msg.getTags()) {
                        case "commit":
                            return LocalTransactionState.COMMIT_MESSAGE;
                        case "rollback":
                            return LocalTransactionState.ROLLBACK_MESSAGE;
                        default:
                            return LocalTransactionState.UNKNOW;
                    }
                }

                @Override
                public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                    int n = checked.computeIfAbsent(str(msg.getBody()), k -> new AtomicInteger()).incrementAndGet();
                    checkedTopics.add(msg.getTopic());
                    // Unknown at the first two checks and until the test allows it, then committed.
                    if (n >= 3 && mayCommit.get()) {
                        checksAtCommit.compareAndSet(-1, n);
                        return LocalTransactionState.COMMIT_MESSAGE;
                    }
                    return LocalTransactionState.UNKNOW;
                }
            });
            p.start();

            List<String> got = new CopyOnWriteArrayList<>();
            DefaultMQPushConsumer c = push(s, unique("TXCG"));
            c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            c.subscribe(topic, "*");
            c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt m : msgs) got.add(str(m.getBody()));
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            try {
                for (String kind : List.of("commit", "rollback", "unknown")) {
                    TransactionSendResult r = p.sendMessageInTransaction(new Message(topic, kind, utf8("tx-" + kind)), null);
                    assertEquals(SendStatus.SEND_OK, r.getSendStatus(), kind);
                    assertNotNull(r.getTransactionId());
                }
                c.start();
                await("the committed message", 60, () -> got.contains("tx-commit"));
                await("a check answered UNKNOW", 60, () -> checked.containsKey("tx-unknown"));
                assertFalse(got.contains("tx-unknown"), "an undecided half message is invisible");
                mayCommit.set(true);
                try {
                    await("the unknown one, committed by the broker's check", 60, () -> got.contains("tx-unknown"));
                } catch (AssertionError e) {
                    throw new AssertionError(e.getMessage() + "; checks so far: " + checked
                        + "; broker log:\n" + s.brokerLog(), e);
                }
                Thread.sleep(2000);
                assertEquals(1, got.stream().filter("tx-commit"::equals).count(), "committed once: " + got);
                assertEquals(1, got.stream().filter("tx-unknown"::equals).count(), "committed once: " + got);
                assertFalse(got.contains("tx-rollback"), "rolled back: never delivered");
                assertTrue(checksAtCommit.get() >= 3, "unknown at the first two checks: " + checked);
                assertEquals(checksAtCommit.get(), checked.get("tx-unknown").get(),
                    "checked until committed, never after: " + checked);
                assertFalse(checked.containsKey("tx-commit"), "a decided transaction is not checked: " + checked);
                assertTrue(checkedTopics.stream().allMatch(topic::equals), "the check shows the real topic: " + checkedTopics);
            } finally {
                c.shutdown();
                p.shutdown();
            }
        }
    }
}
