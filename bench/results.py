"""The tables of ``bench/RESULTS.md``, rendered from ``bench/results/*.json``.

    python bench/results.py            # rewrite every generated table in RESULTS.md
    python bench/results.py --check    # exit 1 if a table differs from its JSON
    python bench/results.py --print versus_st

In RESULTS.md a generated table sits between ``<!-- results: NAME -->`` and
``<!-- /results -->``; NAME is one of ``RENDERERS`` below, each reading the result files
it names. Everything outside the markers (the prose that explains the figures, tables with
no JSON behind them) is left as written. After a benchmark writes new JSON, run this and
read the prose again: it quotes some of the figures.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python bench/results.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common
from bench.quality.scoring import format_interval

DOCUMENT = common.ROOT / "bench" / "RESULTS.md"
BLOCK = re.compile(
    r"(?P<open><!-- results: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(?P<close><!-- /results -->)",
    re.DOTALL,
)


def load(results: Path, name: str) -> dict[str, Any]:
    """One result file, or a one-line error naming it."""
    path = results / name
    if not path.is_file():
        raise SystemExit(f"santa: error: no result file {path}")
    return json.loads(path.read_text())


def minus(text: str) -> str:
    """Negative numbers with a real minus sign, as the prose writes them."""
    return re.sub(r"-(?=\d)", "−", text)


def interval(row: dict[str, float], signed: bool = False) -> str:
    """``0.8553 [0.8237, 0.8851]`` (``signed``: ``+0.0205 [+0.0035, +0.0385]``)."""
    return minus(format_interval(row, signed=signed))


def times(ratio: float) -> str:
    """A ratio as ``1.23×``."""
    return f"{ratio:.2f}×"


def short_float(value: float) -> str:
    """A learning rate as the prose writes it: ``2e-5``."""
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{value:.0e}").replace("e+", "e")


def pair_name(pair: str) -> str:
    """``a - b`` → ``a − b``."""
    return pair.replace(" - ", " − ")


# --------------------------------------------------------------------------- renderers


def pipeline(results: Path) -> str:
    """Held-out metrics of the default pipeline's stages (its report.json)."""
    report = load(results, "pipeline_default.json")
    what = {"pretrain": "SDA + MEP", "finetune": "DR", "ance": "1 mined negative"}
    labels = _stage_rows(report, what, f"untrained ({report['recipe']} T5, random init)")
    columns = ("mrr@100", "ndcg@100", "recall@10", "recall@100")
    rows = [
        [label, *(f"{report['metrics'][system][c]:.3f}" for c in columns)]
        for system, label in labels.items()
    ]
    return common.format_table(["system", *columns], rows)


def _stage_rows(report: dict[str, Any], what: dict[str, str], untrained: str) -> dict[str, str]:
    """A pipeline report's systems, labelled: untrained, each stage with its steps, BM25."""
    steps = {stage["stage"]: stage["final_metrics"]["step"] for stage in report["stages"]}
    labels = {"untrained": untrained}
    for stage in steps:
        labels[f"santa ({stage})"] = f"santa ({stage}: {what[stage]}, {steps[stage]} steps)"
    labels["bm25"] = "BM25"
    return labels


def pipeline_minilm(results: Path) -> str:
    """Held-out metrics of the default demo (all-MiniLM-L6-v2; its report.json)."""
    report = load(results, "pipeline_minilm_default.json")
    labels = _stage_rows(
        report,
        {"pretrain": "SDA", "finetune": "DR", "ance": "1 mined negative"},
        "untrained all-MiniLM-L6-v2",
    )
    columns = ("mrr@100", "ndcg@100", "recall@1", "recall@10", "recall@100")
    rows = [
        [label, *(f"{report['metrics'][system][c]:.4f}" for c in columns)]
        for system, label in labels.items()
    ]
    return common.format_table(["system", *columns], rows)


def minilm_similarity(results: Path) -> str:
    """Zero-shot against fine-tuning with dot product or cosine (CoSQA dev)."""
    result = load(results, "minilm_similarity.json")["results"]
    labels = {
        "zero-shot": "zero-shot",
        "dot, τ=1 (before)": "fine-tuned with raw dot product, τ = 1 (the recipe before)",
        "cosine, τ=0.05 (now)": "fine-tuned with cosine, τ = 0.05 (the recipe now)",
    }
    rows = [
        [
            labels[name],
            f"{row['mrr@100']:.4f}",
            f"{row['train_s']:.0f} s" if row["train_s"] else None,
        ]
        for name, row in result.items()
    ]
    return common.format_table(["all-MiniLM-L6-v2 on CoSQA dev", "MRR@100", "training"], rows)


