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
              "openmpi-yield": "Open MPI, yield", "gloo": "Gloo"}


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


MPI_MODES = (("openmpi", "default"), ("openmpi-yield", "yield"))
RESNET_MPI = (("resnet50_step", "fused"), ("resnet50_step_161", "161 blocking"),
              ("resnet50_step_161nb", "161 non-blocking"))
RESNET_GLOO = (("resnet50_step", "161 async"), ("resnet50_step_fused", "fused"))


def best_of(cands, stat):
    """The (value, label) of the lowest `stat` among (summary or None, label) pairs."""
    got = [(c[stat], label) for c, label in cands if c and c.get(stat) is not None]
    return min(got, key=lambda x: x[0]) if got else (None, None)


def hosts_section(md, cell, records, machine):
    """The "Hosts" tables, one per shape (scenario "hosts-HxL"); returns their JSON."""
    shapes = {}
    for k in cell:
        if k[0].startswith("hosts-"):
            try:
                h, l_ = (int(x) for x in k[0][len("hosts-"):].split("x"))
            except ValueError:
                continue
            shapes[k[0]] = (h, l_)
    if not shapes:
        return {}
    bridge = defaultdict(lambda: defaultdict(list))
    restarts = defaultdict(list)
    failed = defaultdict(list)
    for r in records:
        if "agent_restart" in r:
            restarts[r["scenario"]].append(r)
        if r.get("failed"):
            failed[r["scenario"]].append(r)
        if "bridge_tx_bytes" in r:
            bridge[r["scenario"]][f"{r['impl_tag']} {r['mode']}"].append(r["bridge_tx_bytes"])

    def get(sc, impl, kind, np_, nbytes):
        return cell.get((sc, impl, kind, np_, nbytes))

    def pv(x, stat="median_us"):
        return x.get(stat) if x else None

    def c(x, scale=1.0):
        if not x:
            return "—"
        p99 = x.get("p99_us")
        return f"{fmt_num(x['median_us'] / scale)} / {fmt_num(p99 / scale if p99 else None)}"

    def rl(a, best):
        v, label = best
        return "—" if a is None or v is None else f"{ratio(a, v)} ({label})"

    md.append("## Hosts: H network namespaces × L ranks, on a bridge")
    md.append("")
    md.append("H namespaces, each with one veth (10.78.0.i/24) into a bridge in a namespace of "
              "its own; L ranks per namespace. kolo: a coordinator in namespace 0, one agent "
              "with L slots per namespace, `kolo run -np H·L -H h0:L,h1:L,...` (\"kolo, "
              "sealed\": the same with `--encrypt-data`). Open MPI: `mpirun --hostfile` with "
              "`slots=L` per namespace address, `--mca btl vader,self,tcp` (shared memory "
              "inside a namespace, TCP across), orted started by bench/nsrsh.sh; by default "
              "(no node is oversubscribed, so its ranks spin while they wait) and with "
              "`--mca mpi_yield_when_idle 1` (\"yield\"). Gloo: L ranks per namespace, "
              "GLOO_SOCKET_IFNAME = its veth. All H·L ranks share this machine's CPUs."
              + (f" Open MPI's default mode times at most {machine['hosts_spin_iters']} "
                 f"iterations per size and {machine['hosts_spin_resnet_steps']} ResNet steps "
                 f"per launch, within {machine['hosts_spin_timeout']} s (its p99 is over "
                 "those iterations)." if machine.get("hosts_spin_iters") else ""))
    md.append("")
    md.append("Cells: median / p99 µs (median over launches of each launch's median and p99). "
              "Ratios are kolo's over the peer's at the same statistic, below 1× kolo is "
              "faster; \"best MPI\" is the faster Open MPI mode at that statistic (named in "
              "brackets: default or yield).")
    md.append("")
    out = {}
    for sc in sorted(shapes, key=lambda s: (shapes[s][0] * shapes[s][1], shapes[s][0])):
        h, l_ = shapes[sc]
        np_ = h * l_
        sj = {"hosts": h, "ranks_per_host": l_, "np": np_, "allreduce": [], "resnet50": None,
              "tcp_rtt": None}
        out[sc[len("hosts-"):]] = sj
        md.append(f"### Hosts {h}×{l_} (np {np_})")
        md.append("")
        loads = [r["load1"] for r in records
                 if r.get("scenario") == sc and "impl" in r and "load1" in r]
        if loads:
            sj["load1_at_launch"] = {"median": statistics.median(loads), "max": max(loads)}
            md.append(f"1-minute load average at the launches: median "
                      f"{statistics.median(loads):g}, max {max(loads):g}, on "
                      f"{machine.get('nproc', '?')} CPUs.")
            md.append("")
        sizes = sorted({k[4] for k in cell if k[0] == sc and k[2] == "allreduce"})
        if sizes:
            md.append("| size | kolo | kolo, sealed | Open MPI | Open MPI, yield | Gloo | "
                      "kolo/best MPI p50 | kolo/best MPI p99 | kolo/Gloo p50 | kolo/Gloo p99 |")
            md.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for b in sizes:
            k, ks, o, oy, g = (get(sc, i, "allreduce", np_, b) for i in
                               ("kolo", "kolo-sealed", "openmpi", "openmpi-yield", "gloo"))
            mpis = [(o, "default"), (oy, "yield")]
            b50, b99 = best_of(mpis, "median_us"), best_of(mpis, "p99_us")
            md.append(f"| {fmt_size(b)} | {c(k)} | {c(ks)} | {c(o)} | {c(oy)} | {c(g)} | "
                      f"{rl(pv(k), b50)} | {rl(pv(k, 'p99_us'), b99)} | "
                      f"{ratio(pv(k), pv(g))} | {ratio(pv(k, 'p99_us'), pv(g, 'p99_us'))} |")

            def r2(a, bv):
                return round(a / bv, 4) if a is not None and bv else None
            sj["allreduce"].append({
                "bytes": b,
                **{f"{n}_{s}": pv(x, f"{s}_us") for n, x in
                   (("kolo", k), ("kolo_sealed", ks), ("openmpi", o), ("openmpi_yield", oy),
                    ("gloo", g)) for s in ("median", "p99")},
                "best_mpi_mode_p50": b50[1], "best_mpi_mode_p99": b99[1],
                "kolo_over_best_mpi_p50": r2(pv(k), b50[0]),
                "kolo_over_best_mpi_p99": r2(pv(k, "p99_us"), b99[0]),
                "kolo_over_gloo_p50": r2(pv(k), pv(g)),
                "kolo_over_gloo_p99": r2(pv(k, "p99_us"), pv(g, "p99_us")),
            })
        if sizes:
            md.append("")
        rtt = get(sc, "tcp", "rtt", 2, 4)
        if rtt:
            sj["tcp_rtt"] = {"median_us": rtt["median_us"], "p99_us": rtt.get("p99_us")}
            parts = []
            for name, x in (("kolo", get(sc, "kolo", "allreduce", np_, 4)),
                            ("kolo, sealed", get(sc, "kolo-sealed", "allreduce", np_, 4)),
                            ("Open MPI", get(sc, "openmpi", "allreduce", np_, 4)),
                            ("Open MPI, yield", get(sc, "openmpi-yield", "allreduce", np_, 4)),
                            ("Gloo", get(sc, "gloo", "allreduce", np_, 4))):
                if x:
                    p99 = (f", p99 {x['p99_us'] / rtt['p99_us']:.2f}×"
                           if x.get("p99_us") and rtt.get("p99_us") else "")
                    parts.append(f"{name} {x['median_us'] / rtt['median_us']:.2f}×{p99}")
                    sj["tcp_rtt"][f"{name} 4B p50 / rtt p50"] = round(
                        x["median_us"] / rtt["median_us"], 3)
            md.append(f"TCP round trip from namespace 0 to namespace 1 across the bridge "
                      f"(bench/tcp_rtt.c, 4-byte ping-pong, measured in every round): "
                      f"{fmt_num(rtt['median_us'])} µs median, {fmt_num(rtt.get('p99_us'))} µs "
                      f"p99. **4 B p50 / RTT**: " + "; ".join(parts) + " (p99: over the RTT's "
                      "p99).")
            floor = get(sc, "tcp", "rtt_2x2", 4, 4)
            if floor and np_ == 4:
                sj["tcp_rtt"]["floor_2x2"] = {"median_us": floor["median_us"],
                                              "p99_us": floor.get("p99_us")}
                kx = get(sc, "kolo", "allreduce", np_, 4)
                over = (f" kolo's 4 B p50 is {kx['median_us'] / floor['median_us']:.2f}× that."
                        if kx else "")
                md.append("")
                md.append(f"The floor of the 2 x 2 pattern (bench/tcp_rtt.c `local`: that "
                          f"ping-pong, each host's second rank handing its 4 bytes over shared "
                          f"memory and waiting for the result, yield then futex): "
                          f"{fmt_num(floor['median_us'])} µs median, "
                          f"{fmt_num(floor.get('p99_us'))} µs p99.{over}")
            md.append("")
        floor = next((v for k, v in cell.items() if k[0] == sc and k[1] == "floor"), None)
        if floor:
            fb = floor["bytes"]
            kx = get(sc, "kolo", "allreduce", np_, fb)
            sj["copy_floor"] = {"bytes": fb, "median_us": floor["median_us"],
                                "p99_us": floor.get("p99_us"),
                                "kolo_over_floor_p50": round(kx["median_us"] / floor["median_us"], 3)
                                if kx else None}
            over = (f" kolo's {fmt_size(fb)} p50 is {kx['median_us'] / floor['median_us']:.2f}× "
                    "that." if kx else "")
            md.append(f"The floor under {fmt_size(fb)} on {h} × {l_} (bench/copy_floor.c: "
                      f"{np_} processes doing only the copies, reductions and TCP transfers of "
                      f"the hierarchical pattern, a host's ranks never waiting for each other): "
                      f"{fmt_num(floor['median_us'])} µs median, "
                      f"{fmt_num(floor.get('p99_us'))} µs p99.{over}")
            md.append("")
        total = next((k[4] for k in cell if k[0] == sc and k[2].startswith("resnet50")), None)
        if total:
            kr = get(sc, "kolo", "resnet50_step", np_, total)
            ksr = get(sc, "kolo-sealed", "resnet50_step", np_, total)
            mpis = [(get(sc, impl, kind, np_, total), f"{kn}, {mn}")
                    for impl, mn in MPI_MODES for kind, kn in RESNET_MPI]
            gls = [(get(sc, "gloo", kind, np_, total), kn) for kind, kn in RESNET_GLOO]
            variants = ([("kolo 161 async (fused by kolo)", kr), ("kolo sealed", ksr)] +
                        [(f"Open MPI {lab}", x) for x, lab in mpis] +
                        [(f"Gloo {lab}", x) for x, lab in gls])
            md.append(f"ResNet-50 step (161 tensors, {total:,} B), ms, median / p99 over "
                      "steps: " + "; ".join(f"{lab} {c(x, 1e3)}" for lab, x in variants if x) +
                      ".")
            md.append("")
            md.append("| ResNet-50 step | kolo ms | best Open MPI ms | best Gloo ms | "
                      "kolo/best MPI | kolo/best Gloo |")
            md.append("|---|---:|---:|---:|---:|---:|")
            rj = {"bytes": total}
            for stat, sname in (("median_us", "p50"), ("p99_us", "p99")):
                kv = pv(kr, stat)
                bm, bg = best_of(mpis, stat), best_of(gls, stat)

                def ms(v, label=None):
                    if v is None:
                        return "—"
                    return f"{v / 1e3:,.1f}" + (f" ({label})" if label else "")
                md.append(f"| {sname} | {ms(kv)} | {ms(*bm)} | {ms(*bg)} | {ratio(kv, bm[0])} | "
                          f"{ratio(kv, bg[0])} |")
                rj[sname] = {"kolo_us": kv, "kolo_sealed_us": pv(ksr, stat),
                             "best_mpi_us": bm[0], "best_mpi": bm[1],
                             "best_gloo_us": bg[0], "best_gloo": bg[1]}
            sj["resnet50"] = rj
            md.append("")
        if failed.get(sc):
            sj["failed_launches"] = [{"launch": r["launch"], "rc": r["rc"]} for r in failed[sc]]
            md.append("Failed launches (rc 124: stopped by its timeout; whatever a launch "
                      "reported before it failed is in the table): " + ", ".join(
                          f"{r['launch']} (rc {r['rc']})" for r in failed[sc]) + ".")
            md.append("")
        if restarts.get(sc):
            sj["agent_restarts"] = [{"agent": r["agent_restart"], "before": r["launch"]}
                                    for r in restarts[sc]]
            md.append(f"kolo agents restarted ({len(restarts[sc])}): the coordinator did not "
                      "list them alive within 20 s before a kolo launch (missed heartbeats while "
                      "the CPUs were held; see bench/README.md), so the bench restarted them: "
                      + ", ".join(
                          f"{r['agent_restart']} before {r['launch']}" for r in restarts[sc]) +
                      ".")
            md.append("")
        if sc in bridge:
            sj["bridge_tx_bytes"] = {t: v for t, v in bridge[sc].items()}
            md.append("Bytes the bridge forwarded per launch (its ports' TX, median over "
                      "rounds; evidence the traffic crossed it): " + "; ".join(
                          f"{t}: {statistics.median(v) / 1e6:,.0f} MB" for t, v in
                          sorted(bridge[sc].items())) + ".")
            md.append("")
    return out


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
        md.append("kolo: `kolo run` (its own transport choice on one host), "
                  "`kolo_allreduce_async` + `kolo_wait`; Open MPI: `mpirun --mca btl "
                  "vader,self` (shared memory), `MPI_Allreduce` and, in its own column (\"MPI "
                  "nb\"), `MPI_Iallreduce` + `MPI_Wait`, the shape of kolo's calls; Gloo: TCP "
                  "on lo.")
        md.append("")
        md.append("| size | kolo | Open MPI (vader) | MPI nb | Gloo (TCP lo) | kolo/MPI "
                  "| kolo/MPI nb | kolo/Gloo | kolo launches min..max |")
        md.append("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        # the tail: each launch's p99 over its iterations, median over launches
        tail = ["p99, µs (median over launches of each launch's p99):", "",
                "| size | kolo | Open MPI (vader) | MPI nb | Gloo (TCP lo) | kolo/MPI "
                "| kolo/MPI nb | kolo/Gloo |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for b in local_sizes:
            k, o, g = (get("local", impl, "allreduce", np_, b)
                       for impl in ("kolo", "openmpi", "gloo"))
            onb = get("local", "openmpi", "allreduce_nb", np_, b)

            def c(x):
                if not x:
                    return "—"
                bw = f" ({fmt_bw(x['busbw_gbs'])})" if b >= 4096 else ""
                return fmt_num(x["median_us"]) + bw

            def p(x):
                return x and x.get("p99_us")

            spread = f"{fmt_num(k['min_us'])}..{fmt_num(k['max_us'])}" if k else "—"
            md.append(f"| {fmt_size(b)} | {c(k)} | {c(o)} | {c(onb)} | {c(g)} | "
                      f"{ratio(k and k['median_us'], o and o['median_us'])} | "
                      f"{ratio(k and k['median_us'], onb and onb['median_us'])} | "
                      f"{ratio(k and k['median_us'], g and g['median_us'])} | {spread} |")
            tail.append(f"| {fmt_size(b)} | {fmt_num(p(k))} | {fmt_num(p(o))} | "
                        f"{fmt_num(p(onb))} | {fmt_num(p(g))} | {ratio(p(k), p(o))} | "
                        f"{ratio(p(k), p(onb))} | {ratio(p(k), p(g))} |")
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

    # 4. hosts: H namespaces x L ranks on a bridge
    hosts_json = hosts_section(md, cell, records, machine)

    # 5. coordinator load
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
                   "veth_tx_bytes": veth, "hosts": hosts_json, "failures": failures,
                   "records": records}, f, indent=1)
        f.write("\n")
    with open(out_md, "w") as f:
        f.write("\n".join(md))


if __name__ == "__main__":
    main()
