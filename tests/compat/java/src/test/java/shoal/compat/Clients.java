package shoal.compat;

import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * Client factories and helpers shared by the tests. Source compatible with rocketmq-client
 * 4.9.x and 5.x: types whose package moved between them (protocol bodies, MessageModel,
 * ResponseCode) are reached with `var`, numbers or reflection, never imported.
 */
public final class Clients {
    private Clients() {}

    static {
        // Client logs go to the build directory, not ~/logs.
        String root = System.getProperty("java.io.tmpdir") + "/shoal-java-compat-logs";
        System.setProperty("rocketmq.client.logRoot", root);
        System.setProperty("client.logRoot", root);
        System.setProperty("rocketmq.client.logLevel", "WARN");
    }

    /** 4 or 5: the major version of the client under test. */
    public static int major() {
        return "client5".equals(System.getProperty("compat.profile")) ? 5 : 4;
    }

    public static String unique(String prefix) {
        return prefix + "_" + UUID.randomUUID().toString().substring(0, 8);
    }

    public static DefaultMQProducer producer(ShoalServer s, String group) throws Exception {
        DefaultMQProducer p = new DefaultMQProducer(group);
        p.setNamesrvAddr(s.namesrvAddr);
        p.setInstanceName(unique("p"));
        p.setSendMsgTimeout(10_000);
        p.start();
        return p;
    }

    /** A push consumer, not started. */
    public static DefaultMQPushConsumer push(ShoalServer s, String group) {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(group);
        c.setNamesrvAddr(s.namesrvAddr);
        c.setInstanceName(unique("c"));
        c.setPersistConsumerOffsetInterval(1000);
        return c;
    }

    /** A lite pull consumer, not started. */
    public static DefaultLitePullConsumer litePull(ShoalServer s, String group) {
        DefaultLitePullConsumer c = new DefaultLitePullConsumer(group);
        c.setNamesrvAddr(s.namesrvAddr);
        c.setInstanceName(unique("l"));
        return c;
    }

    public static DefaultMQAdminExt admin(ShoalServer s) throws Exception {
        DefaultMQAdminExt a = new DefaultMQAdminExt(5000);
        a.setNamesrvAddr(s.namesrvAddr);
        a.setInstanceName(unique("admin"));
        a.start();
        return a;
    }

    /** Sets BROADCASTING or CLUSTERING (MessageModel moved package in 5.x). */
    @SuppressWarnings({"unchecked", "rawtypes"})
    public static void messageModel(DefaultMQPushConsumer c, String model) throws Exception {
        for (Method m : c.getClass().getMethods()) {
            if (m.getName().equals("setMessageModel")) {
                Class<? extends Enum> type = (Class<? extends Enum>) m.getParameterTypes()[0];
                m.invoke(c, Enum.valueOf(type, model));
                return;
            }
        }
        throw new IllegalStateException("no setMessageModel");
    }

    /** Waits until `cond` holds, failing after `seconds`. */
    public static void await(String what, int seconds, BooleanSupplier cond) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
        while (!cond.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("timed out after " + seconds + " s waiting for: " + what);
            }
            Thread.sleep(50);
        }
    }

    public static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    public static String str(byte[] b) {
        return new String(b, StandardCharsets.UTF_8);
    }
}