def refresh(results: Path) -> str:
    """Refresh seconds with 1 and 2 encoder actors."""
    result = load(results, "refresh.json")["refresh"]
    rows = []
    for label, corpus in result.items():
        by_actors = corpus["by_actors"]
        name = (
            f"stdlib, {corpus['docs']:,} pairs"
            if label.startswith("stdlib")
            else f"synthetic, {corpus['docs']:,} documents, {corpus['queries']:,} queries"
        )
        rows.append(
            [
                name,
                f"{by_actors['1']['refresh_s']:.1f} s",
                f"{by_actors['2']['refresh_s']:.1f} s",
                times(by_actors["2"]["speedup"]),
            ]
        )
    return common.format_table(["corpus", "1 actor", "2 actors", "speed-up"], rows)


def serve_batching(results: Path) -> str:
    """Serve latency and throughput without and with @serve.batch, by client count."""
    rows = [
        [
            "off" if row["max_batch_size"] == 1 else f"up to {row['max_batch_size']}",
            row["clients"],
            f"{row['p50_ms']:.1f} ms",
            f"{row['p99_ms']:.1f} ms",
            f"{row['requests_per_s']:.1f}",
            row.get("largest_batch", "-"),
        ]
        for row in load(results, "index_search_batching.json")["serve"]
    ]
    header = ["batching", "clients", "p50", "p99", "requests/s", "largest batch"]
    return common.format_table(header, rows, align="lrrrrr")


def scoder(results: Path) -> str:
    """The three systems of bench/quality/scoder.py."""
    result = load(results, "scoder.json")
    extra = result["iterations"] * result["steps_per_stage"]
    labels = {
        "warm-up": ("warm-up (in-batch negatives)", result["warmup_steps"]),
        "in-batch, same steps": ("in-batch, same steps", result["warmup_steps"] + extra),
        "scoder": (f"SCodeR, {result['iterations']} iterations", result["warmup_steps"] + extra),
    }
    rows = [
        [
            labels[name][0],
            labels[name][1],
            f"{row['cosqa_mrr@100']:.4f}",
            f"{row['stdlib_mrr@100']:.4f}",
        ]
        for name, row in result["results"].items()
    ]
    header = ["system", "dual-encoder steps", "CoSQA dev MRR@100", "stdlib test MRR@100"]
    return common.format_table(header, rows)


def scoder_iterations(results: Path) -> str:
    """SCodeR's iterations: discriminators' held-out accuracy, entropy, seconds."""
    iterations = load(results, "scoder.json")["per_iteration"]
    header = [
        "iteration",
        "D_φ held-out acc.",
        "D_ψ held-out acc.",
        "soft-label entropy",
        "mine s",
        "D s",
        "held-out scoring s",
        "G s",
        "total s",
    ]
    rows = [
        [
            row["iteration"],
            f"{row['heldout_accuracy_text_code']:.3f}",
            f"{row['heldout_accuracy_code_code']:.3f}",
            f"{row['soft_label_entropy']:.3f}",
            f"{row['mine_s']:.0f}",
            f"{row['discriminators_s']:.0f}",
            f"{row['soft_labels_s']:.0f}",
            f"{row['dual_encoder_s']:.0f}",
            f"{row['iteration_s']:,.0f}",
        ]
        for row in iterations
    ]
    return common.format_table(header, rows, align="r" * len(header))


def _versus_st(name: str, *, speed: bool) -> Callable[[Path], str]:
    """A bench/perf/versus_st.py result against sentence-transformers MNRL."""

    def render(results: Path) -> str:
        result = load(results, name)
        settings = result["settings"]
        checkpointing = "model.gradient_checkpointing=true" in settings["overrides"]
        labels = {
            "santa-ray": "santa, Ray Train, 2 workers, gradient checkpointing"
            if checkpointing
            else "santa, Ray Train, 2 workers × 1 thread",
            "santa-local": "santa's loop, 1 process × 2 threads, no Ray",
            "st-mnrl": "sentence-transformers, MNRL",
            "st-cached": f"sentence-transformers, CachedMNRL (mini-batch {settings['mini_batch']})",
        }
        header = ["system", "loop pairs/s", "vs ST MNRL"]
        if speed:
            header += ["end to end", "speed vs ST MNRL"]
        else:
            header += [f"end to end, {settings['steps']} steps"]
        header += ["fixed", "ahead of ST MNRL, in steps"]
        rows = []
        for system, row in result["summary"].items():
            cells = [labels[system], f"{row['loop_pairs_per_s']:.2f}"]
            cells.append(times(row["loop_vs_reference"]))
            cells.append(f"{row['end_to_end_s']:.1f} s")
            if speed:
                cells.append(times(row["end_to_end_vs_reference"]))
            cells.append(minus(f"{row['fixed_s']:.1f} s"))
            cells.append(None if system == "st-mnrl" else row["ahead"])
            rows.append(cells)
        return common.format_table(header, rows)

    render.__doc__ = f"santa against sentence-transformers ({name})."
    return render


