# Helpers for the benchmark scripts that run Apache RocketMQ 5.3.3's Java servers next to Shoal
# (sourced by benches/peers/replicated.sh and tests/compat/bench-java-broker.sh, from the
# repository's root; not run on its own). The servers come from the class path that
# .ci/setup.d/20-java.sh writes.

rmq_cpf=target/external/rocketmq-broker5.classpath

# CPU ticks (utime + stime) of the given processes, all their threads.
ticks() {
  local t=0 p f
  for p in "$@"; do
    # Fields after the command name (which is in parentheses): utime is the 12th, stime the 13th.
    f=$(sed 's/.*) //' "/proc/$p/stat")
    set -- $f
    t=$((t + ${12} + ${13}))
  done
  echo "$t"
}

# Whether RocketMQ's servers can run here; says why not on stderr.
rmq_check() {
  [ -s "$rmq_cpf" ] || { echo "no $rmq_cpf: run .ci/setup.d/20-java.sh first" >&2; return 1; }
  command -v java >/dev/null || { echo "java not found" >&2; return 1; }
}

# The JVM flags of RocketMQ's start scripts (G1), without their 8 GiB heap. The hessian
# serializer the controller loads reflects into java.lang, which Java 17 only allows when opened.
rmq_jvm=(-server -XX:+UseG1GC -XX:G1HeapRegionSize=16m -XX:G1ReservePercent=25
  -XX:InitiatingHeapOccupancyPercent=30 -XX:SoftRefLRUPolicyMSPerMB=0
  -XX:-OmitStackTraceInFastThrow --add-opens java.base/java.lang=ALL-UNNAMED)

# rmq_java DIR HEAP MAIN-CLASS ARGS...: runs one of RocketMQ's main classes with DIR as its
# working and home directory (its logs go to DIR/logs), stdout and stderr to DIR/CLASS.out.
# It execs the JVM: started as `rmq_java ... &`, $! is the JVM's pid.
rmq_java() {
  local dir=$1 heap=$2 main=$3 cp
  shift 3
  cp=$(cat "$rmq_cpf")
  cd "$dir" || return 1
  exec java "-Xms$heap" "-Xmx$heap" "${rmq_jvm[@]}" "-Duser.home=$dir" "-Drocketmq.home.dir=$dir" \
    -cp "$cp" "$main" "$@" >"$dir/${main##*.}.out" 2>&1
}

# rmq_admin DIR ARGS...: RocketMQ's admin tool (mqadmin) in the foreground, its logs in DIR.
rmq_admin() {
  local dir=$1
  shift
  java -Xms64m -Xmx128m -XX:TieredStopAtLevel=1 "-Duser.home=$dir" -cp "$(cat "$rmq_cpf")" \
    org.apache.rocketmq.tools.command.MQAdminStartup "$@" 2>/dev/null
}

# rmq_disk_check DIR: RocketMQ's broker marks its store full, and refuses sends, once the file
# system of its store is over 90% used by its own count (used / (used + available to the
# user), which counts blocks reserved for others as used; 90% is the most its
# diskSpaceWarningLevelRatio allows). Fails, saying so, when DIR's file system is over that.
rmq_disk_check() {
  local b f a pct
  read -r b f a < <(stat -f -c '%b %f %a' "$1")
  # Rounded up, as the broker does.
  pct=$(( ((b - f) * 100 + b - f + a - 1) / (b - f + a) ))
  [ "$pct" -le 90 ] && return 0
  echo "RocketMQ's broker would refuse sends: the file system of $1 is $pct% used by its count" \
    "(used / (used + available)), over its 90% limit; put the data directories on another one" >&2
  return 1
}
