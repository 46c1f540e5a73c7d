#!/usr/bin/env bash
# vmon egress-by-name benchmark (issue 12, "Benchmark"): prints a figures table.
#
#   sudo bash bench/egress.sh
#
# Everything runs in throwaway network namespaces built by the Go benchmarks (a guest link, the
# node with its real iptables rules and egress proxy, a fake internet with an HTTPS origin and a
# SOCKS5 server); nothing reaches the machine's network. Phases, sequential:
#   1. Paired egress paths in one process and topology (internal/egressproxy
#      BenchmarkEgressPaths): download throughput of a 32 MiB HTTPS body on a kept connection and
#      time to a first response on a new connection, for: unfiltered (no policy), cidr (allowOut
#      CIDR, kernel only), sni (allowOut domain: SNI read, spliced), mitm (header rule: TLS
#      terminated and re-encrypted), socks5 (egressProxy). BENCH_EGRESS_COUNT runs; medians.
#   2. Proxy memory with 1,000 idle flows through the SNI path (BenchmarkProxyMemory).
#   3. Attach and live-update latency with domains at 1, 100 and 500 links (internal/firewall
#      BenchmarkAttachUpdate, whose policy carries two domains on a node with the proxy slot).
# Figures only: nothing here fails on a time.
#
# Environment knobs: GO [go], BENCH_EGRESS_COUNT [3], BENCH_EGRESS_N [5] (iterations per path),
# BENCH_EGRESS_ATTACH_N [50], VMON_BENCH_EGRESS_OUT [/tmp/vmon-bench-egress-<time>]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench/egress.sh: run as root (it builds network namespaces)" >&2; exit 1; }
GO=${GO:-go}
COUNT=${BENCH_EGRESS_COUNT:-3}
N=${BENCH_EGRESS_N:-5}
ATTACH_N=${BENCH_EGRESS_ATTACH_N:-50}
OUT=${VMON_BENCH_EGRESS_OUT:-/tmp/vmon-bench-egress-$(date +%Y%m%dT%H%M%S)}
mkdir -p "$OUT"

echo "== egress paths (${COUNT} runs × ${N} iterations)" >&2
"$GO" test ./internal/egressproxy -run '^$' -bench EgressPaths -benchtime "${N}x" -count "$COUNT" -timeout 30m | tee "$OUT/paths.txt" >&2
echo "== proxy memory" >&2
"$GO" test ./internal/egressproxy -run '^$' -bench ProxyMemory -benchtime 1x -count 1 -timeout 10m | tee "$OUT/memory.txt" >&2
echo "== attach/update with domains" >&2
"$GO" test ./internal/firewall -run '^$' -bench AttachUpdate -benchtime "${ATTACH_N}x" -count 1 -timeout 30m | tee "$OUT/attach.txt" >&2

# Medians per sub-benchmark: MB/s of throughput runs, p50-ms of connect runs.
awk '
  function median(list,   n, a, i, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  /^BenchmarkEgressPaths\// {
    split($1, p, "/"); path = p[2]; kind = p[3]; sub(/-[0-9]+$/, "", kind)
    for (i = 1; i <= NF; i++) {
      if ($(i + 1) == "MB/s" && kind == "throughput") mbs[path] = mbs[path] " " $i
      if ($(i + 1) == "p50-ms" && kind == "connect") ms[path] = ms[path] " " $i
    }
    if (!(path in seen)) { seen[path] = 1; order[++np] = path }
  }
  END {
    printf "%-11s %10s %10s %14s %12s\n", "path", "MB/s", "x unfilt.", "connect p50", "+ms unfilt."
    base_t = median(mbs["unfiltered"]); base_c = median(ms["unfiltered"])
    for (k = 1; k <= np; k++) {
      name = order[k]; t = median(mbs[name]); c = median(ms[name])
      printf "%-11s %10.0f %10.2f %11.2f ms %+11.2f\n", name, t, t / base_t, c, c - base_c
    }
  }' "$OUT/paths.txt"
echo
awk '/^BenchmarkProxyMemory/ { for (i = 1; i <= NF; i++) { if ($(i+1) == "KiB/flow(upper)") k = $i; if ($(i+1) == "goroutines/flow") g = $i }
  printf "proxy with 1,000 idle SNI flows: %s KiB/flow (upper bound: the client ends live in the same process), %s goroutines/flow\n", k, g }' "$OUT/memory.txt"
echo
awk '/^BenchmarkAttachUpdate\/links=/ { split($1, p, "/"); n = p[2]; sub(/links=/, "", n); op = p[3]; sub(/-[0-9]+$/, "", op)
  for (i = 1; i <= NF; i++) { if ($(i+1) == "p50-ms") a = $i; if ($(i+1) == "p99-ms") b = $i }
  printf "%-6s %4s links with domains: p50 %6.2f ms, p99 %6.2f ms\n", op, n, a, b }' "$OUT/attach.txt"
echo "raw output: $OUT" >&2