def versus_st_quality(results: Path) -> str:
    """MRR@100 per system and set, then the paired differences."""
    result = load(results, "versus_st_quality.json")["results"]
    sets = list(result)
    header = ["system", *(f"{name} ({result[name]['queries']:,} queries)" for name in sets)]
    systems = list(result[sets[0]]["systems"])
    rows = [[system, *(interval(result[s]["systems"][system]) for s in sets)] for system in systems]
    pairs = list(result[sets[0]]["differences"])
    differences = [
        [pair_name(pair), *(interval(result[s]["differences"][pair], signed=True) for s in sets)]
        for pair in pairs
    ]
    return "\n\n".join(
        [
            common.format_table(header, rows),
            common.format_table(["paired difference", *sets], differences),
        ]
    )


def cosqa_transfer(results: Path) -> str:
    """What fine-tuning beats zero-shot on CoSQA (two result files: the first three
    trainings, then the unrepeated pairs)."""
    from bench.quality.cosqa_transfer import COSQA, STDLIB, STDLIB_LARGE, STDLIB_LOW, ZERO

    first = load(results, "cosqa_transfer.json")
    large = load(results, "cosqa_transfer_large.json")
    steps, batch = first["settings"]["steps"], first["settings"]["batch"]
    stdlib = first["train_pairs"][STDLIB]
    rate = first["learning_rates"]
    cosqa_pairs = "/".join(str(n) for n in first["train_pairs"][COSQA])
    seen = large["settings"]["steps"] * large["settings"]["batch"]
    labels = {
        STDLIB: f"{stdlib} stdlib docstring pairs, lr {short_float(rate[STDLIB])} "
        f"(about {round(steps * batch / stdlib)} epochs)",
        STDLIB_LOW: f"the same at lr {short_float(rate[STDLIB_LOW])}",
        COSQA: f"CoSQA web-query pairs, cross-fitted ({cosqa_pairs} pairs), "
        f"lr {short_float(rate[COSQA])}",
        STDLIB_LARGE: f"{seen} distinct stdlib docstring pairs of "
        f"{large['train_pairs'][STDLIB_LARGE]:,} (none repeated), "
        f"lr {short_float(large['learning_rates'][STDLIB_LARGE])}",
    }
    rows = [[ZERO, interval(first["systems"][ZERO]), None]]
    for result in (first, large):
        for system, row in result["systems"].items():
            if system != ZERO:
                difference = result["differences"][f"{system} - {ZERO}"]
                rows.append([labels[system], interval(row), interval(difference, signed=True)])
    header = ["training", "CoSQA dev MRR@100 [95% CI]", "− zero-shot [95% CI]"]
    return common.format_table(header, rows)


ABLATION_SEEDS = ("ablation.json", "ablation_seed1.json", "ablation_seed2.json")


def _ablation_seed(result: dict[str, Any]) -> int:
    """The training seed of an ablation run: its ``--set train.seed=N``, else the recipe's."""
    for override in result["settings"]["overrides"]:
        if override.startswith("train.seed="):
            return int(override.split("=", 1)[1])
    from santa.config.recipes import get_recipe

    return get_recipe("tiny").train.seed


def ablation(results: Path) -> str:
    """The variants of one seed, with the overrides that make them."""
    from bench.quality.ablation import VARIANTS

    result = load(results, ABLATION_SEEDS[0])["results"]
    labels = {}
    for name, variant in VARIANTS.items():
        if variant is None:
            labels[name] = f"{name} (no training)"
        elif variant[1]:
            labels[name] = f"{name} (" + ", ".join(f"`{o}`" for o in variant[1]) + ")"
        else:
            labels[name] = f"SDA + MEP, {variant[0]} masks"
    rows = [[labels[name], interval(row)] for name, row in result.items()]
    return common.format_table(["variant", "held-out MRR@100 [95% CI]"], rows)


def ablation_differences(results: Path) -> str:
    """The paired differences of one seed."""
    differences = load(results, ABLATION_SEEDS[0])["differences"]
    rows = [[pair_name(pair), interval(row, signed=True)] for pair, row in differences.items()]
    return common.format_table(["paired difference", "MRR@100 [95% CI]"], rows)


def ablation_seeds(results: Path) -> str:
    """Each variant's MRR@100 in every seed, and their mean."""
    runs = [load(results, name) for name in ABLATION_SEEDS]
    header = ["variant", *(f"seed {_ablation_seed(run)}" for run in runs), "mean"]
    rows = []
    for variant in runs[0]["results"]:
        means = [run["results"][variant]["mean"] for run in runs]
        rows.append([variant, *(f"{m:.4f}" for m in means), f"{statistics.fmean(means):.4f}"])
    return common.format_table(header, rows)


