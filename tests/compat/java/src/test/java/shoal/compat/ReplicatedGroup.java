package shoal.compat;

import java.io.File;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A replicated broker group of three as `shoal dev --replicas 3` runs it: a name server and a
 * one-voter controller in dev's process, each replica a `shoal broker` child process whose pid
 * dev prints, on a free block of ports.
 */
public final class ReplicatedGroup implements AutoCloseable {
    private static final Pattern REPLICA =
        Pattern.compile("replica \\d+\\s+\\S+ at (127\\.0\\.0\\.1:\\d+), pid (\\d+)");

    public final String namesrvAddr;
    public final String controllerAddr;
    /** Each replica's address and pid, in dev's order. */
    public final Map<String, Long> pids;
    private final Path dir;
    private final Process dev;

    private ReplicatedGroup(Path dir, Process dev, String ns, String controller, Map<String, Long> pids) {
        this.dir = dir;
        this.dev = dev;
        this.namesrvAddr = ns;
        this.controllerAddr = controller;
        this.pids = pids;
    }

    /** Starts `shoal dev --replicas 3` and waits for its three replicas' pids. */
    public static ReplicatedGroup start() throws Exception {
        int base = basePort();
        Path dir = Files.createTempDirectory("shoal-java-failover");
        Path out = dir.resolve("dev.out");
        ProcessBuilder pb = new ProcessBuilder(List.of(ShoalServer.bin(), "dev", "--replicas", "3",
            "--namesrv-port", String.valueOf(base), "--broker-port", String.valueOf(base + 10),
            "--data-dir", dir.resolve("data").toString(), "--no-http", "--no-kafka", "--no-grpc"));
        pb.directory(dir.toFile());
        pb.redirectOutput(ProcessBuilder.Redirect.appendTo(out.toFile()));
        pb.redirectError(ProcessBuilder.Redirect.appendTo(dir.resolve("dev.err").toFile()));
        pb.environment().putIfAbsent("RUST_LOG", "info");
        Process dev = pb.start();
        ShoalServer.waitFor(out, "Try it:", dev);
        Map<String, Long> pids = new LinkedHashMap<>();
        Matcher m = REPLICA.matcher(Files.readString(out, StandardCharsets.UTF_8));
        while (m.find()) {
            pids.put(m.group(1), Long.parseLong(m.group(2)));
        }
        if (pids.size() != 3) {
            dev.destroyForcibly();
            throw new IllegalStateException("dev printed " + pids.size() + " replicas:\n" + ShoalServer.tail(out));
        }
        return new ReplicatedGroup(dir, dev, "127.0.0.1:" + base, "127.0.0.1:" + (base + 2), pids);
    }

    /**
     * A block of ports, all free: the name server's, +2 (controller), +10, +20, +30 (replicas).
     * Drawn from SHOAL_TEST_PORTS (`LO-HI`) when set, otherwise from 10000 up to the kernel's
     * ephemeral range.
     */
    private static int basePort() throws IOException {
        int lo = 10_000;
        int hi = 32_767;
        try {
            // Read line by line: /proc files report size 0, and Files.readString then returns
            // only the first byte of them.
            String eph;
            try (var r = Files.newBufferedReader(Path.of("/proc/sys/net/ipv4/ip_local_port_range"))) {
                eph = r.readLine().trim();
            }
            int below = Integer.parseInt(eph.split("\\s+")[0]) - 1;
            if (below - 30 > lo) {
                hi = below;
            }
        } catch (IOException | RuntimeException e) {
            // keep the default
        }
        String range = System.getenv("SHOAL_TEST_PORTS");
        if (range != null && range.trim().matches("\\d+-\\d+")) {
            String[] r = range.trim().split("-");
            lo = Integer.parseInt(r[0]);
            hi = Integer.parseInt(r[1]);
        }
        for (int attempt = 0; attempt < 200 && hi - 30 > lo; attempt++) {
            int base = ThreadLocalRandom.current().nextInt(lo, hi - 30 + 1);
            if (free(base) && free(base + 2) && free(base + 10) && free(base + 20) && free(base + 30)) {
                return base;
            }
        }
        throw new IOException("no free block of ports for the replicated group in " + lo + "-" + hi);
    }

    private static boolean free(int port) {
        try (ServerSocket s = new ServerSocket()) {
            s.bind(new InetSocketAddress("127.0.0.1", port));
            return true;
        } catch (IOException e) {
            return false;
        }
    }

    /** SIGKILLs the replica at `addr`. */
    public void kill(String addr) {
        ProcessHandle.of(pids.get(addr)).ifPresent(ProcessHandle::destroyForcibly);
    }

    /** dev's output and the last lines of its log, for failure messages. */
    public String log() {
        return ShoalServer.tail(dir.resolve("dev.out")) + "\n" + ShoalServer.tail(dir.resolve("dev.err"));
    }

    @Override
    public void close() throws Exception {
        dev.destroy();
        if (!dev.waitFor(30, TimeUnit.SECONDS)) {
            dev.destroyForcibly();
            dev.waitFor(10, TimeUnit.SECONDS);
        }
        for (long pid : pids.values()) {
            ProcessHandle.of(pid).ifPresent(ProcessHandle::destroyForcibly);
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
