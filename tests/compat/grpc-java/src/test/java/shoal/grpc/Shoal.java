package shoal.grpc;

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
 * `shoal dev` (name server, broker, gRPC endpoint in one process) on free ports of 127.0.0.1,
 * data in a temporary directory; SHOAL_BIN names the binary. Extra broker keys come as TOML.
 * Shared by the tests of this JVM (one process for all of them).
 */
public final class Shoal implements AutoCloseable {
    public final String namesrv;
    public final String grpc;
    public final String broker;
    private final Path dir;
    private final Process process;

    private static Shoal shared;

    private Shoal(Path dir, String namesrv, String broker, String grpc, Process process) {
        this.dir = dir;
        this.namesrv = namesrv;
        this.broker = broker;
        this.grpc = grpc;
        this.process = process;
    }

    static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0)) {
            s.setReuseAddress(true);
            return s.getLocalPort();
        }
    }

    /** The server of this JVM's tests, started on first use, stopped at exit. */
    public static synchronized Shoal shared() throws Exception {
        if (shared == null) {
            shared = start();
            Runtime.getRuntime().addShutdownHook(new Thread(() -> {
                try {
                    shared.close();
                } catch (Exception ignored) {
                    // best effort at exit
                }
            }));
        }
        return shared;
    }

    static Shoal start() throws Exception {
        String bin = System.getenv("SHOAL_BIN");
        if (bin == null || bin.isEmpty()) {
            throw new IllegalStateException("SHOAL_BIN is not set (the path of the shoal binary)");
        }
        Path dir = Files.createTempDirectory("shoal-grpc-compat");
        // Short transaction checks, so a check-back comes within the test; short long polling,
        // so a PushConsumer's close (which waits for its receives in flight) is quick.
        Path cfg = dir.resolve("broker.toml");
        Files.writeString(cfg, "transaction_timeout_ms = 1000\ntransaction_check_interval_ms = 500\n"
            + "grpc_long_polling_ms = 2000\n");
        int ns = freePort(), broker = freePort(), grpc = freePort();
        List<String> cmd = new ArrayList<>(List.of(bin, "dev", "--data-dir", dir.resolve("data").toString(),
            "--config", cfg.toString(), "--namesrv-port", String.valueOf(ns), "--broker-port", String.valueOf(broker),
            "--grpc-port", String.valueOf(grpc), "--no-http", "--no-kafka"));
        ProcessBuilder pb = new ProcessBuilder(cmd);
        pb.redirectOutput(ProcessBuilder.Redirect.appendTo(dir.resolve("dev.out").toFile()));
        pb.redirectError(ProcessBuilder.Redirect.appendTo(dir.resolve("dev.err").toFile()));
        pb.environment().putIfAbsent("RUST_LOG", "info");
        Process p = pb.start();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        Path out = dir.resolve("dev.out");
        while (true) {
            if (Files.exists(out) && Files.readString(out, StandardCharsets.UTF_8).contains("gRPC")) {
                break;
            }
            if (!p.isAlive() || System.nanoTime() > deadline) {
                throw new IllegalStateException("shoal dev did not start:\n" + tail(dir.resolve("dev.err")));
            }
            Thread.sleep(50);
        }
        return new Shoal(dir, "127.0.0.1:" + ns, "127.0.0.1:" + broker, "127.0.0.1:" + grpc, p);
    }

    /** Runs a `shoal` command against this server (`--namesrv` added); fails when it fails. */
    public String cli(String... args) throws Exception {
        List<String> cmd = new ArrayList<>();
        cmd.add(System.getenv("SHOAL_BIN"));
        cmd.addAll(List.of(args));
        cmd.add("--namesrv");
        cmd.add(namesrv);
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        if (!p.waitFor(30, TimeUnit.SECONDS) || p.exitValue() != 0) {
            throw new IllegalStateException(String.join(" ", cmd) + " failed:\n" + out);
        }
        return out;
    }

    static String tail(Path f) {
        try {
            List<String> lines = Files.readAllLines(f, StandardCharsets.UTF_8);
            return String.join("\n", lines.subList(Math.max(0, lines.size() - 40), lines.size()));
        } catch (IOException e) {
            return "(no " + f + ")";
        }
    }

    /** The server's log, for failure messages. */
    public String log() {
        return tail(dir.resolve("dev.err"));
    }

    @Override
    public void close() throws Exception {
        process.destroy();
        if (!process.waitFor(20, TimeUnit.SECONDS)) {
            process.destroyForcibly();
        }
        if (System.getenv("SHOAL_KEEP_TEST_DIRS") == null) {
            try (var files = Files.walk(dir)) {
                files.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
            }
        }
    }
}