def ablation_seed_differences(results: Path) -> str:
    """Each paired difference in every seed."""
    runs = [load(results, name) for name in ABLATION_SEEDS]
    header = ["paired difference", *(f"seed {_ablation_seed(run)} [95% CI]" for run in runs)]
    rows = [
        [pair_name(pair), *(interval(run["differences"][pair], signed=True) for run in runs)]
        for pair in runs[0]["differences"]
    ]
    return common.format_table(header, rows)


def shuffle_mrr(results: Path) -> str:
    """Held-out MRR@100 per seed under each shuffle, the mean over seeds [95 % t-interval],
    the seeds pooled per query [95 % bootstrap], and the difference global − local."""
    result = load(results, "shuffle_mrr.json")
    seeds = sorted({run["seed"] for run in result["runs"]})
    by_run = {(run["shuffle"], run["seed"]): run["mrr@100"] for run in result["runs"]}
    buffer = result["settings"]["buffer"]
    labels = {
        "local": f"`train.shuffle=local` (the old default), `train.shuffle_buffer={buffer}`",
        "global": "`train.shuffle=global` (the default now)",
    }
    rows = [["untrained (the shared initial weights)", *([None] * len(seeds)), None]]
    rows[0].append(interval(result["zero_shot"]))
    for shuffle, label in labels.items():
        cells = [f"{by_run[shuffle, seed]:.4f}" for seed in seeds]
        rows.append(
            [
                label,
                *cells,
                interval(result["summary"][shuffle]),
                interval(result["pooled"][shuffle]),
            ]
        )
    differences = [minus(f"{by_run['global', s] - by_run['local', s]:+.4f}") for s in seeds]
    rows.append(
        [
            "global − local",
            *differences,
            interval(result["difference"], signed=True) + " (Welch)",
            interval(result["pooled_difference"], signed=True) + " (paired)",
        ]
    )
    header = [
        "training",
        *(f"seed {seed}" for seed in seeds),
        "mean over seeds [95% t CI]",
        "seeds pooled per query [95% bootstrap CI]",
    ]
    return common.format_table(header, rows)


def shuffle_mrr_batches(results: Path) -> str:
    """How mixed the first batches the trainer draws are, under each shuffle."""
    result = load(results, "shuffle_mrr.json")
    mix, settings = result["batch_mix"], result["settings"]
    uniform = mix["uniform"]
    labels = {
        "corpus order": "corpus order (`train.shuffle_buffer=0`)",
        "local": f"`train.shuffle=local`, {settings['buffer']}-row buffer",
        "global": "`train.shuffle=global`",
    }
    rows = [
        [
            label,
            f"{mix[name]['same_file']:.4f}",
            f"{mix[name]['same_file'] / uniform['same_file']:.1f}",
            f"{mix[name]['same_repo']:.4f}",
            f"{mix[name]['same_repo'] / uniform['same_repo']:.1f}",
        ]
        for name, label in labels.items()
    ]
    rows.append(["a uniform sample", f"{uniform['same_file']:.4f}", "1.0"])
    rows[-1] += [f"{uniform['same_repo']:.4f}", "1.0"]
    header = [
        f"first {settings['check_batches']} batches of {settings['batch']}",
        "same-file pairs",
        "× uniform",
        "same-repository pairs",
        "× uniform",
    ]
    return common.format_table(header, rows)


GPU_VARIANTS = {
    "gpu-h100-eager.json": "eager, SDPA attention (what santa ran before)",
    "gpu-h100-fused.json": "+ fused AdamW",
    "gpu-h100-eager-attn.json": "+ fused AdamW, eager attention",
    "gpu-h100-compiled.json": "+ fused AdamW + `torch.compile`",
    "gpu-h100-eager-attn-compiled.json": "+ fused AdamW + `torch.compile`, eager attention",
    "gpu-h100-eager-gc-b256.json": "eager, batch 256, gradient checkpointing",
}


def gpu(results: Path) -> str:
    """bench/perf/gpu.py on the H100, one row per variant."""
    rows = []
    for name, label in GPU_VARIANTS.items():
        result = load(results, name)
        train, encode = result["train"], result["encode"]
        rows.append(
            [
                label,
                f"{train['pairs_per_s']:,.1f}",
                f"{100 * train['mfu']:.1f} %",
                f"{train['peak_memory_gib']:.1f} GiB",
                f"{encode['documents_per_s']:,.0f}",
                f"{100 * encode['mfu']:.1f} %",
                name,
            ]
        )
    header = [
        "variant",
        "train pairs/s",
        "train MFU",
        "peak memory",
        "encode docs/s",
        "encode MFU",
        "JSON",
    ]
    return common.format_table(header, rows, align="lrrrrrl")


