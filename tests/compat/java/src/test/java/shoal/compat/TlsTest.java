package shoal.compat;

import static org.junit.jupiter.api.Assertions.*;
import static shoal.compat.Clients.*;

import java.io.File;
import java.io.FileInputStream;
import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.junit.jupiter.api.Test;

/**
 * The Java client over TLS (`setUseTLS(true)`, RocketMQ's `tls.*` settings) against a Shoal name
 * server and broker whose listeners are in enforcing mode (TLS only). The certificate is made
 * with the JDK's keytool (RSA, self-signed for 127.0.0.1) and written as PEM for Shoal; the
 * client verifies it (`tls.test.mode.enable=false`, `tls.client.authServer=true`,
 * `tls.client.trustCertPath`); trusting another certificate, it refuses the server. A plaintext
 * client gets nothing through.
 */
class TlsTest {
    private static final String TLS_CONFIG = "org.apache.rocketmq.remoting.netty.TlsSystemConfig";

    private static String pem(String type, byte[] der) {
        String b64 = Base64.getMimeEncoder(64, "\n".getBytes(StandardCharsets.US_ASCII)).encodeToString(der);
        return "-----BEGIN " + type + "-----\n" + b64 + "\n-----END " + type + "-----\n";
    }

    /** keytool: an RSA key and a self-signed certificate for 127.0.0.1, written as PEM files. */
    private static void certificate(Path dir) throws Exception {
        Files.createDirectories(dir);
        Path ks = dir.resolve("ks.p12");
        String keytool = Path.of(System.getProperty("java.home"), "bin", "keytool").toString();
        Process p = new ProcessBuilder(keytool, "-genkeypair", "-alias", "shoal", "-keyalg", "RSA",
            "-keysize", "2048", "-dname", "CN=127.0.0.1", "-ext", "san=ip:127.0.0.1", "-validity", "2",
            "-storetype", "PKCS12", "-keystore", ks.toString(), "-storepass", "changeit")
            .redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertTrue(p.waitFor(60, TimeUnit.SECONDS) && p.exitValue() == 0, "keytool: " + out);
        KeyStore store = KeyStore.getInstance("PKCS12");
        try (FileInputStream in = new FileInputStream(ks.toFile())) {
            store.load(in, "changeit".toCharArray());
        }
        PrivateKey key = (PrivateKey) store.getKey("shoal", "changeit".toCharArray());
        Certificate cert = store.getCertificate("shoal");
        Files.writeString(dir.resolve("server.key"), pem("PRIVATE KEY", key.getEncoded()));
        Files.writeString(dir.resolve("server.pem"), pem("CERTIFICATE", cert.getEncoded()));
    }

    private static Process spawn(Path dir, String name, List<String> cmd) throws Exception {
        ProcessBuilder pb = new ProcessBuilder(cmd);
        pb.directory(dir.toFile());
        pb.redirectOutput(ProcessBuilder.Redirect.appendTo(dir.resolve(name + ".out").toFile()));
        pb.redirectError(ProcessBuilder.Redirect.appendTo(dir.resolve(name + ".err").toFile()));
        // Handshake failures are logged at debug: the test reads them as evidence.
        pb.environment().put("RUST_LOG", "info,shoal_net=debug");
        Process proc = pb.start();
        ShoalServer.waitFor(dir.resolve(name + ".out"), "listening on", proc);
        return proc;
    }

    private static void setTls(String field, Object value) throws Exception {
        Field f = Class.forName(TLS_CONFIG).getField(field);
        f.set(null, value);
    }

    private static Object getTls(String field) throws Exception {
        return Class.forName(TLS_CONFIG).getField(field).get(null);
    }

