#!/usr/bin/env bash
# A small simulated GPU cluster on this machine: one simulated-node exporter per scenario, a real
# Prometheus scraping them with the recording rules and the alerts loaded, and (where
# prometheus-alertmanager is installed) an Alertmanager it sends its alerts to. Prints the URLs
# (each one that answers on the installed Prometheus and Alertmanager: Debian's serve Prometheus's
# classic UI only, and Alertmanager without a UI) and runs until Ctrl-C or SIGTERM, then stops
# everything it started, in a terminal or in the background (`scripts/run-demo.sh &`, then
# `kill -INT %1`). Everything listens on 127.0.0.1; a port already in use stops it before it starts.
# A scenario with a kernel log beside it (examples/trouble-node.kmsg) is served with it, so that its
# Xids, and the alerts on them, fire.
# Usage: scripts/run-demo.sh
# Environment (defaults in brackets):
#   DEMO_SCENARIOS          scenario files, one exporter each [examples/seed-cgpu-t4.yaml
#                           examples/mixed-4gpu-node.yaml examples/mig-a100-node.yaml examples/trouble-node.yaml]
#   DEMO_EXPORTER_PORTS     one port per scenario [9401 9402 9403 9404]
#   DEMO_EXPORTER_FLAGS     flags for every exporter, e.g. --dcgm-compat [none]
#   DEMO_PROMETHEUS_PORT    [9490]
#   DEMO_ALERTMANAGER_PORT  [9493]
#   DEMO_INTERVAL           scrape and rule evaluation interval [5s]
#   DEMO_DIR                work directory for configs, data and logs [a new temporary one, removed at exit]
#   DEMO_EXPORTER           an installed kube-gpu-exporter to use [.venv/bin/kube-gpu-exporter,
#                           installed or refreshed the way scripts/run-simulated.sh does]
set -euo pipefail
# Started in the background of a non-interactive shell, bash inherits SIGINT ignored and cannot trap a
# signal ignored at its entry: start again with SIGINT at its default, so that Ctrl-C and kill -INT stop it.
if [ -z "${_RUN_DEMO_SIGINT:-}" ] && command -v python3 >/dev/null 2>&1; then
  export _RUN_DEMO_SIGINT=1
  exec python3 -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
os.execvp(sys.argv[1], sys.argv[1:])' bash "$0" "$@"
fi
cd "$(dirname "$0")/.."

if ! command -v prometheus >/dev/null 2>&1; then
  echo "run-demo: prometheus is not installed (run scripts/test.sh once, or apt-get install prometheus)" >&2
  exit 1
fi

read -r -a scenarios <<<"${DEMO_SCENARIOS:-examples/seed-cgpu-t4.yaml examples/mixed-4gpu-node.yaml examples/mig-a100-node.yaml examples/trouble-node.yaml}"
read -r -a ports <<<"${DEMO_EXPORTER_PORTS:-9401 9402 9403 9404}"
read -r -a exporter_flags <<<"${DEMO_EXPORTER_FLAGS:-}"
prom_port=${DEMO_PROMETHEUS_PORT:-9490}
am_port=${DEMO_ALERTMANAGER_PORT:-9493}
interval=${DEMO_INTERVAL:-5s}
if [ "${#ports[@]}" -lt "${#scenarios[@]}" ]; then
  echo "run-demo: DEMO_EXPORTER_PORTS needs one port per scenario (${#scenarios[@]})" >&2
  exit 1
fi

# in_use PORT: something listens on 127.0.0.1:PORT (bash's /dev/tcp: no tool needed)
in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for i in "${!scenarios[@]}"; do
  if in_use "${ports[$i]}"; then
    echo "run-demo: port ${ports[$i]} (exporter ${scenarios[$i]}) is already in use; set DEMO_EXPORTER_PORTS" >&2
    exit 1
  fi
done
for pair in "$prom_port:Prometheus:DEMO_PROMETHEUS_PORT" "$am_port:Alertmanager:DEMO_ALERTMANAGER_PORT"; do
  IFS=: read -r port what var <<<"$pair"
  if in_use "$port"; then
    echo "run-demo: port $port ($what) is already in use; set $var" >&2
    exit 1
  fi