def compile_time(results: Path) -> str:
    """Seconds to compile the model or its blocks, cold and with a warm Inductor cache."""
    rows = load(results, "compile_time.json")["rows"]
    by = {(row["scope"], row["cache"]): row["compile_s"] for row in rows}
    table = []
    for row in rows:
        seconds = f"{row['compile_s']:.1f}"
        if row["cache"] == "warm" and row["scope"] == "model":
            seconds += f" ({100 * row['compile_s'] / by['model', 'cold']:.1f} % of cold)"
        elif row["cache"] == "cold" and row["scope"] != "model":
            seconds += f" ({times(row['compile_s'] / by['model', 'cold'])} the model's)"
        table.append([row["scope"], row["cache"], seconds, f"{row['steady_pairs_per_s']:.1f}"])
    header = ["compile scope", "Inductor cache", "compile s", "steady pairs/s"]
    return common.format_table(header, table, align="llrr")


# Issue 37 on the H200: (label, result file) of bench/perf/gpu_ray.py runs.
GPU_H200_RUNS = (
    ("T5-base shape, batch 128, whole-model compile", "gpu_ray-h200-model.json"),
    ("`tiny` recipe, batch 16, eager", "gpu_ray-h200-tiny-eager.json"),
)


def gpu_h200(results: Path) -> str:
    """Ray Train beside the plain loop on the H200: both runs, each system a row, then the
    near-zero model's per-step milliseconds (``step_overhead.py``)."""
    rows = []
    for label, name in GPU_H200_RUNS:
        systems = {row["system"]: row for row in load(results, name)["systems"]}
        plain = systems["plain"]
        for system in ("ray", "plain"):
            row = systems[system]
            phases = row["phases_s"]
            # Seconds from the start until the first step is done (its compile in it).
            if system == "ray":
                first = phases["startup_total_s"] + phases["startup_first_step_s"]
            else:
                first = phases["first_step_s"]
            rows.append(
                [
                    label,
                    system,
                    f"{row['stage_s']:.1f}",
                    f"{first:.1f}",
                    f"{row['whole_pairs_per_s']:.1f}",
                    f"{row['steady_pairs_per_s']:.1f}",
                    f"{row['worst_to_median']:.2f}",
                    times(row["whole_pairs_per_s"] / plain["whole_pairs_per_s"]),
                    times(row["steady_pairs_per_s"] / plain["steady_pairs_per_s"]),
                ]
            )
    header = [
        "run",
        "system",
        "stage s",
        "first step done, s",
        "whole-stage pairs/s",
        "steady pairs/s",
        "worst window / median",
        "whole vs plain",
        "steady vs plain",
    ]
    table = common.format_table(header, rows, align="llrrrrrrr")
    overhead = load(results, "step_overhead-h200.json")
    step_rows = [
        [
            row["system"],
            f"{row['ms_per_step_median']:.1f}",
            f"{row['ms_per_step_p90']:.1f}",
            f"{row['overhead_ms_median']:+.1f}",
        ]
        for row in overhead["systems"]
    ]
    step_header = [
        "system (near-zero T5, batch 128)",
        "ms/step median",
        "ms/step p90",
        "beyond plain, ms",
    ]
    return table + "\n\n" + common.format_table(step_header, step_rows, align="lrrr")


SHUFFLE_METHODS = {
    "corpus order": "corpus order",
    "local buffer": "Ray Data's 2,048-row buffer, blocks of 256 rows "
    "(`train.shuffle=local`, the old default)",
    "global": "a permutation of every row (`train.shuffle=global`, the default now)",
}


def shuffle(results: Path) -> str:
    """Same-file and same-repository pairs in a batch over a uniform sample's, by method."""
    result = load(results, "shuffle.json")
    uniform = result["uniform"]
    rows = [
        [
            SHUFFLE_METHODS[row["method"]],
            f"{row['same_file_share'] / uniform['file']:.1f}",
            f"{row['same_repo_share'] / uniform['repo']:.1f}",
            f"{row['epoch_s']:.2f} s",
        ]
        for row in result["methods"]
    ]
    header = ["batches", "same-file pairs × uniform", "same-repo pairs × uniform", "one epoch"]
    return common.format_table(header, rows)


# The runs of gpu_ray_cpu_runs.json the table shows (the others are quoted in the prose).
GPU_RAY_CPU_RUNS = (("before issue 28", "before", 2), ("after", "after", 1), ("after", "after", 2))


