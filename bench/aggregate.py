#!/usr/bin/python3
"""Turns the records of one bench/run.sh run into its JSON and markdown.

  aggregate.py RECORDS.jsonl MACHINE.json OUT.json OUT.md

Every record is one JSON line of a benchmark program (one launch, one
size), tagged by run.sh with scenario, round and launch. A table cell is
the median over launches of the per-launch medians; spread is min..max
over launches.
"""

import json
import statistics
import sys
from collections import defaultdict

IMPL_NAMES = {"kolo": "kolo", "kolo-sealed": "kolo, sealed", "openmpi": "Open MPI",
              "gloo": "Gloo"}


def fmt_size(b):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return f"{b} B"


def fmt_num(x):
    """3 significant digits, thousands separators for large numbers."""
    if x is None:
        return "—"
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.1f}"
    if x >= 10:
        return f"{x:.2f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def fmt_bw(x):
    if x is None:
        return "—"
    return f"{x:.3f}" if x < 1 else f"{x:.2f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "—"
    r = a / b
    if r < 0.01:
        return f"{r:.2g}×"
    if r >= 100:
        return f"{r:,.0f}×"
    if r >= 10:
        return f"{r:.1f}×"
    return f"{r:.2f}×"


def main():
    rec_path, machine_path, out_json, out_md = sys.argv[1:5]
    records = []
    with open(rec_path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    print(f"aggregate: skipping a malformed line: {line[:120]}", file=sys.stderr)
    with open(machine_path) as f:
        machine = json.load(f)

    # Group the per-launch medians.
    groups = defaultdict(list)
    for r in records:
        if "impl" not in r or "median_us" not in r:
            continue
        key = (r["scenario"], r["impl"], r["kind"], r["np"], r["bytes"])
        groups[key].append(r)
    summary = []
    cell = {}
    for key, rs in sorted(groups.items()):
        scenario, impl, kind, np_, nbytes = key
        meds = [r["median_us"] for r in rs]
        med = statistics.median(meds)
        p99s = [r["p99_us"] for r in rs if r.get("p99_us") is not None]
        algbw = nbytes / med / 1e3 if med > 0 else None
        s = {
            "scenario": scenario, "impl": impl, "kind": kind, "np": np_, "bytes": nbytes,
            "median_us": round(med, 2), "min_us": round(min(meds), 2),
            "max_us": round(max(meds), 2), "launches": len(meds),
            "p99_us": round(statistics.median(p99s), 2) if p99s else None,
            "algbw_gbs": round(algbw, 4) if algbw else None,
            "busbw_gbs": round(algbw * 2 * (np_ - 1) / np_, 4) if algbw else None,
            "mean_load1": round(statistics.mean(r.get("load1", 0) for r in rs), 2),
        }
        summary.append(s)
        cell[key] = s
    failures = [r for r in records if r.get("failed")]
    veth = defaultdict(list)
    for r in records:
        if "veth_tx_bytes" in r:
            veth[r["impl_tag"]].append(r["veth_tx_bytes"])
    loads = [r for r in records if r.get("kind") == "coord_load"]

    def get(scenario, impl, kind, np_, nbytes):
        return cell.get((scenario, impl, kind, np_, nbytes))

    md = []
    m = machine
    md.append(f"# kolo vs Open MPI vs Gloo — {m['date']}")
    md.append("")
    md.append(f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_gib']} GiB, "
              f"kernel {m['kernel']}, {m['os']}. Load average at the end: {m['loadavg_end']}.")
    md.append(f"Software: {m['kolo']}; {m['openmpi']}; torch {m['torch']} (Gloo).")
    md.append(f"Run: {m['reps']} round(s){' (QUICK)' if str(m['quick']) == '1' else ''}, "
              f"ResNet-50 {m['resnet_steps']} steps per launch. Each cell: median over launches "
              "of the per-launch median over iterations (barrier; t0; allreduce; t1; max over "
              "ranks); float32 SUM in place. µs, busbw GB/s in parentheses "
              "(busbw = size/time × 2(n−1)/n). Ratios are kolo's time over the peer's: "
              "below 1× kolo is faster.")
    md.append("")
    if failures:
        md.append("**Failed launches:** " + ", ".join(
            f"{r['launch']} (rc {r['rc']})" for r in failures))
        md.append("")

    # 1. one host
    local_sizes = sorted({k[4] for k in cell if k[0] == "local" and k[2] == "allreduce"})
    local_nps = sorted({k[3] for k in cell if k[0] == "local" and k[2] == "allreduce"})
    for np_ in local_nps:
        title = f"## Allreduce, one host, np = {np_}"
        if np_ > (m.get("nproc") or 2):
            title += f" (oversubscribed: {np_} processes on {m['nproc']} CPUs)"
        md.append(title)
        md.append("")
        md.append("kolo: `kolo run` (its own transport choice on one host); Open MPI: "
                  "`mpirun --mca btl vader,self` (shared memory); Gloo: TCP on lo.")
        md.append("")
        md.append("| size | kolo | Open MPI (vader) | Gloo (TCP lo) | kolo/MPI | kolo/Gloo "
                  "| kolo launches min..max |")
        md.append("|---:|---:|---:|---:|---:|---:|---|")
        # the tail: each launch's p99 over its iterations, median over launches
        tail = ["p99, µs (median over launches of each launch's p99):", "",
                "| size | kolo | Open MPI (vader) | Gloo (TCP lo) | kolo/MPI | kolo/Gloo |",
                "|---:|---:|---:|---:|---:|---:|"]
        for b in local_sizes:
            k, o, g = (get("local", impl, "allreduce", np_, b)
                       for impl in ("kolo", "openmpi", "gloo"))

            def c(x):
                if not x:
                    return "—"
                bw = f" ({fmt_bw(x['busbw_gbs'])})" if b >= 4096 else ""
                return fmt_num(x["median_us"]) + bw

            def p(x):
                return x and x.get("p99_us")

            spread = f"{fmt_num(k['min_us'])}..{fmt_num(k['max_us'])}" if k else "—"
            md.append(f"| {fmt_size(b)} | {c(k)} | {c(o)} | {c(g)} | "
                      f"{ratio(k and k['median_us'], o and o['median_us'])} | "
                      f"{ratio(k and k['median_us'], g and g['median_us'])} | {spread} |")
            tail.append(f"| {fmt_size(b)} | {fmt_num(p(k))} | {fmt_num(p(o))} | "
                        f"{fmt_num(p(g))} | {ratio(p(k), p(o))} | {ratio(p(k), p(g))} |")
        md.append("")
        md.extend(tail)
        md.append("")

    # 2. ResNet-50
    rn = [(k, v) for k, v in cell.items() if k[0] == "local" and k[2].startswith("resnet50")]
    if rn:
        total = rn[0][0][4]
        md.append(f"## ResNet-50 gradient step (161 tensors, {total:,} B): step time ms, "
                  "median [min..max] over launches")
        md.append("")
        md.append("kolo: 161 named `kolo_allreduce_async` then wait (kolo negotiates and fuses). "
                  "Open MPI: one fused buffer / 161 blocking `MPI_Allreduce` / 161 "
                  "`MPI_Iallreduce` + `MPI_Waitall`. Gloo: 161 `all_reduce(async_op=True)` then "
                  "wait / one fused buffer.")
        md.append("")
        md.append("| np | kolo 161 async | MPI fused | MPI 161 blocking | MPI 161 non-blocking "
                  "| Gloo 161 async | Gloo fused | kolo/best MPI | kolo/Gloo 161 async |")
        md.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for np_ in sorted({k[3] for k, _ in rn}):
            def ms(impl, kind):
                x = get("local", impl, kind, np_, total)
                if not x:
                    return None, "—"
                return x["median_us"], (f"{x['median_us'] / 1e3:.1f} "
                                        f"[{x['min_us'] / 1e3:.1f}..{x['max_us'] / 1e3:.1f}]")
            kv, ks = ms("kolo", "resnet50_step")
            cols = [ms("openmpi", "resnet50_step"), ms("openmpi", "resnet50_step_161"),
                    ms("openmpi", "resnet50_step_161nb")]
            gv, gs = ms("gloo", "resnet50_step")
            gfv, gfs = ms("gloo", "resnet50_step_fused")
            mpi_best = min((v for v, _ in cols if v is not None), default=None)
            md.append(f"| {np_} | {ks} | {' | '.join(s for _, s in cols)} | {gs} | {gfs} | "
                      f"{ratio(kv, mpi_best)} | {ratio(kv, gv)} |")
        md.append("")

    # 3. network namespaces
    ns_sizes = sorted({k[4] for k in cell if k[0] == "netns" and k[2] == "allreduce"})
    if ns_sizes:
        md.append("## TCP between two network namespaces (veth pair), np = 2, one rank per "
                  "namespace")
        md.append("")
        md.append("kolo: coordinator + one agent per namespace, `kolo run -H nsA:1,nsB:1`; "
                  "Open MPI: `--mca btl tcp,self`, orted started in the other namespace by "
                  "bench/nsrsh.sh; Gloo: one rank per namespace, GLOO_SOCKET_IFNAME = the veth.")
        md.append("")
        md.append("Cells: median / p99 µs (bus bandwidth); ratios of the medians. \"kolo, "
                  "sealed\" is kolo with `--encrypt-data` (AES-256-GCM records on the data "
                  "plane); sealed/kolo gives its cost at the median and at p99.")
        md.append("")
        md.append("| size | kolo | kolo, sealed | Open MPI (TCP) | Gloo (TCP) | kolo/MPI | "
                  "kolo/Gloo | sealed/kolo p50 | sealed/kolo p99 | sealed/MPI | sealed/Gloo |")
        md.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for b in ns_sizes:
            k = get("netns", "kolo", "allreduce", 2, b)
            ks = get("netns", "kolo-sealed", "allreduce", 2, b)
            o = get("netns", "openmpi", "allreduce", 2, b)
            g = get("netns", "gloo", "allreduce", 2, b)

            def c(x):
                if not x:
                    return "—"
                p99 = f" / {fmt_num(x['p99_us'])}" if x.get("p99_us") is not None else ""
                return f"{fmt_num(x['median_us'])}{p99} ({fmt_bw(x['busbw_gbs'])})"
            md.append(f"| {fmt_size(b)} | {c(k)} | {c(ks)} | {c(o)} | {c(g)} | "
                      f"{ratio(k and k['median_us'], o and o['median_us'])} | "
                      f"{ratio(k and k['median_us'], g and g['median_us'])} | "
                      f"{ratio(ks and ks['median_us'], k and k['median_us'])} | "
                      f"{ratio(ks and ks.get('p99_us'), k and k.get('p99_us'))} | "
                      f"{ratio(ks and ks['median_us'], o and o['median_us'])} | "
                      f"{ratio(ks and ks['median_us'], g and g['median_us'])} |")
        md.append("")
        rtt = get("netns", "tcp", "rtt", 2, 4)
        k4 = get("netns", "kolo", "allreduce", 2, 4)
        if rtt:
            line = (f"TCP round trip between the namespaces (bench/tcp_rtt.c, a 4-byte "
                    f"ping-pong, TCP_NODELAY): {fmt_num(rtt['median_us'])} µs median, "
                    f"{fmt_num(rtt['p99_us'])} µs p99.")
            if k4:
                line += (f" kolo's 4 B allreduce = {k4['median_us'] / rtt['median_us']:.2f}× "
                         f"the round trip at the median")
                if k4.get("p99_us") and rtt.get("p99_us"):
                    line += f", {k4['p99_us'] / rtt['p99_us']:.2f}× at p99"
                line += " (target ≤ 2×)."
            md.append(line)
            md.append("")
        if veth:
            md.append("Bytes sent on the veth per launch (sanity check that the data crossed "
                      "it): " + "; ".join(
                          f"{t}: {statistics.median(v) / 1e6:,.0f} MB" for t, v in
                          sorted(veth.items())) + ".")
            md.append("")

    # 4. coordinator load
    if loads:
        md.append("## Coordinator capacity (bench/coord_load.c)")
        md.append("")
        md.append("One `kolo coordinator` on loopback; the load generator plays one fake agent "
                  "and N ranks of one job, sending what libkolo sends for the 161 ResNet-50 "
                  "tensors of a step (bench/coord_load.c): `rounds` (the default: the ranks "
                  "agree among themselves; the coordinator gets one parked long-poll per rank "
                  "and the periodic telemetry reports, steps paced at 100/s), `per-tensor` "
                  "(KOLO_FAST_PATH=0: one Negotiate call per tensor) and `batched` (one call per "
                  "step, the coordinator path's best case). The generator shares the 2 CPUs "
                  "with the coordinator. Target: ≤ 1 ms of coordinator CPU per step at 1024 "
                  "ranks and 100 steps/s.")
        md.append("")
        md.append("| mode | ranks | steps/s | ms/step | coordinator CPU ms/step | generator CPU "
                  "ms/step | Negotiate calls/step | Report calls/step | first step (full "
                  "requests) ms | rendezvous ms |")
        md.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        order = {"rounds": 0, "per-tensor": 1, "batched": 2}
        for r in sorted(loads, key=lambda r: (order.get(r.get("mode", "batched"), 3), r["ranks"])):
            md.append(f"| {r.get('mode', 'batched')} | {r['ranks']} | {r['steps_per_s']:.1f} | "
                      f"{r['step_ms']:.2f} | "
                      f"{r['coord_cpu_ms_per_step']:.2f} | {r['client_cpu_ms_per_step']:.2f} | "
                      f"{r['negotiate_calls_per_step']:.2f} | "
                      f"{r.get('report_calls_per_step', 0):.2f} | {r['first_step_ms']:.1f} | "
                      f"{r['rendezvous_ms']:.0f} |")
        md.append("")

    # Full table
    md.append("## All groups")
    md.append("")
    md.append("| scenario | impl | kind | np | size | median µs | launches min..max µs | n "
              "| algbw GB/s | busbw GB/s | mean load1 |")
    md.append("|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for s in summary:
        md.append(f"| {s['scenario']} | {IMPL_NAMES.get(s['impl'], s['impl'])} | {s['kind']} | "
                  f"{s['np']} | {fmt_size(s['bytes'])} | {fmt_num(s['median_us'])} | "
                  f"{fmt_num(s['min_us'])}..{fmt_num(s['max_us'])} | {s['launches']} | "
                  f"{fmt_bw(s['algbw_gbs'])} | {fmt_bw(s['busbw_gbs'])} | {s['mean_load1']} |")
    md.append("")

    with open(out_json, "w") as f:
        json.dump({"machine": machine, "summary": summary, "coord_load": loads,
                   "veth_tx_bytes": veth, "failures": failures, "records": records}, f, indent=1)
        f.write("\n")
    with open(out_md, "w") as f:
        f.write("\n".join(md))


if __name__ == "__main__":
    main()
