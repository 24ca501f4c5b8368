package shoal.compat;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/** Reads a topic from its beginning with an assigned lite pull consumer (Java's own client). */
public final class Read {
    private Read() {}

    /** Every queue of `topic` from offset 0 until `want` messages arrived (or 30 s passed). */
    public static List<MessageExt> all(ShoalServer s, String topic, int want) throws Exception {
        DefaultLitePullConsumer c = Clients.litePull(s, Clients.unique("READ"));
        c.setAutoCommit(false);
        c.start();
        try {
            Collection<MessageQueue> queues = c.fetchMessageQueues(topic);
            c.assign(queues);
            for (MessageQueue q : queues) {
                c.seek(q, 0);
            }
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