def gpu_ray_cpu(results: Path) -> str:
    """Ray Train beside the plain loop on this CPU: chosen runs, then the quiet one."""
    runs = load(results, "gpu_ray_cpu_runs.json")
    rows = []
    for label, when, index in GPU_RAY_CPU_RUNS:
        ray, plain = runs[when][index]["ray"], runs[when][index]["plain"]
        startup = ray["startup"]
        rows.append(
            [
                label,
                f"{ray['load']:.1f}",
                f"{ray['whole']:.1f}",
                f"{ray['loop']:.1f}",
                f"{ray['steady']:.1f}",
                f"{ray['worst']:.2f}",
                None if startup is None else f"{startup:.1f} s",
                f"{plain['whole']:.1f}",
                f"{plain['steady']:.1f}",
            ]
        )
    quiet = {row["system"]: row for row in load(results, "gpu_ray_cpu_quiet.json")["systems"]}
    ray, plain = quiet["ray"], quiet["plain"]
    rows.append(
        [
            "after, quiet (`gpu_ray_cpu_quiet.json`)",
            f"{ray['load_average_1m_before']:.1f}",
            f"{ray['whole_pairs_per_s']:.1f}",
            f"{ray['loop_pairs_per_s']:.1f}",
            f"{ray['steady_pairs_per_s']:.1f}",
            f"{ray['worst_to_median']:.2f}",
            f"{ray['phases_s']['startup_total_s']:.1f} s",
            f"{plain['whole_pairs_per_s']:.1f}",
            f"{plain['steady_pairs_per_s']:.1f}",
        ]
    )
    header = [
        "run",
        "load",
        "ray whole",
        "ray loop",
        "ray steady",
        "ray worst / median",
        "start-up before step 1",
        "plain whole",
        "plain steady",
    ]
    return common.format_table(header, rows)


def index_search(results: Path) -> str:
    """Encode + index throughput by actor count, with the load before and after each."""
    result = load(results, "index_search.json")
    rows, before = [], result["load_before"]
    for row in result["index"]:
        rows.append(
            [
                row["actors"],
                f"{row['encode_s']:.1f}",
                f"{row['documents_per_s']:.0f}",
                f"{row['documents_per_actor_s']:.0f}",
                f"{row['index_s']:.1f}",
                f"{before:.0f} → {row['load_after']:.0f}",
            ]
        )
        before = row["load_after"]
    header = [
        "actors",
        "encode s",
        "documents/s",
        "per actor, documents/s",
        "index build s",
        "load (1 min)",
    ]
    return common.format_table(header, rows, align="rrrrrl")


def _index_speedup(name: str) -> Callable[[Path], str]:
    """Encode throughput by actor count and the speed-up over one actor."""

    def render(results: Path) -> str:
        rows = [
            [
                row["actors"],
                f"{row['encode_s']:.1f}",
                f"{row['documents_per_s']:.0f}",
                times(row["speedup"]),
            ]
            for row in load(results, name)["index"]
        ]
        return common.format_table(
            ["actors", "encode s", "documents/s", "speed-up"], rows, align="rrrr"
        )

    render.__doc__ = f"Encode throughput by actor count ({name})."
    return render


def serve_latency(results: Path) -> str:
    """Serve latency and throughput by client count (one replica, no batching)."""
    rows = [
        [
            row["clients"],
            f"{row['p50_ms']:.1f} ms",
            f"{row['p99_ms']:.1f} ms",
            f"{row['requests_per_s']:.1f}",
        ]
        for row in load(results, "index_search.json")["serve"]
    ]
    return common.format_table(["clients", "p50", "p99", "requests/s"], rows, align="rrrr")


# bench/quality/paper.py's settings: their files, label and the metric the paper prints.
PAPER_SETTINGS = {
    "codesearch": ("CodeSearch Ruby MRR (CSN Ruby valid as its own codebase, {candidates:,}; "
                   "Table {table}: {paper_candidates:,})", "mrr"),
    "adv": ("Adv MRR (AdvTest sample, {candidates:,}; Table {table}: {paper_candidates:,})", "mrr"),
    "esci2": ("ESCI NDCG@100 two-class ({queries:,} query, {candidates:,} products; "
              "Table {table}: {paper_queries:,} / {paper_candidates:,})", "ndcg@100"),
    "esci4": ("ESCI NDCG@100 four-class (same)", "ndcg@100_4class"),
}  # fmt: skip
PAPER_SYSTEMS = {
    "zero-shot SANTA": "SANTA zero-shot",
    "SANTA (Inbatch)": "SANTA (Inbatch)",
    "SANTA (Hard Negative)": "SANTA (Hard Negative)",
    "SCodeR": "SCodeR",
}


def paper(results: Path) -> str:
    """santa's figure under each paper's protocol beside the papers' own."""
    rows = []
    for setting, (label, metric) in PAPER_SETTINGS.items():
        minilm = load(results, f"paper_{setting}_minilm.json")
        tiny = load(results, f"paper_{setting}_tiny.json")
        (sizes,) = minilm["sizes"].values()
        table = sizes["paper_table"].rsplit(" ", 1)[1]
        cited: dict[str, list[tuple[int, str]]] = {column: [] for column in PAPER_SYSTEMS.values()}
        for key, value in minilm["rows"][0].items():
            paper_table, _, system = key.partition(", ")
            if system in PAPER_SYSTEMS:
                number = int(paper_table.rsplit(" ", 1)[1])
                cited[PAPER_SYSTEMS[system]].append((number, f"{value} (T{number})"))
        rows.append(
            [
                label.format(table=table, **sizes),
                f"{minilm['rows'][0]['santa']:.2f}",
                f"{tiny['rows'][0]['santa']:.2f}",
                f"{100 * minilm['metrics']['bm25'][metric]:.2f}",
                *(" / ".join(text for _, text in sorted(cited[c])) or "" for c in cited),
            ]
        )
    header = ["setting (fixture, candidates)", "minilm", "tiny", "BM25", *PAPER_SYSTEMS.values()]
    return common.format_table(header, rows)


