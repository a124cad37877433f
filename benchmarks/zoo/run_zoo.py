#!/usr/bin/env python3
"""Times the zoo's architectures in PyTorch eager and in `mpigrad train` side by side, A B A B,
at 1 and 2 threads, and prints (and can write into docs/benchmarks.md) the table of step times
and their ratio PyTorch / mpigrad (above 1: mpigrad is faster). Optional, never needed by CI:
torch, torchvision, transformers, h5py, numpy; run export_models.py first.

For each model and thread count, in one run:
  * a PyTorch worker process (OMP/MKL threads and torch.set_num_threads set to the count) builds
    the module from the same seed as the exported file, with the same optimizer, and waits;
  * each round, it times --steps training steps (batch from the same HDF5 file, in order:
    forward, cross-entropy, zero_grad, backward, optimizer step, loss.item()), then an
    `mpigrad train` process (MPIGRAD_NUM_THREADS set to the count) trains --warmup + --steps
    steps of the same file with the same batch size and optimizer; its per-step times are read
    from the metrics it logs every step (batch / samples_per_s: loader, step and hooks, as a
    user's run spends them) and its first --warmup steps are left out. PyTorch warms up
    --warmup steps once, before the first round;
  * the ratio is the median PyTorch step over the median mpigrad step of all rounds; the range
    beside it is the lowest and highest ratio of one round's medians, the noise of the machine;
  * peak RSS of both: the worker's own ru_maxrss, and the mpigrad process's from wait4 (the
    largest over its rounds).

Results go to --results (default build/zoo/results), one JSON file per model and thread count;
a model measured already is not measured again unless --force, so the run can be stopped and
resumed, and one model can be measured alone while working on it. From the repository root,
after scripts/build.sh (build/bin/mpigrad):

    python3 benchmarks/zoo/export_models.py --all      # ONNX, data and configs into build/zoo
    python3 benchmarks/zoo/run_zoo.py                  # the 7 smaller models, 1 and 2 threads
    python3 benchmarks/zoo/run_zoo.py --models gpt2_124m,bert_base --llmc /path/to/llm.c
    python3 benchmarks/zoo/run_zoo.py --models resnet18 --threads 1 --force   # one, again

    # the table of everything measured so far, and the same into docs/benchmarks.md:
    python3 benchmarks/zoo/run_zoo.py --table --update-docs docs/benchmarks.md

    # the image models at the size they were built for (export_models.py --image-size 224
    # first); their results go to their own folder (ZOO/results-224px), so the table of the
    # zoo's 32 x 32 runs and its geometric mean never mix sizes:
    python3 benchmarks/zoo/run_zoo.py --models resnet18,resnet50 --image-size 224
"""
import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

DOCS_BEGIN = "<!-- zoo table: written by benchmarks/zoo/run_zoo.py --update-docs -->"
DOCS_END = "<!-- end of zoo table -->"


# ---- the PyTorch side: a worker process per model and thread count ----