done

exporter=${DEMO_EXPORTER:-}
if [ -z "$exporter" ]; then
  # shellcheck source=scripts/lib/ensure-venv.sh
  . scripts/lib/ensure-venv.sh
  ensure_exporter_venv  # the same install-if-changed step as scripts/run-simulated.sh
  exporter=.venv/bin/kube-gpu-exporter
fi

if [ -n "${DEMO_DIR:-}" ]; then
  work=$DEMO_DIR
  mkdir -p "$work"
  keep_work=1
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/kube-gpu-exporter-demo.XXXXXX")
  keep_work=""
fi

pids=()
names=()
# shellcheck disable=SC2317  # called by the traps below
cleanup() {
  trap - EXIT INT TERM
  local i
  for i in "${!pids[@]}"; do
    kill -TERM "${pids[$i]}" 2>/dev/null || true
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" 2>/dev/null || true
  done
  [ -n "$keep_work" ] || rm -rf "$work"
}
trap cleanup EXIT
trap 'echo; echo "run-demo: stopping"; exit 130' INT
trap 'exit 143' TERM

# start NAME LOG COMMAND...: run COMMAND in the background, logging into LOG.
start() {
  local name=$1 log=$2
  shift 2
  "$@" >"$log" 2>&1 &
  pids+=("$!")
  names+=("$name")
}

# wait_ready NAME URL LOG: poll URL until it answers (30 s), failing with LOG's tail (the work directory is kept).
wait_ready() {
  local name=$1 url=$2 log=$3 pid=${pids[-1]} i
  for ((i = 0; i < 300; i++)); do
    if curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null; then
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "run-demo: $name exited; the end of $log (kept):" >&2
      tail -n 20 "$log" >&2
      keep_work=1
      exit 1
    fi
    sleep 0.1
  done
  echo "run-demo: $name did not answer $url within 30 s; the end of $log (kept):" >&2
  tail -n 20 "$log" >&2
  keep_work=1
  exit 1
}

targets=()
for i in "${!scenarios[@]}"; do
  addr=127.0.0.1:${ports[$i]}
  log=$work/exporter-$i.log
  # Each scenario names its own node (its `node:` key); --node-name would override it.
  kmsg=()
  if [ -f "${scenarios[$i]%.yaml}.kmsg" ]; then
    kmsg=(--kmsg-path "${scenarios[$i]%.yaml}.kmsg" --kmsg-replay)  # its Xids, read once at start
  fi
  start "exporter ${scenarios[$i]}" "$log" "$exporter" --simulate "${scenarios[$i]}" --listen "$addr" \
    ${kmsg[@]+"${kmsg[@]}"} ${exporter_flags[@]+"${exporter_flags[@]}"}
  wait_ready "exporter ${scenarios[$i]}" "http://$addr/readyz" "$log"
  targets+=("$addr")
done

# The committed bundle, rendered with a short evaluation interval so the series appear quickly.
"$exporter" rules --interval "$interval" -o "$work/rules.yaml"
cp alerts/kube-gpu-exporter.alerts.yaml "$work/alerts.yaml"

am=""
if command -v prometheus-alertmanager >/dev/null 2>&1; then
  am=prometheus-alertmanager
elif command -v alertmanager >/dev/null 2>&1; then
  am=alertmanager
fi

{
  echo "global:"
  echo "  scrape_interval: $interval"
  echo "  evaluation_interval: $interval"
  echo "rule_files: [\"$work/rules.yaml\", \"$work/alerts.yaml\"]"
  echo "scrape_configs:"
  echo "  - job_name: kube-gpu-exporter"
  echo "    static_configs:"
  echo "      - targets: [$(IFS=,; echo "${targets[*]}")]"
  if [ -n "$am" ]; then
    echo "alerting:"
    echo "  alertmanagers:"
    echo "    - static_configs:"
    echo "        - targets: [127.0.0.1:$am_port]"
  fi
} >"$work/prometheus.yml"

