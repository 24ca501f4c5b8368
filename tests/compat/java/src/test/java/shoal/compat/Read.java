package shoal.compat;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;

/** Reads a topic from its beginning with an assigned lite pull consumer (Java's own client). */
public final class Read {
    private Read() {}

    /**
     * Every queue of `topic` from offset 0 until `want` messages arrived (or 30 s passed).
     *
     * <p>A new group that starts from the first offset, with no seek: in Java's lite pull
     * consumer (5.3.3) a seek while the queue's first pull is in flight lets that pull's
     * messages into the cache after the seek (read twice), and its interrupt of the old pull
     * task's thread closes the client's connection, failing whatever else is in flight on it
     * (the next seek's GET_MIN_OFFSET). The first explains a CI failure (101 sends read as
     * 106), the second was reproduced under load with the client's own log showing it; the
     * broker plays no part in either.
     */
    public static List<MessageExt> all(ShoalServer s, String topic, int want) throws Exception {
        DefaultLitePullConsumer c = Clients.litePull(s, Clients.unique("READ"));
        c.setAutoCommit(false);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.start();
        try {
            c.assign(c.fetchMessageQueues(topic));
            List<MessageExt> got = new ArrayList<>();
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
            while (got.size() < want && System.nanoTime() < deadline) {
                got.addAll(c.poll(500));
            }
            // Anything beyond `want` (there should be none) shows up too.
            got.addAll(c.poll(200));
            return got;
        } finally {
            c.shutdown();
        }
    }
}