    /** Waits (up to 15 s) until the server log `log` contains `line`; fails with its tail. */
    private static void awaitLog(Path log, String line, String what) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
        while (!Files.readString(log, StandardCharsets.UTF_8).contains(line)) {
            if (System.nanoTime() > deadline) {
                fail(what + " (no \"" + line + "\" in 15 s):\n" + ShoalServer.tail(log));
            }
            Thread.sleep(100);
        }
    }

    @Test
    void javaClientSendsAndConsumesOverTlsAndPlaintextIsRefused() throws Exception {
        Path dir = Files.createTempDirectory("shoal-java-tls");
        List<Process> procs = new ArrayList<>();
        Object testMode = getTls("tlsTestModeEnable");
        Object authServer = getTls("tlsClientAuthServer");
        Object trust = getTls("tlsClientTrustCertPath");
        try {
            certificate(dir);
            String cert = dir.resolve("server.pem").toString();
            String key = dir.resolve("server.key").toString();
            String ns = "127.0.0.1:" + ShoalServer.freePort();
            String broker = "127.0.0.1:" + ShoalServer.freePort();
            procs.add(spawn(dir, "namesrv", List.of(ShoalServer.bin(), "namesrv", "--listen", ns,
                "--tls-mode", "enforcing", "--tls-cert", cert, "--tls-key", key)));
            Path cfg = dir.resolve("broker.toml");
            Files.writeString(cfg, "listen_addr = \"" + broker + "\"\nnamesrv_addrs = [\"" + ns + "\"]\n"
                + "data_dir = \"" + dir.resolve("data") + "\"\nauto_create_topic = true\n\n[tls]\n"
                + "mode = \"enforcing\"\ncert_path = \"" + cert + "\"\nkey_path = \"" + key + "\"\n"
                + "namesrv_tls = true\ninsecure = true\n");
            procs.add(spawn(dir, "broker", List.of(ShoalServer.bin(), "broker", "--config", cfg.toString())));

            // The client verifies the server's certificate against the trusted one.
            setTls("tlsTestModeEnable", false);
            setTls("tlsClientAuthServer", true);
            setTls("tlsClientTrustCertPath", cert);

            String topic = unique("TopicTls");
            DefaultMQProducer producer = new DefaultMQProducer(unique("PG_TLS"));
            producer.setNamesrvAddr(ns);
            producer.setInstanceName(unique("ptls"));
            producer.setUseTLS(true);
            producer.setSendMsgTimeout(10_000);
            producer.start();
            try {
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
                int sent = 0;
                while (sent < 5) {
                    try {
                        SendResult r = producer.send(new Message(topic, "tls", utf8("tls-" + sent)));
                        assertEquals(SendStatus.SEND_OK, r.getSendStatus());
                        sent++;
                    } catch (Exception e) {
                        // The broker registers with the name server right after it listens.
                        if (System.nanoTime() > deadline) throw e;
                        Thread.sleep(200);
                    }
                }
            } finally {
                producer.shutdown();
            }

            DefaultLitePullConsumer c = new DefaultLitePullConsumer(unique("READ_TLS"));
            c.setNamesrvAddr(ns);
            c.setInstanceName(unique("ltls"));
            c.setUseTLS(true);
            c.setAutoCommit(false);
            // From the first offset without a seek (see Read.all: Java's seek races its pulls).
            c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            c.start();
            List<String> bodies = new ArrayList<>();
            try {
                c.assign(c.fetchMessageQueues(topic));
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
                while (bodies.size() < 5 && System.nanoTime() < deadline) {
                    for (MessageExt m : c.poll(500)) bodies.add(new String(m.getBody(), StandardCharsets.UTF_8));
                }
            } finally {
                c.shutdown();
            }
            bodies.sort(Comparator.naturalOrder());
            assertEquals(List.of("tls-0", "tls-1", "tls-2", "tls-3", "tls-4"), bodies);

            // Trusting another certificate: the client refuses the server's, nothing is sent.
            Path otherDir = dir.resolve("other");
            certificate(otherDir);
            setTls("tlsClientTrustCertPath", otherDir.resolve("server.pem").toString());
            DefaultMQProducer wrong = new DefaultMQProducer(unique("PG_WRONG"));
            wrong.setNamesrvAddr(ns);
            wrong.setInstanceName(unique("pwrong"));
            wrong.setUseTLS(true);
            wrong.setSendMsgTimeout(3_000);
            wrong.start();
            try {
                assertThrows(Exception.class, () -> wrong.send(new Message(topic, utf8("unverified"))));
            } finally {
                wrong.shutdown();
            }
            // The client gives up as soon as it rejects the certificate; the name server logs the
            // failed handshake when it reads the client's alert or close, which may come later.
            awaitLog(dir.resolve("namesrv.err"), "TLS handshake failed", "the name server saw no refused handshake");

            // A plaintext client of the same servers gets nothing through.
            DefaultMQProducer plain = new DefaultMQProducer(unique("PG_PLAIN"));
            plain.setNamesrvAddr(ns);
            plain.setInstanceName(unique("pplain"));
            plain.setUseTLS(false);
            plain.setSendMsgTimeout(3_000);
            plain.start();
            try {
                assertThrows(Exception.class, () -> plain.send(new Message(topic, utf8("plain"))));
            } finally {
                plain.shutdown();
            }
            awaitLog(dir.resolve("namesrv.err"), "plaintext connection to a TLS-only (enforcing) server",
                "the name server saw no refused plaintext connection");
        } finally {
            setTls("tlsTestModeEnable", testMode);
            setTls("tlsClientAuthServer", authServer);
            setTls("tlsClientTrustCertPath", trust);
            for (Process p : procs) {
                p.destroy();
                if (!p.waitFor(20, TimeUnit.SECONDS)) p.destroyForcibly();
            }
            if (System.getenv("SHOAL_KEEP_TEST_DIRS") == null) {
                try (var files = Files.walk(dir)) {
                    files.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
                }
            }
        }
    }
}