def grad_cache(results: Path) -> str:
    """CPU seconds, pairs/s and peak memory per step by batch, plain and GradCache."""
    runs = [load(results, name) for name in ("grad_cache.json", "grad_cache_chunk32.json")]
    rows = []
    for batch in runs[0]["settings"]["batches"].split(","):
        for index, run in enumerate(runs):
            chunk = run["settings"]["chunk"]
            by_mode = {row["mode"]: row for row in run["rows"] if row["batch"] == int(batch)}
            plain = by_mode.get("plain")
            if index == 0 and plain is not None:
                if "skipped" in plain:
                    rows.append([f"{int(batch):,}", "plain", plain["skipped"], None, None, None])
                else:
                    rows.append(_grad_cache_row(plain, "plain", "1.00×"))
            cached = by_mode.get("grad-cache")
            if cached is None:
                continue
            chunks = int(batch) // chunk
            mode = f"GradCache, {chunks} chunk{'s' if chunks > 1 else ''} of {chunk}"
            if plain is None or "skipped" in plain:
                ratio = None
            else:
                ratio = times(cached["cpu_step_s"] / plain["cpu_step_s"])
                if index:
                    ratio += f" (plain {plain['cpu_step_s']:.2f} in that run)"
            rows.append(_grad_cache_row(cached, mode, ratio))
    header = ["global batch", "mode", "CPU s/step", "pairs/s", "peak RSS GB", "step time vs plain"]
    return common.format_table(header, rows, align="rlrrrr")


def _grad_cache_row(row: dict[str, Any], mode: str, ratio: str | None) -> list[Any]:
    return [
        f"{row['batch']:,}",
        mode,
        f"{row['cpu_step_s']:.2f}",
        f"{row['pairs_per_s']:.0f}",
        f"{row['peak_rss_gb']:.2f}",
        ratio,
    ]


def negative_filtering(results: Path) -> str:
    """Each ANCE run's MRR@100 and what the score filter took from its mined negatives."""
    result = load(results, "negative_filtering.json")
    base = "base (fine-tuned, before ANCE)"
    rows = [[base, interval(result["results"][base]), None, None]]
    first = True
    for name, mining in result["mining"].items():
        seed, _, setting = name.partition(", ")
        label = f"{seed}, {setting if setting == 'no filter' else 'ratio ' + setting}"
        short = f"{mining['queries_short']:,}" + (f" of {mining['queries']:,}" if first else "")
        first = False
        rows.append(
            [
                label,
                interval(result["results"][name]),
                f"{mining['filtered']['score_ratio']:,}",
                short,
            ]
        )
    header = [
        "ANCE from the same base",
        "MRR@100 [95% CI]",
        "hits dropped by the score filter",
        "queries left without a mined negative",
    ]
    return common.format_table(header, rows)


def negative_filtering_differences(results: Path) -> str:
    """Each filter against no filter, seed by seed and the seeds pooled per query."""
    result = load(results, "negative_filtering.json")
    differences = result["differences"]
    filters = [f for f in result["settings"]["filters"].split(",") if f != "none"]
    rows = []
    for ratio in filters:
        for pair, row in differences.items():
            system, _, _ = pair.partition(" - ")
            seed, _, setting = system.partition(", ")
            if setting != ratio:
                continue
            if seed == "all seeds":
                seed = "three seeds pooled (per-query mean)"
            rows.append([f"{seed}: {ratio} − no filter", interval(row, signed=True)])
    return common.format_table(["paired difference (same queries)", "MRR@100 [95% CI]"], rows)


FAULTS_SCRATCH = re.compile(r"(?:/[\w.-]+)*/santa-faults-[\w-]+")


def faults_table(rows: list[dict]) -> str:
    """The markdown table of fault rows (bench/robustness/faults.py prints it too): the
    scratch folder written W, long lines cut at 160 characters; the seconds from the fault
    to the end beside those from the start; "same" when the last terminal line is the line
    the fault ended with; "-" for what a row did not record."""

    def cut(text: str, width: int) -> str:
        text = FAULTS_SCRATCH.sub("W", text)
        return text if len(text) <= width else text[: width - 3] + "..."

    table = []
    for row in rows:
        message = cut(row["message"], 160) or "(no message)"
        last = row.get("last_line")
        resume = row.get("resume_exact")
        table.append(
            [
                row["fault"],
                f"{row['exit']} ({row['expected']})",
                f"{row['seconds']:.1f}"
                + (f" ({after:.1f} after)" if (after := row.get("after_fault_s")) else ""),
                row.get("terminal_lines", "-"),
                message,
                "-" if last is None else "same" if last == row["message"] else cut(last, 80),
                "yes" if row["data_safe"] else "NO",
                "-" if resume is None else "yes" if resume else "NO",
            ]
        )
    header = [
        "fault",
        "exit (want)",
        "s to the end",
        "terminal lines",
        "how it ended",
        "last line",
        "data safe",
        "resume exact",
    ]
    return common.format_table(header, table, align="lrrrllll")