def torch_worker(name, threads, zoo, image_size):
    """Serves `steps K` on stdin with one JSON line of K step times; `quit` ends it."""
    import h5py
    import torch
    import torch.nn.functional as F
    import resource
    import zoo_models

    torch.set_num_threads(threads)
    model = zoo_models.BY_NAME[name]
    module = model.build().train()
    optimizer = model.optimizer_for(module.parameters())
    with h5py.File(os.path.join(zoo, zoo_models.file_stem(name, image_size) + ".h5")) as f:
        x_all, y_all = torch.from_numpy(f["x"][()]), torch.from_numpy(f["y"][()])
    batches = x_all.shape[0] // model.batch
    position = [0]

    def step():
        start = position[0] % batches * model.batch
        position[0] += 1
        x = x_all[start:start + model.batch]
        if x.dtype == torch.uint8:
            x = x.float().div_(255)  # as mpigrad's loader scales uint8 images
        y = y_all[start:start + model.batch]
        loss = F.cross_entropy(module(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        times, cpu_times = [], []
        for _ in range(int(words[1])):
            begin, begin_cpu = time.perf_counter(), time.process_time()
            step()
            times.append(time.perf_counter() - begin)
            cpu_times.append(time.process_time() - begin_cpu)
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({"times": times, "cpu_times": cpu_times, "peak_rss_mib": peak_kib / 1024}),
              flush=True)


class TorchSide:
    def __init__(self, name, threads, zoo, python, image_size):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        self.process = subprocess.Popen(
            [python, os.path.abspath(__file__), "--torch-worker", name, "--threads", str(threads),
             "--zoo", zoo, "--image-size", str(image_size)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self._reply()

    def _reply(self):
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the PyTorch worker ended (exit status {self.process.wait()})")
        return json.loads(line)

    def steps(self, count):
        self.process.stdin.write(f"steps {count}\n")
        self.process.stdin.flush()
        return self._reply()

    def close(self):
        if self.process.poll() is None:
            try:
                self.process.stdin.write("quit\n")
                self.process.stdin.flush()
                self.process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


# ---- the mpigrad side: one `mpigrad train` process a round ----

def process_cpu_seconds(pid):
    """User + system CPU time of a process, all its threads, from /proc (10 ms ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def mpigrad_round(mpigrad, stem, threads, zoo, warmup, steps, batch, timeout):
    """One `mpigrad train` process on STEM.ini: its per-step times from the metrics it logs, its
    CPU time over the timed steps (read from /proc as the metrics lines of the first and the last
    timed step appear), and its peak RSS."""
    out_dir = tempfile.mkdtemp(prefix=f"zoo-{stem}-", dir=zoo)
    env = dict(os.environ, MPIGRAD_NUM_THREADS=str(threads))
    env.setdefault("OPENBLAS_CORETYPE", "SkylakeX")  # see core/threads.h
    command = [mpigrad, "train", "--config", stem + ".ini",
               f"--train.max_steps={warmup + steps}", f"--train.out_dir={out_dir}"]
    log_path = os.path.join(out_dir, "stdout.txt")
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    cpu_at = {}  # metrics lines written -> CPU seconds then
    try:
        with open(log_path, "w") as log:
            process = subprocess.Popen(command, cwd=zoo, env=env, stdout=log,
                                       stderr=subprocess.STDOUT)
            try:
                deadline = time.time() + timeout
                while True:
                    pid, status, usage = os.wait4(process.pid, os.WNOHANG)
                    if pid:
                        break
                    if time.time() > deadline:
                        raise RuntimeError(f"`{' '.join(command)}` ran past {timeout} s")
                    lines = count_lines(metrics_path)
                    for mark in (warmup, warmup + steps):
                        if mark not in cpu_at and lines >= mark:
                            cpu_at[mark] = process_cpu_seconds(process.pid)
                    time.sleep(0.01)
            except BaseException:
                process.kill()
                os.wait4(process.pid, 0)
                raise
            process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            with open(log_path) as log:
                tail = log.read().strip().splitlines()[-3:]
            raise RuntimeError(f"`{' '.join(command)}` (in {zoo}) exited with status "
                               f"{process.returncode}: {' | '.join(tail)}")
        records = []
        with open(metrics_path) as f:
            for line in f:
                record = json.loads(line)
                if "samples_per_s" in record and record.get("samples_per_s"):
                    records.append(record)
        times = [batch / r["samples_per_s"] for r in records if r["step"] > warmup]
        if len(times) != steps:
            raise RuntimeError(f"mpigrad logged {len(times)} timed steps, expected {steps}")
        cpu = None
        if len(cpu_at) == 2 and cpu_at[warmup + steps] > cpu_at[warmup]:
            cpu = (cpu_at[warmup + steps] - cpu_at[warmup]) / steps
        return {"times": times, "cpu_step_s": cpu, "peak_rss_mib": usage.ru_maxrss / 1024}
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


# ---- llm.c's CPU trainer, a further baseline for GPT-2 124M (--llmc DIR) ----

def llmc_round(llmc_dir, threads, warmup, steps, timeout):
    """Runs llm.c's ./train_gpt2 (files from llmc_inputs.py) until it has printed warmup + steps
    "step N: ... (took X ms)" lines, then stops it: its own loop runs 41 steps with validation
    and sampling between them, none of which its "took" time covers."""
    import re
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    process = subprocess.Popen(["stdbuf", "-oL", "./train_gpt2"], cwd=llmc_dir, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    times, deadline = [], time.time() + timeout
    try:
        for line in process.stdout:
            match = re.match(r"step (\d+): train loss \S+ \(took ([0-9.]+) ms\)", line)
            if match:
                times.append(float(match.group(2)) / 1e3)
            if len(times) >= warmup + steps or time.time() > deadline:
                break
    finally:
        process.kill()
        _, _, usage = os.wait4(process.pid, 0)
        process.returncode = -9
        process.stdout.close()
    if len(times) < warmup + steps:
        raise RuntimeError(f"llm.c's train_gpt2 in {llmc_dir} printed {len(times)} steps, "
                           f"expected {warmup + steps}")
    return {"times": times[warmup:], "peak_rss_mib": usage.ru_maxrss / 1024}


# ---- one model at one thread count ----

def measure(model, threads, args):
    import zoo_models
    steps = args.steps or model.steps
    warmup = args.warmup if args.warmup is not None else model.warmup
    stem = zoo_models.file_stem(model.name, args.image_size)
    title = model.title
    if stem != model.name:
        title += f", {args.image_size}x{args.image_size}"
    result = {"model": model.name, "title": title, "threads": threads,
              "image_size": args.image_size if model.kind == "image" else None,
              "batch": model.batch, "optimizer": model.optimizer, "seq_len": model.seq_len,
              "steps": steps, "warmup": warmup, "rounds": args.rounds,
              "load_before": os.getloadavg()[0],
              "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "machine": machine()}
    torch_side = TorchSide(model.name, threads, os.path.abspath(args.zoo), args.python,
                           args.image_size)
    torch_rounds, mpigrad_rounds, torch_rss, mpigrad_rss = [], [], 0.0, 0.0
    torch_cpu, mpigrad_cpu = [], []
    llmc = args.llmc if model.name == "gpt2_124m" else None
    llmc_rounds, llmc_rss = [], 0.0
    try:
        torch_side.steps(warmup)
        for round_index in range(args.rounds):
            reply = torch_side.steps(steps)
            torch_rounds.append(reply["times"])
            torch_cpu += reply["cpu_times"]
            torch_rss = reply["peak_rss_mib"]
            reply = mpigrad_round(os.path.abspath(args.mpigrad), stem, threads,
                                  os.path.abspath(args.zoo), warmup, steps, model.batch,
                                  args.timeout)
            mpigrad_rounds.append(reply["times"])
            if reply["cpu_step_s"]:
                mpigrad_cpu.append(reply["cpu_step_s"])
            mpigrad_rss = max(mpigrad_rss, reply["peak_rss_mib"])
            also = ""
            if llmc:
                reply = llmc_round(llmc, threads, warmup, steps, args.timeout)
                llmc_rounds.append(reply["times"])
                llmc_rss = max(llmc_rss, reply["peak_rss_mib"])
                also = f", llm.c {1e3 * statistics.median(llmc_rounds[-1]):.1f} ms"
            print(f"  {model.name} t{threads} round {round_index + 1}/{args.rounds}: PyTorch "
                  f"{1e3 * statistics.median(torch_rounds[-1]):.1f} ms, mpigrad "
                  f"{1e3 * statistics.median(mpigrad_rounds[-1]):.1f} ms{also} a step "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
    except RuntimeError as error:
        result["error"] = str(error)
    except BaseException:
        torch_side.process.kill()
        raise
    finally:
        torch_side.close()
    result["load_after"] = os.getloadavg()[0]
    if "error" in result:
        return result
    torch_all = [t for r in torch_rounds for t in r]
    mpigrad_all = [t for r in mpigrad_rounds for t in r]
    round_ratios = [statistics.median(a) / statistics.median(b)
                    for a, b in zip(torch_rounds, mpigrad_rounds)]
    result.update({
        "torch_step_s": statistics.median(torch_all),
        "mpigrad_step_s": statistics.median(mpigrad_all),
        "ratio": statistics.median(torch_all) / statistics.median(mpigrad_all),
        "ratio_low": min(round_ratios), "ratio_high": max(round_ratios),
        "torch_peak_rss_mib": torch_rss, "mpigrad_peak_rss_mib": mpigrad_rss,
        "torch_times_s": torch_rounds, "mpigrad_times_s": mpigrad_rounds})
    if torch_cpu and mpigrad_cpu:
        result.update({
            "torch_cpu_step_s": statistics.median(torch_cpu),
            "mpigrad_cpu_step_s": statistics.median(mpigrad_cpu),
            "cpu_ratio": statistics.median(torch_cpu) / statistics.median(mpigrad_cpu)})
    if llmc_rounds:
        llmc_all = [t for r in llmc_rounds for t in r]
        llmc_ratios = [statistics.median(a) / statistics.median(b)
                       for a, b in zip(llmc_rounds, mpigrad_rounds)]
        result.update({
            "llmc_step_s": statistics.median(llmc_all),
            "llmc_ratio": statistics.median(llmc_all) / statistics.median(mpigrad_all),
            "llmc_ratio_low": min(llmc_ratios), "llmc_ratio_high": max(llmc_ratios),
            "llmc_peak_rss_mib": llmc_rss, "llmc_times_s": llmc_rounds})
    return result


def machine():
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    return f"{cpu}, {os.cpu_count()} cores"


# ---- the table ----

def load_results(results_dir):
    import zoo_models
    found = {}
    if os.path.isdir(results_dir):
        for entry in os.listdir(results_dir):
            if entry.endswith(".json"):
                with open(os.path.join(results_dir, entry)) as f:
                    result = json.load(f)
                found[(result["model"], result["threads"])] = result
    order = {model.name: index for index, model in enumerate(zoo_models.MODELS)}
    return [found[key] for key in sorted(found, key=lambda k: (k[1], order.get(k[0], 99), k[0]))]


def geometric_mean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def table(results):
    lines = ["| model | threads | PyTorch ms/step | mpigrad ms/step | PyTorch / mpigrad "
             "(rounds' range) | CPU time, PyTorch / mpigrad | peak RSS MiB, PyTorch / mpigrad "
             "| load |", "|---|---|---|---|---|---|---|---|"]
    by_threads, cpu_by_threads = {}, {}
    for r in results:
        if "error" in r:
            lines.append(f"| {r['title']} | {r['threads']} | | | fails: {r['error'][:120]} | | | |")
            continue
        by_threads.setdefault(r["threads"], []).append(r["ratio"])
        if "cpu_ratio" in r:
            cpu_by_threads.setdefault(r["threads"], []).append(r["cpu_ratio"])
        cpu = f"{r['cpu_ratio']:.2f}" if "cpu_ratio" in r else ""
        lines.append(
            f"| {r['title']} | {r['threads']} | {1e3 * r['torch_step_s']:.1f} | "
            f"{1e3 * r['mpigrad_step_s']:.1f} | **{r['ratio']:.2f}** ({r['ratio_low']:.2f}-"
            f"{r['ratio_high']:.2f}) | {cpu} | {r['torch_peak_rss_mib']:.0f} / "
            f"{r['mpigrad_peak_rss_mib']:.0f} | {r['load_before']:.1f}-{r['load_after']:.1f} |")
    for threads, ratios in sorted(by_threads.items()):
        cpu = cpu_by_threads.get(threads, [])
        cpu_mean = f"{geometric_mean(cpu):.2f}" if len(cpu) == len(ratios) else ""
        lines.append(f"| geometric mean ({len(ratios)} models) | {threads} | | | "
                     f"**{geometric_mean(ratios):.2f}** | {cpu_mean} | | |")
    llmc = [r for r in results if "llmc_step_s" in r]
    if llmc:
        lines += ["", "| model | threads | llm.c ms/step | mpigrad ms/step | llm.c / mpigrad "
                  "(rounds' range) | peak RSS MiB, llm.c / mpigrad |", "|---|---|---|---|---|---|"]
        for r in llmc:
            lines.append(
                f"| {r['title']} | {r['threads']} | {1e3 * r['llmc_step_s']:.1f} | "
                f"{1e3 * r['mpigrad_step_s']:.1f} | **{r['llmc_ratio']:.2f}** "
                f"({r['llmc_ratio_low']:.2f}-{r['llmc_ratio_high']:.2f}) | "
                f"{r['llmc_peak_rss_mib']:.0f} / {r['mpigrad_peak_rss_mib']:.0f} |")
    return "\n".join(lines)


def update_docs(path, text):
    with open(path) as f:
        page = f.read()
    begin, end = page.find(DOCS_BEGIN), page.find(DOCS_END)
    if begin < 0 or end < begin:
        sys.exit(f"run_zoo.py: {path} has no '{DOCS_BEGIN}' ... '{DOCS_END}' block to replace")
    page = page[:begin] + DOCS_BEGIN + "\n" + text + "\n" + page[end:]
    with open(path + ".tmp", "w") as f:
        f.write(page)
    os.replace(path + ".tmp", path)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="comma-separated names (default: all but the large)")
    parser.add_argument("--all", action="store_true", help="the large models too")
    parser.add_argument("--threads", default="1,2", help="thread counts, e.g. 1,2 (default)")
    parser.add_argument("--rounds", type=int, default=3, help="A B rounds (3)")
    parser.add_argument("--steps", type=int, help="timed steps a round and side (per model)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (per model)")
    parser.add_argument("--zoo", default="build/zoo", help="export_models.py's --out")
    parser.add_argument("--mpigrad", default="build/bin/mpigrad")
    parser.add_argument("--python", default=sys.executable, help="for the PyTorch worker")
    parser.add_argument("--results", help="folder of result JSON (ZOO/results)")
    parser.add_argument("--force", action="store_true", help="measure again what was measured")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds an mpigrad run")
    parser.add_argument("--llmc", metavar="DIR",
                        help="gpt2_124m: also time llm.c's ./train_gpt2 in DIR each round "
                             "(built there, inputs from llmc_inputs.py)")
    parser.add_argument("--table", action="store_true", help="only print the table")
    parser.add_argument("--update-docs", metavar="PAGE", help="write the table into PAGE")
    parser.add_argument("--image-size", type=int, default=32,
                        help="image models' height and width, as exported (32); results of "
                             "other sizes go to ZOO/results-Npx")
    parser.add_argument("--torch-worker", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_worker:
        torch_worker(args.torch_worker, int(args.threads), args.zoo, args.image_size)
        return
    import zoo_models
    default_size = args.image_size == zoo_models.IMAGE_SHAPE[1]
    if args.image_size < 1:
        sys.exit(f"run_zoo.py: --image-size {args.image_size} is not a size in pixels")
    results_dir = args.results or os.path.join(
        args.zoo, "results" if default_size else f"results-{args.image_size}px")
    if not args.table:
        if args.models:
            names = [n.strip() for n in args.models.split(",") if n.strip()]
            unknown = [n for n in names if n not in zoo_models.BY_NAME]
            if unknown:
                sys.exit(f"run_zoo.py: unknown model(s) {', '.join(unknown)}; known: "
                         f"{', '.join(zoo_models.BY_NAME)}")
            models = [zoo_models.BY_NAME[n] for n in names]
        else:
            models = [m for m in zoo_models.MODELS if args.all or not m.large]
        if not default_size:
            if not args.models:
                models = [m for m in models if m.kind == "image"]
            others = [m.name for m in models if m.kind != "image"]
            if others:
                sys.exit(f"run_zoo.py: --image-size is for image models; "
                         f"{', '.join(others)}: token models, no images")
        os.makedirs(results_dir, exist_ok=True)
        for threads in [int(t) for t in args.threads.split(",")]:
            for model in models:
                path = os.path.join(results_dir, f"{model.name}.t{threads}.json")
                if os.path.exists(path) and not args.force:
                    print(f"{model.name} t{threads}: measured already ({path}; --force again)")
                    continue
                stem = zoo_models.file_stem(model.name, args.image_size)
                if not os.path.exists(os.path.join(args.zoo, stem + ".onnx")):
                    size = "" if default_size else f" --image-size {args.image_size}"
                    sys.exit(f"run_zoo.py: {args.zoo}/{stem}.onnx is missing; run "
                             f"export_models.py --models {model.name}{size}")
                print(f"{model.name} t{threads}: load {os.getloadavg()[0]:.1f}", flush=True)
                result = measure(model, threads, args)
                with open(path + ".tmp", "w") as f:
                    json.dump(result, f, indent=1)
                os.replace(path + ".tmp", path)
                if "error" in result:
                    print(f"  {model.name} t{threads}: {result['error']}", flush=True)
                else:
                    print(f"  {model.name} t{threads}: ratio {result['ratio']:.2f} "
                          f"({result['ratio_low']:.2f}-{result['ratio_high']:.2f})", flush=True)
    text = table(load_results(results_dir))
    print(text)
    if args.update_docs:
        update_docs(args.update_docs, text)


if __name__ == "__main__":
    main()
