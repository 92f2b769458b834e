"""The rule-cost report: the machine, the linear fit per group, the markdown tables."""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.fleet_tke import PREFIX
from bench.prom import PROMETHEUS
from bench.rule_compare import table as compare_table

OURS_GROUP, SEED_GROUP = "k8s-gpu", "tke-seed"


def machine() -> dict[str, Any]:
    """CPU, memory, kernel, Prometheus version and load at the start."""
    info = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), platform.processor())
    mem = next(int(ln.split()[1]) * 1024 for ln in Path("/proc/meminfo").read_text().splitlines()
               if ln.startswith("MemTotal:"))
    try:
        version = subprocess.run([PROMETHEUS, "--version"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        version = ""
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_bytes": mem, "platform": platform.platform(),
            "python": platform.python_version(), "prometheus": version.splitlines()[0] if version else "",
            "load_average": os.getloadavg()}


def _fit(points: Sequence[tuple[float, float]]) -> dict[str, float] | None:
    """Least squares y = a + b x and r²; None with fewer than two points."""
    if len(points) < 2:
        return None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    a = my - b * mx
    ss = sum((y - my) ** 2 for _, y in points)
    r2 = 1 - sum((y - a - b * x) ** 2 for x, y in points) / ss if ss else 1.0
    return {"intercept_seconds": a, "seconds_per_1000_nodes": b * 1000, "r2": r2}


def _ok(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if "error" not in r]


def scaling(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per profile and group: seconds per 1,000 nodes at each size and the linear fit."""
    out: dict[str, Any] = {}
    for profile in dict.fromkeys(r["profile"] for r in _ok(runs)):
        rs = sorted((r for r in _ok(runs) if r["profile"] == profile), key=lambda r: r["nodes"])
        entry: dict[str, Any] = {}
        for group in (OURS_GROUP, SEED_GROUP):
            pts = [(r["nodes"], r["groups"][group]["seconds_median"]) for r in rs
                   if r["groups"].get(group, {}).get("seconds_median") is not None]
            replay = [(r["nodes"], r["replay"][group]["seconds"]) for r in rs if group in r.get("replay", {})]
            entry[group] = {"per_1000_nodes": {n: s / (n / 1000) for n, s in pts}, "fit": _fit(pts),
                            "replay_per_1000_nodes": {n: s / (n / 1000) for n, s in replay},
                            "replay_fit": _fit(replay)}
        entry["head_series_per_node"] = {r["nodes"]: r["prometheus"]["head_series"] / r["nodes"] for r in rs}
        entry["rss_bytes_per_head_series"] = {r["nodes"]: r["prometheus"]["rss_bytes"] / r["prometheus"]["head_series"]
                                              for r in rs}
        out[profile] = entry
    return out


def _helpers_read(reads: dict[str, list[str]], names: Sequence[str]) -> list[str]:
    """The helper records (``a:b:c``) that ``names`` read, directly or through other records."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        for dep in reads.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return sorted(n for n in seen if ":" in n)


def equivalent(run: dict[str, Any]) -> dict[str, Any]:
    """The series both bundles record: rule time (ours: plus the helpers they read) and series, per bundle.

    Times from the group evaluations (medians) and, when the run has one, from the idle replay. A
    run without ``rule_reads`` (older JSON) counts every helper.
    """
    ours_rules = run["groups"][OURS_GROUP]["rule_seconds_median"]
    seed_rules = run["groups"][SEED_GROUP]["rule_seconds_median"]
    shared = sorted(n for n in ours_rules if PREFIX + n in seed_rules)
    helpers = (_helpers_read(run["rule_reads"], shared) if "rule_reads" in run
               else [n for n in ours_rules if ":" in n])
    ours_n = sum(run["recorded_series"][OURS_GROUP][n] for n in shared)
    seed_n = sum(run["recorded_series"][SEED_GROUP][PREFIX + n] for n in shared)
    out = {"names": len(shared), "helpers": helpers, "ours_series": ours_n, "seed_series": seed_n}
    sources = {"eval": (ours_rules, seed_rules)}
    if SEED_GROUP in run.get("replay", {}):
        sources["replay"] = (run["replay"][OURS_GROUP]["rule_seconds"], run["replay"][SEED_GROUP]["rule_seconds"])
    for key, (ours, seed) in sources.items():
        o, s = sum(ours[n] for n in shared + helpers), sum(seed[PREFIX + n] for n in shared)
        out[key] = {"ours_seconds": o, "seed_seconds": s, "ours_us_per_series": 1e6 * o / ours_n if ours_n else None,
                    "seed_us_per_series": 1e6 * s / seed_n if seed_n else None}
    return out


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f}"


def _runs_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["| profile | nodes | GPUs | scraped series (exporter + TKE) | head series | RSS / peak (GiB) | "
             "samples/s | Prometheus CPU (cores) | ours: eval median / max (s) | seed: eval median / max (s) | "
             "ours / seed per 1,000 nodes (s) | replayed idle: ours / seed / floor (s) | ours / seed recorded series |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['profile']} | {r['nodes']} | | {r['error']} | | | | | | | | | |")
            continue
        o, p = r["groups"][OURS_GROUP], r["prometheus"]
        s = r["groups"].get(SEED_GROUP, {"seconds_median": None})
        k = r["nodes"] / 1000
        ours_n = sum(r["recorded_series"][OURS_GROUP].values())
        seed_n = sum(r["recorded_series"].get(SEED_GROUP, {}).values())
        sc = r["scraped_series"]
        seed = (f"{s['seconds_median']:.3f} / {s['seconds_max']:.3f}", f"{s['seconds_median'] / k:.3f}") \
            if s["seconds_median"] is not None else ("not run", "-")
        rp = r.get("replay", {})
        replay = " / ".join(f"{rp[g]['seconds']:.3f}" if g in rp else "-" for g in (OURS_GROUP, SEED_GROUP, "floor"))
        lines.append(
            f"| {r['profile']} | {r['nodes']:,} | {r['gpus']:,} | {sc['exporter']:,} + {sc['tke']:,} | "
            f"{int(p['head_series']):,} | {_gib(p['rss_bytes'])} / {_gib(p['peak_rss_bytes'])} | "
            f"{p['samples_appended_per_second']:,.0f} | {p['cpu_cores_used']:.2f} | "
            f"{o['seconds_median']:.3f} / {o['seconds_max']:.3f} | {seed[0]} | "
            f"{o['seconds_median'] / k:.3f} / {seed[1]} | {replay} | {ours_n:,} / {seed_n:,} |")
    return lines


def _hot(run: dict[str, Any], group: str, top: int) -> list[str]:
    """The slowest rules, by their idle replay when the run has one (steadier), else by evaluation."""
    evaluated = run["groups"][group]["rule_seconds_median"]
    replayed = run.get("replay", {}).get(group, {}).get("rule_seconds", {})
    key = replayed or evaluated
    total = sum(key.values()) or 1.0
    series = run["recorded_series"][group]
    return [f"| `{n}` | {1000 * replayed[n]:.0f} | {100 * s / total:.1f} % | {1000 * evaluated.get(n, 0):.0f} | "
            f"{series.get(n, 0):,} |" if replayed else
            f"| `{n}` | - | {100 * s / total:.1f} % | {1000 * evaluated.get(n, 0):.0f} | {series.get(n, 0):,} |"
            for n, s in sorted(key.items(), key=lambda x: -x[1])[:top]]


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    out = [f"Machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_bytes'] / 2**30:.1f} GiB, {m['platform']}, "
           f"{m['prometheus']}; load average at start {m['load_average'][0]:.2f}. Interval "
           f"{report['config']['interval']}, {report['config']['evaluations']} evaluations timed per size.", ""]
    for profile, s in report.get("series_summary", {}).items():
        kinds = ", ".join(f"{k} {v['series_per_node']:.0f}" for k, v in s["by_kind"].items())
        out.append(f"- `{profile}` exposition: {s['series_per_node']:.0f} series per node, "
                   f"{s['series_per_gpu']:.1f} per GPU ({s['nodes']:,} nodes; by node kind: {kinds}).")
    out += ["", *_runs_table(report["runs"]), ""]
    out += [f"- {r['profile']}, {r['nodes']:,} nodes: {r['note']}" for r in report["runs"] if r.get("note")]
    ok = _ok(report["runs"])
    if ok:
        out += ["The series both bundles record (same names): rule seconds, ours with the helpers those "
                "rules read (directly or through other records); evaluated (median) and replayed idle.", "",
                "| profile | nodes | names | series: ours / seed | evaluated s: ours / seed | µs per series | "
                "replayed s: ours / seed | µs per series |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in (r for r in ok if SEED_GROUP in r["groups"]):
            e = equivalent(r)
            cells = []
            for key in ("eval", "replay"):
                v = e.get(key)
                if not v:
                    cells += ["-", "-"]
                    continue
                cells += [f"{v['ours_seconds']:.3f} / {v['seed_seconds']:.3f}",
                          f"{v['ours_us_per_series'] or 0:.1f} / {v['seed_us_per_series'] or 0:.1f}"]
            out.append(f"| {r['profile']} | {r['nodes']:,} | {e['names']} | {e['ours_series']:,} / "
                       f"{e['seed_series']:,} | {' | '.join(cells)} |")
        big = max(ok, key=lambda r: (r["nodes"], r["profile"] == "rules"))
        for group in big["groups"]:
            out += ["", f"Slowest rules of `{group}` at {big['nodes']:,} nodes ({big['profile']}):", "",
                    "| rule | replayed idle ms | share | evaluated ms (median) | series |",
                    "| --- | ---: | ---: | ---: | ---: |",
                    *_hot(big, group, 8)]
        for group in big["groups"]:
            bad = big["groups"][group]["unhealthy"]
            if bad:
                out += ["", f"Unhealthy rules in `{group}`: " + "; ".join(f"`{k}`: {v}" for k, v in bad.items())]
        compared = [r for r in ok if r.get("comparison")]
        if compared:
            big = max(compared, key=lambda r: (r["nodes"], r["profile"] == "rules"))
            c = big["comparison"]
            out += ["", f"Comparison at {big['nodes']:,} nodes ({big['profile']}): max error against the model "
                    "(pp: percentage points)", "", compare_table(c), "", "Notes: " + ", ".join(
                        f"{k} = {v}" for k, v in c["_notes"].items()), ""]
    for profile, s in report.get("scaling", {}).items():
        for group in (OURS_GROUP, SEED_GROUP):
            if not s[group]["per_1000_nodes"]:
                continue
            fit = s[group]["fit"]
            per = ", ".join(f"{n:,}: {v:.3f}" for n, v in s[group]["per_1000_nodes"].items())
            line = f"- `{profile}` / `{group}`: seconds per 1,000 nodes {per}"
            if fit:
                line += (f"; fit {fit['intercept_seconds']:.3f} s + {fit['seconds_per_1000_nodes']:.3f} s per 1,000 "
                         f"nodes, r² {fit['r2']:.4f}")
            rfit = s[group]["replay_fit"]
            if s[group]["replay_per_1000_nodes"]:
                per = ", ".join(f"{n:,}: {v:.3f}" for n, v in s[group]["replay_per_1000_nodes"].items())
                line += f". Replayed idle: {per}"
                if rfit:
                    line += (f"; fit {rfit['intercept_seconds']:.3f} s + {rfit['seconds_per_1000_nodes']:.3f} s per "
                             f"1,000 nodes, r² {rfit['r2']:.4f}")
            out.append(line)
    return "\n".join(out) + "\n"