def _faults(running: bool) -> Callable[[Path], str]:
    """bench/robustness/faults.py's rows, those met while a job runs or those before."""

    def render(results: Path) -> str:
        rows = load(results, "faults.json")["faults"]
        return faults_table([row for row in rows if bool(row.get("running")) == running])

    render.__doc__ = f"The faults {'while a job runs' if running else 'before or at its start'}."
    return render


def decoder(results: Path) -> str:
    """The tiny decoder's training speed on CPU, one row per system."""
    from bench.perf.decoder import format_table as decoder_table

    return decoder_table(load(results, "decoder.json"))


def matryoshka(results: Path) -> str:
    """Held-out MRR@100 at each truncated dimension, Matryoshka against each dimension
    trained alone, and the flat index's size."""
    from bench.quality.matryoshka import format_tables

    return minus(format_tables(load(results, "matryoshka.json")))


RENDERERS: dict[str, Callable[[Path], str]] = {
    "pipeline": pipeline,
    "minilm_similarity": minilm_similarity,
    "refresh": refresh,
    "serve_batching": serve_batching,
    "scoder": scoder,
    "scoder_iterations": scoder_iterations,
    "versus_st": _versus_st("versus_st.json", speed=True),
    "versus_st_ray_mnrl": _versus_st("versus_st_ray_mnrl.json", speed=True),
    "versus_st_b128": _versus_st("versus_st_b128.json", speed=False),
    "versus_st_quality": versus_st_quality,
    "cosqa_transfer": cosqa_transfer,
    "ablation": ablation,
    "ablation_differences": ablation_differences,
    "ablation_seeds": ablation_seeds,
    "ablation_seed_differences": ablation_seed_differences,
    "shuffle_mrr": shuffle_mrr,
    "shuffle_mrr_batches": shuffle_mrr_batches,
    "gpu": gpu,
    "gpu_h200": gpu_h200,
    "compile_time": compile_time,
    "shuffle": shuffle,
    "gpu_ray_cpu": gpu_ray_cpu,
    "pipeline_minilm": pipeline_minilm,
    "index_search": index_search,
    "index_search_quiet": _index_speedup("index_search_quiet.json"),
    "index_search_quiet_2026-11-26": _index_speedup("index_search_quiet_2026-11-26.json"),
    "serve_latency": serve_latency,
    "paper": paper,
    "grad_cache": grad_cache,
    "negative_filtering": negative_filtering,
    "negative_filtering_differences": negative_filtering_differences,
    "faults_running": _faults(running=True),
    "faults_before": _faults(running=False),
    "decoder": decoder,
    "matryoshka": matryoshka,
}


# --------------------------------------------------------------------------- document


def render_document(text: str, results: Path) -> tuple[str, list[str]]:
    """``text`` with every generated table rendered again, and the names that changed."""
    changed = []

    def replace(match: re.Match) -> str:
        name = match["name"]
        if name not in RENDERERS:
            raise SystemExit(
                f"santa: error: RESULTS.md names an unknown table {name!r} "
                f"(known: {', '.join(RENDERERS)})"
            )
        body = RENDERERS[name](results) + "\n"
        if body != match["body"]:
            changed.append(name)
        return match["open"] + body + match["close"]

    return BLOCK.sub(replace, text), changed


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or ``--check``) the generated tables of RESULTS.md, or print one."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a table is stale")
    parser.add_argument("--print", dest="table", choices=sorted(RENDERERS), help="print one")
    parser.add_argument("--document", type=Path, default=DOCUMENT)
    parser.add_argument("--results", type=Path, default=common.RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.table:
        print(RENDERERS[args.table](args.results))
        return 0
    text = args.document.read_text()
    rendered, changed = render_document(text, args.results)
    found = len(BLOCK.findall(text))
    if args.check:
        if changed:
            print(f"{args.document}: stale tables (python bench/results.py): {', '.join(changed)}")
            return 1
        print(f"{args.document}: {found} generated tables match bench/results/*.json")
        return 0
    if changed:
        tmp = args.document.with_name(f".{args.document.name}.tmp")
        tmp.write_text(rendered)
        tmp.replace(args.document)
    print(f"{args.document}: {found} generated tables, {len(changed)} rewritten {changed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
