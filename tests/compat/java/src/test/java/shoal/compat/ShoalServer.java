package shoal.compat;

import java.io.File;
import java.io.IOException;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A Shoal name server and broker (`shoal namesrv` + `shoal broker`, separate processes) on free
 * ports of 127.0.0.1, with data in a temporary directory; stopped and removed by close().
 * SHOAL_BIN names the binary (the cargo test sets it).
 */
public final class ShoalServer implements AutoCloseable {
    public final String namesrvAddr;
    public final String brokerAddr;
    public final Path dir;
    private final Process namesrv;
    private Process broker;
    private final List<String> brokerArgs;

    private ShoalServer(Path dir, String namesrvAddr, String brokerAddr, Process namesrv, List<String> brokerArgs) {
        this.dir = dir;
        this.namesrvAddr = namesrvAddr;
        this.brokerAddr = brokerAddr;
        this.namesrv = namesrv;
        this.brokerArgs = brokerArgs;
    }

    /** The shoal binary. */
    public static String bin() {
        String b = System.getenv("SHOAL_BIN");
        if (b == null || b.isEmpty()) {
            throw new IllegalStateException("SHOAL_BIN is not set (the path of the shoal binary)");
        }
        return b;
    }

    public static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0)) {
            s.setReuseAddress(true);
            return s.getLocalPort();
        }
    }

    /** Starts a name server and a broker; `config` is TOML for the broker (may be empty). */
    public static ShoalServer start(boolean autoCreate, String config) throws Exception {
        Path dir = Files.createTempDirectory("shoal-java-compat");
        int nsPort = freePort();
        int brokerPort = freePort();
        String ns = "127.0.0.1:" + nsPort;
        Process namesrv = spawn(dir, "namesrv", List.of(bin(), "namesrv", "--listen", ns));
        waitFor(dir.resolve("namesrv.out"), "listening on", namesrv);
        Path cfg = dir.resolve("broker.toml");
        Files.writeString(cfg, config == null ? "" : config);
        List<String> args = new ArrayList<>(List.of(bin(), "broker", "--config", cfg.toString(),
            "--listen", "127.0.0.1:" + brokerPort, "--namesrv", ns, "--data-dir", dir.resolve("broker").toString()));
        if (autoCreate) {
            args.add("--auto-create-topic");
        }
        ShoalServer s = new ShoalServer(dir, ns, "127.0.0.1:" + brokerPort, namesrv, args);
        s.startBroker();
        return s;
    }

    /** Starts a server with auto-create on and default settings. */
    public static ShoalServer start() throws Exception {
        return start(true, "");
    }

    private void startBroker() throws Exception {
        Files.deleteIfExists(dir.resolve("broker.out"));
        broker = spawn(dir, "broker", brokerArgs);
        waitFor(dir.resolve("broker.out"), "listening on", broker);
    }

    /** Stops the broker gracefully (SIGTERM) and starts it again on the same port and data. */
    public void restartBroker() throws Exception {
        broker.destroy();
        broker.waitFor(30, TimeUnit.SECONDS);
        startBroker();
    }

    private static Process spawn(Path dir, String name, List<String> cmd) throws IOException {
        ProcessBuilder pb = new ProcessBuilder(cmd);
        pb.directory(dir.toFile());
        pb.redirectOutput(ProcessBuilder.Redirect.appendTo(dir.resolve(name + ".out").toFile()));
        pb.redirectError(ProcessBuilder.Redirect.appendTo(dir.resolve(name + ".err").toFile()));
        pb.environment().putIfAbsent("RUST_LOG", "info");
        return pb.start();
    }

    static void waitFor(Path out, String text, Process p) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (System.nanoTime() < deadline) {
            if (Files.exists(out) && Files.readString(out, StandardCharsets.UTF_8).contains(text)) {
                return;
            }
            if (!p.isAlive()) {
                throw new IllegalStateException(out + ": process exited with " + p.exitValue() + "\n" + tail(out.resolveSibling(out.getFileName().toString().replace(".out", ".err"))));
            }
            Thread.sleep(50);
        }
        throw new IllegalStateException("timed out waiting for '" + text + "' in " + out);
    }

    /** The last lines of a log file, for failure messages. */
    public static String tail(Path f) {
        try {
            List<String> lines = Files.readAllLines(f, StandardCharsets.UTF_8);
            return String.join("\n", lines.subList(Math.max(0, lines.size() - 40), lines.size()));
        } catch (IOException e) {
            return "(no " + f + ")";
        }
    }

    /** The broker's log (stderr), for failure messages. */
    public String brokerLog() {
        return tail(dir.resolve("broker.err"));
    }

    @Override
    public void close() throws Exception {
        for (Process p : new Process[] {broker, namesrv}) {
            if (p != null) {
                p.destroy();
                if (!p.waitFor(20, TimeUnit.SECONDS)) {
                    p.destroyForcibly();
                    p.waitFor(10, TimeUnit.SECONDS);
                }
            }
        }
        if (System.getenv("SHOAL_KEEP_TEST_DIRS") == null) {
            try (var files = Files.walk(dir)) {
                files.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
            }
        } else {
            System.err.println("kept " + dir);
        }
    }
}
