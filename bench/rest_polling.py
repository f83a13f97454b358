"""What dashboards and scripts polling REST cost a training job (issue 15,
F13): a 2-rank job's time alone, under 50 pollers of kolo's REST API
(~260 requests/s: jobs, a job, its epochs, output, events, /metrics), and
under the same pollers aimed at a control server that is not kolo (the
CPU the pollers themselves take). Interleaved, REPS rounds; prints each
run and the medians, and writes a Markdown table with --out.

  /usr/bin/python3 bench/rest_polling.py [--reps 3] [--steps 20000] [--out FILE]

Needs a build (scripts/build.sh).
"""
import argparse
import http.client
import http.server
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from local_cluster import KOLO, ROOT, local_cluster
STEPS_PY = os.path.join(ROOT, "tests", "integration", "data", "allreduce_steps.py")


class Control(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = json.dumps({"jobs": [{"id": i, "state": "running"} for i in range(20)]}).encode()

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


def pollers(host, port, paths, n, period, stop):
    """n threads, each a keep-alive connection asking paths in turn."""
    count = [0]

    def loop(i):
        conn = http.client.HTTPConnection(host, port, timeout=10)
        k = i
        while not stop.is_set():
            try:
                conn.request("GET", paths[k % len(paths)])
                conn.getresponse().read()
                count[0] += 1
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection(host, port, timeout=10)
            k += 1
            stop.wait(period)

    ts = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    return ts, count


def run_job(rpc, steps):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    t0 = time.monotonic()
    out = subprocess.run([KOLO, "run", "-np", "2", "--coordinator", rpc, "--", "/usr/bin/python3",
                          STEPS_PY, str(steps), "0"], env=env, capture_output=True, text=True,
                         timeout=600)
    took = time.monotonic() - t0
    if out.returncode != 0 or out.stdout.count("done %d" % steps) != 2:
        sys.exit("job failed: %s %s" % (out.stdout[-500:], out.stderr[-500:]))
    return took


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--pollers", type=int, default=50)
    ap.add_argument("--period", type=float, default=0.19)
    ap.add_argument("--out")
    a = ap.parse_args()
    with local_cluster(slots=2, prefix="kolo-restpoll.") as (_, rpc, hport):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Control)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        kolo_paths = ["/api/v1/jobs", "/api/v1/jobs/1", "/api/v1/jobs/1/epochs",
                      "/api/v1/jobs/1/output?limit=50", "/api/v1/events", "/metrics",
                      "/api/v1/hosts"]
        results = {"alone": [], "control": [], "kolo": []}
        rates = {"control": [], "kolo": []}
        run_job(rpc, 200)  # job 1 exists for the pollers' job routes
        for rep in range(a.reps):
            for mode in ("alone", "control", "kolo"):
                stop = threading.Event()
                count = [0]
                if mode != "alone":
                    port = hport if mode == "kolo" else srv.server_address[1]
                    paths = kolo_paths if mode == "kolo" else ["/"]
                    _, count = pollers("127.0.0.1", port, paths, a.pollers, a.period, stop)
                    time.sleep(1)
                c0 = count[0]
                took = run_job(rpc, a.steps)
                if mode != "alone":
                    rates[mode].append((count[0] - c0) / took)
                stop.set()
                results[mode].append(took)
                print(json.dumps({"rep": rep, "mode": mode, "seconds": round(took, 3),
                                  "req_per_s": round(rates[mode][-1], 1) if mode != "alone"
                                  else 0}), flush=True)
                time.sleep(0.5)
        med = {m: statistics.median(v) for m, v in results.items()}
        worst = {m: max(v) for m, v in results.items()}
        summary = {"alone_s": med["alone"], "control_over_alone": med["control"] / med["alone"],
                   "kolo_over_alone": med["kolo"] / med["alone"],
                   "kolo_over_control": med["kolo"] / med["control"],
                   "kolo_req_per_s": statistics.median(rates["kolo"]),
                   "control_req_per_s": statistics.median(rates["control"])}
        print(json.dumps({"summary": summary}), flush=True)
        if a.out:
            with open(a.out, "w") as f:
                f.write("# REST polling against training (%s)\n\n" %
                        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
                f.write("`/usr/bin/python3 bench/rest_polling.py --reps %d --steps %d` on this "
                        "2-vCPU VM: a 2-rank job of %d checked allreduces (1000 doubles), alone, "
                        "under %d pollers of a control HTTP server, and under %d pollers of "
                        "kolo's REST API (%s), interleaved.\n\n" %
                        (a.reps, a.steps, a.steps, a.pollers, a.pollers, ", ".join(kolo_paths)))
                f.write("| load | job s median | worst | ratio to alone (median) | requests/s |\n")
                f.write("|---|---|---|---|---|\n")
                for m in ("alone", "control", "kolo"):
                    f.write("| %s | %.2f | %.2f | %.2f× | %s |\n" % (
                        m, med[m], worst[m], med[m] / med["alone"],
                        "%.0f" % statistics.median(rates[m]) if m in rates else "-"))
                f.write("\nkolo / control (median): **%.2f×**.\n" % summary["kolo_over_control"])

if __name__ == "__main__":
    main()
