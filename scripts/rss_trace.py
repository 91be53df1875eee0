"""Peak RSS of every process a command starts, sampled at 50 Hz, with a thinned series per
process: how results/input_stage_cpu.md saw a rank's memory grow over the steps.

    OMP_NUM_THREADS=1 python scripts/rss_trace.py .venv/bin/fsbench run --trainer freescale \
        --world-size 2 --steps 64 --warmup 4 --store /tmp/rss --format json
"""
import subprocess, sys, time, psutil, json
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
root = psutil.Process(p.pid)
series = {}
t0 = time.time()
while p.poll() is None:
    try:
        kids = root.children(recursive=True)
    except psutil.Error:
        break
    for k in kids:
        try:
            rss = k.memory_info().rss / 2**20
            name = " ".join(k.cmdline()[-3:])[:60]
        except psutil.Error:
            continue
        series.setdefault(k.pid, {"name": name, "pts": []})["pts"].append((round(time.time()-t0, 2), round(rss)))
    time.sleep(0.02)
err = p.stderr.read().decode()
if p.returncode: print(err[-2000:])
for pid, s in series.items():
    pts = s["pts"]
    if max(r for _, r in pts) < 150: continue
    peak = max(r for _, r in pts)
    # subsample series to ~12 points
    step = max(1, len(pts)//12)
    print(pid, s["name"], "peak", peak, "series", pts[::step])