if [ -n "$am" ]; then
  # One receiver without integrations: the alerts show in Alertmanager's UI and go nowhere.
  # alerts/alertmanager.example.yaml is the routing to start from for real receivers.
  cat >"$work/alertmanager.yml" <<'EOF'
route:
  receiver: demo
  group_by: [alertname, node_name]
  group_wait: 10s
receivers:
  - name: demo
EOF
  start alertmanager "$work/alertmanager.log" "$am" --config.file="$work/alertmanager.yml" \
    --storage.path="$work/alertmanager-data" --web.listen-address="127.0.0.1:$am_port" \
    --cluster.listen-address= --log.level=warn
  wait_ready alertmanager "http://127.0.0.1:$am_port/-/ready" "$work/alertmanager.log"
fi

start prometheus "$work/prometheus.log" prometheus --config.file="$work/prometheus.yml" \
  --storage.tsdb.path="$work/prometheus-data" --web.listen-address="127.0.0.1:$prom_port" --log.level=warn
wait_ready prometheus "http://127.0.0.1:$prom_port/-/ready" "$work/prometheus.log"

prom=http://127.0.0.1:$prom_port
# Debian's Prometheus has only the classic UI (/classic/...; /targets answers 404); with no UI at all, the API.
answers() { curl -fsS -o /dev/null --max-time 2 "$1" 2>/dev/null; }
if answers "$prom/targets"; then
  ui=$prom
elif answers "$prom/classic/targets"; then
  ui=$prom/classic
else
  ui=""
fi
graph() { # graph EXPR: a Prometheus graph link for EXPR (its characters are URL-safe but for spaces and parentheses)
  local e=$1
  e=${e// /%20}
  e=${e//(/%28}
  e=${e//)/%29}
  if [ -n "$ui" ]; then
    echo "$ui/graph?g0.expr=$e&g0.tab=0&g0.range_input=15m"
  else
    echo "$prom/api/v1/query?query=$e"
  fi
}

echo
echo "kube-gpu-exporter demo: ${#targets[@]} simulated nodes, Prometheus (rules and alerts every $interval)"
for i in "${!targets[@]}"; do
  echo "  exporter ${scenarios[$i]}: http://${targets[$i]}/metrics  (status page: http://${targets[$i]}/)"
done
if [ -n "$ui" ]; then
  echo "  Prometheus:             $ui/graph  (targets: $ui/targets, rules: $ui/rules, alerts: $ui/alerts)"
else
  echo "  Prometheus (API only):  $prom/api/v1/targets  (rules: $prom/api/v1/rules, alerts: $prom/api/v1/alerts)"
fi
echo "  cluster GPU usage:      $(graph k8s_cluster_gpu_used)"
echo "  GPU usage per node:     $(graph k8s_node_gpu_used)"
echo "  GPU usage per pod:      $(graph k8s_pod_gpu_used)"
if [ -n "$am" ]; then
  amurl=http://127.0.0.1:$am_port
  # Debian's package has no web UI: its / says so; the API and amtool answer either way.
  if curl -fsS --max-time 2 "$amurl/" 2>/dev/null | grep -q "does not include a web"; then
    echo "  Alertmanager (API only): $amurl/api/v2/alerts"
    if command -v amtool >/dev/null 2>&1; then
      echo "                          amtool --alertmanager.url=$amurl alert query"
    fi
  else
    echo "  Alertmanager:           $amurl  (API: $amurl/api/v2/alerts)"
  fi
else
  echo "  (no Alertmanager: prometheus-alertmanager is not installed)"
fi
echo "  configs and logs:       $work${keep_work:+ (kept)}"
echo "The recorded series appear after one or two intervals. Ctrl-C stops everything."

# Run until a signal (the traps) or until one of the processes exits by itself.
set +e
wait -n
rc=$?
for i in "${!pids[@]}"; do
  if ! kill -0 "${pids[$i]}" 2>/dev/null; then
    echo "run-demo: ${names[$i]} exited (status $rc); logs in $work" >&2
    keep_work=1
  fi
done
exit 1
