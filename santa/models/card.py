"""The model card written into every exported folder (``README.md``).

Hugging Face's YAML metadata first (``library_name``, ``pipeline_tag``, ``base_model``,
``datasets``, ``tags``, ``license`` where the base model's is known), then what the model is,
how it was trained (the recipe, its stages with their data and steps), how it scored (the
run's evaluation table, BM25 beside it; where the run was not evaluated the card says so and
gives the command that evaluates it), how to load it, and the papers to cite.

The evaluation is found beside the checkpoint when the pipeline evaluated it
(``RUN/eval/<stage>/``, the same checkpoint), or given (``ray_jobs.export --eval``: the
output folder of ``ray_jobs.evaluate``).
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from santa.files import storage

__all__ = ["Evaluation", "find_evaluation", "model_card", "read_evaluation", "write_model_card"]

CARD_FILE = "README.md"

# Licenses of the base models santa's recipes start from (their hub pages).
KNOWN_LICENSES = {
    "t5-base": "apache-2.0",
    "google-t5/t5-base": "apache-2.0",
    "t5-small": "apache-2.0",
    "google-t5/t5-small": "apache-2.0",
    "Salesforce/codet5-base": "bsd-3-clause",
    "Salesforce/codet5-small": "bsd-3-clause",
    "microsoft/unixcoder-base": "apache-2.0",
    "sentence-transformers/all-MiniLM-L6-v2": "apache-2.0",
}
# santa's dataset names → their Hugging Face hub datasets.
KNOWN_DATASETS = {
    "codesearchnet": "code-search-net/code_search_net",
    "esci": "tasksource/esci",
}
CITATIONS = """```bibtex
@inproceedings{li2023santa,
  title     = {Structure-Aware Language Model Pretraining Improves Dense Retrieval on Structured Data},
  author    = {Li, Xinze and Liu, Zhenghao and Xiong, Chenyan and Yu, Shi and Gu, Yu and Liu, Zhiyuan and Yu, Ge},
  booktitle = {Findings of the Association for Computational Linguistics: ACL 2023},
  year      = {2023}
}
@inproceedings{li2022scoder,
  title     = {Soft-Labeled Contrastive Pre-training for Function-level Code Representation},
  author    = {Li, Xiaonan and Guo, Daya and Gong, Yeyun and Lin, Yun and Shen, Yelong and Qiu, Xipeng and Jiang, Daxin and Chen, Weizhu and Duan, Nan},
  booktitle = {Findings of the Association for Computational Linguistics: EMNLP 2022},
  year      = {2022}
}
```"""


@dataclass
class Evaluation:
    """One evaluation of the model: where, on what, and each system's metrics."""

    source: str
    info: dict[str, Any]
    systems: dict[str, dict[str, Any]] = field(default_factory=dict)


def read_evaluation(uri: str) -> Evaluation | None:
    """The output folder of ``ray_jobs.evaluate`` (or one stage's ``RUN/eval/<stage>``), or
    None where nothing complete is there."""
    from santa.files.outputs import published_root

    root = published_root(uri)
    metrics_uri, info_uri = storage.join(root, "metrics.json"), storage.join(root, "info.json")
    if not (storage.exists(metrics_uri) and storage.exists(info_uri)):
        return None
    return Evaluation(uri, storage.read_json(info_uri), storage.read_json(metrics_uri))


def _same_model(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def find_evaluation(model_uri: str, checkpoint_uri: str | None) -> Evaluation | None:
    """The pipeline's evaluation of this very checkpoint (``RUN/eval/<stage>``), if any."""
    if not checkpoint_uri:
        return None
    stage_run = posixpath.dirname(checkpoint_uri.rstrip("/"))
    root, stage = posixpath.dirname(stage_run), posixpath.basename(stage_run)
    try:
        found = read_evaluation(storage.join(root, "eval", stage))
    except (storage.StorageError, ValueError, OSError):
        return None
    if found is None or not _same_model(str(found.info.get("model", "")), model_uri):
        return None
    return found


def _pipeline_report(checkpoint_uri: str | None) -> dict[str, Any] | None:
    """The pipeline's report.json when the checkpoint is one of its stages'."""
    if not checkpoint_uri:
        return None
    root = posixpath.dirname(posixpath.dirname(checkpoint_uri.rstrip("/")))
    try:
        uri = storage.join(root, "report.json")
        report = storage.read_json(uri) if storage.exists(uri) else None
    except (storage.StorageError, ValueError, OSError):
        return None
    if not isinstance(report, dict) or not isinstance(report.get("stages"), list):
        return None
    return report


def _dataset_of(data_uri: str) -> str | None:
    """The dataset a preprocessed corpus was built from (its manifest's config), if known."""
    from santa.files.outputs import read_manifest

    try:
        manifest = read_manifest(data_uri) or {}
    except (storage.StorageError, ValueError, OSError):
        return None
    return (manifest.get("config") or {}).get("dataset") or None


def _yaml_value(value: Any) -> str:
    return json.dumps(value)  # a JSON scalar is a YAML scalar


def _metadata(fields: dict[str, Any]) -> str:
    lines = ["---"]
    for key, value in fields.items():
        if value in (None, [], ""):
            continue
        if isinstance(value, list):
            lines.append(f"{key}:")
            lines += [f"- {_yaml_value(item)}" for item in value]
        else:
            lines.append(f"{key}: {_yaml_value(value)}")
    return "\n".join([*lines, "---"])


def _base_license(backbone: str) -> str | None:
    """The base model's license: santa's table, else a local folder's own card."""
    if backbone in KNOWN_LICENSES:
        return KNOWN_LICENSES[backbone]
    card = Path(backbone) / CARD_FILE
    if card.is_file():
        try:
            from huggingface_hub import ModelCard

            return ModelCard.load(card).data.to_dict().get("license")
        except Exception:  # a hand-written README without metadata
            return None
    return None


def _is_hub_name(name: str) -> bool:
    return bool(name) and not name.startswith(("/", ".", "s3://", "~")) and name.count("/") <= 1


# A quoted hub id in a card's usage snippets: SentenceTransformer('org/name').
_QUOTED_HUB_ID = re.compile(r"""["'`]([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)["'`]""")


def _card_title(text: str) -> str:
    """The first ``# Title`` of a card's Markdown (after its YAML metadata)."""
    body = text.split("\n---", 1)[-1] if text.startswith("---") else text
    found = re.search(r"^# +(.+?)\s*$", body, re.MULTILINE)
    return found.group(1) if found else ""


def base_model_id(backbone: str) -> str | None:
    """The hub id of the model training started from: the backbone's own name where it is
    one, else read from a local base folder (a package's copy of a hub model, such as the
    `minilm` recipe's all-MiniLM-L6-v2): the hub id its card quotes whose last part is the
    card's title (``SentenceTransformer('sentence-transformers/all-MiniLM-L6-v2')`` under
    ``# all-MiniLM-L6-v2``), else, for a folder without a card, its config's
    ``_name_or_path`` where that is a hub id. A card's ``base_model`` is the base's own base,
    not its id, and is not used."""
    if _is_hub_name(backbone):
        return None if backbone.startswith("tiny") else backbone
    folder = Path(backbone)
    if not folder.is_dir():
        return None
    card = folder / CARD_FILE
    if card.is_file():
        text = card.read_text(encoding="utf-8", errors="replace")
        title = _card_title(text).strip().lower()
        for hub_id in _QUOTED_HUB_ID.findall(text):
            if title and hub_id.rsplit("/", 1)[-1].lower() == title:
                return hub_id
        return None
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    name = str(config.get("_name_or_path") or "")
    return name if _is_hub_name(name) and "/" in name else None


def card_title(report: dict[str, Any] | None, checkpoint_uri: str | None, name: str) -> str:
    """The card's title from the run: ``santa: RUN (STAGE stage)`` for a pipeline stage's
    checkpoint, ``santa: RUN`` for a training run's, else ``name`` (the folder's)."""
    checkpoint = (checkpoint_uri or "").rstrip("/")
    if not posixpath.basename(checkpoint).startswith("checkpoint_"):
        return name
    run_folder = posixpath.dirname(checkpoint)
    if report and report.get("name"):
        return f"santa: {report['name']} ({posixpath.basename(run_folder)} stage)"
    return f"santa: {posixpath.basename(run_folder)}"


def _evaluation_section(evaluation: Evaluation | None, model_name: str) -> list[str]:
    from santa.eval.metrics import METRICS, NDCG_4CLASS

    if evaluation is None:
        return [
            "This model was not evaluated by the run that trained it. Evaluate it on a BEIR "
            "folder (santa's preprocess job writes one with `--stage eval`):",
            "",
            "```bash",
            f"python -m ray_jobs.evaluate --checkpoint {model_name} --data DATA --split test",
            "```",
        ]
    info = evaluation.info
    names = {"model": "this model", "model-rerank": "this model (rerank)"}
    columns = [
        m for m in (*METRICS, NDCG_4CLASS) if any(m in v for v in evaluation.systems.values())
    ]
    lines = [
        f"On `{info.get('data')}` (split `{info.get('split')}`, {info.get('num_queries')} queries, "
        f"{info.get('num_documents')} documents; protocols {', '.join(info.get('protocols') or [])};"
        f" {info.get('similarity')} similarity, lengths {info.get('max_query_length')}/"
        f"{info.get('max_document_length')}), from `{evaluation.source}`:",
        "",
        "| system | " + " | ".join(columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    order = sorted(evaluation.systems, key=lambda system: not system.startswith("model"))
    for system in order:  # this model first, then the baselines
        metrics = evaluation.systems[system]
        cells = [f"{metrics[c]:.4f}" if c in metrics else "" for c in columns]
        lines.append(f"| {names.get(system, system)} | " + " | ".join(cells) + " |")
    return lines


def _kept(stage: dict[str, Any]) -> str:
    """Why a stage's checkpoint is the one kept (``train.keep_best_by``), or nothing."""
    kept = stage.get("kept") or {}
    if not kept.get("by"):
        return ""
    return f": the best {kept['by']} ({kept['value']:.4f}), step {kept['step']}"


def model_card(
    santa_config: dict[str, Any],
    *,
    model_uri: str,
    checkpoint_uri: str | None,
    step: int | None,
    sentence_transformers: bool,
    evaluation: Evaluation | None,
    name: str,
    location: str | None = None,
    adapters: dict[str, Any] | None = None,
) -> str:
    """The card's text (YAML metadata + Markdown); ``location`` is what the usage snippets
    load (default: ``name``); ``adapters``: the LoRA adapters merged into the weights
    (``santa_lora.json``, :mod:`santa.models.lora`)."""
    location = location or name
    model = santa_config.get("model") or {}
    train = santa_config.get("train") or {}
    backbone = str(model.get("backbone") or "")
    base_model = base_model_id(backbone)
    report = _pipeline_report(checkpoint_uri)
    datasets: list[str] = []
    if report:
        for uri in (report.get("data") or {}).values():
            hub_name = KNOWN_DATASETS.get(str(uri and _dataset_of(uri)))
            if hub_name and hub_name not in datasets:  # datasets on the hub only
                datasets.append(hub_name)
    domain = "product-search" if KNOWN_DATASETS["esci"] in datasets else "code-search"
    metadata = {
        "library_name": "sentence-transformers" if sentence_transformers else "transformers",
        "pipeline_tag": "sentence-similarity",
        "base_model": base_model,
        "datasets": datasets,
        "tags": ["santa", "dense-retrieval", domain, "feature-extraction"]
        + (["sentence-transformers"] if sentence_transformers else []),
        "license": _base_license(backbone) or KNOWN_LICENSES.get(base_model or ""),
    }
    pooling = model.get("pooling") or ("decoder-0" if model.get("kind") == "t5" else "cls")
    lines = [
        _metadata(metadata),
        "",
        f"# {card_title(report, checkpoint_uri, name)}",
        "",
        "A dense retriever trained with santa (SANTA's structure-aware pretraining and "
        "fine-tuning on Ray) from "
        + (f"`{base_model}`" if base_model else f"`{backbone or 'a randomly initialised model'}`")
        + ": queries and documents are embedded "
        f"apart ({pooling} pooling, {model.get('similarity', 'dot')} similarity) and "
        "documents are ranked by the similarity of their vectors to the query's.",
        "",
        f"Exported from `{checkpoint_uri or model_uri}`"
        + (f" (step {step})." if step is not None else "."),
        "",
        "## Training",
        "",
    ]
    if report:
        data = report.get("data") or {}
        lines += [
            f"Recipe `{report.get('recipe')}`, stages "
            f"{' → '.join(s['stage'] for s in report['stages'])}; training data "
            f"`{data.get('train')}`.",
            "",
            "| stage | steps | learning rate | hard negatives | checkpoint |",
            "|---|---:|---:|---|---|",
        ]
        for stage in report["stages"]:
            final = stage.get("final_metrics") or {}
            lines.append(
                f"| {stage['stage']} | {int(final.get('step', 0))} | "
                f"{stage.get('learning_rate', 0):.1e} | {stage.get('hard_negatives', '')} | "
                f"`{posixpath.basename(str(stage.get('checkpoint', '')))}`{_kept(stage)} |"
            )
        lines.append("")
    keys = (
        "stage",
        "learning_rate",
        "global_batch_size",
        "max_steps",
        "epochs",
        "max_query_length",
        "max_document_length",
        "sda_weight",
        "mep_weight",
        "seed",
    )
    settings = ", ".join(f"`{k}={train[k]}`" for k in keys if train.get(k) is not None)
    info = evaluation.info if evaluation else {}
    query_length = info.get("max_query_length") or train.get("max_query_length") or 50
    document_length = info.get("max_document_length") or train.get("max_document_length") or 240
    similarity = model.get("similarity", "dot")
    lines += [f"This checkpoint's training settings: {settings or 'not recorded'}.", ""]
    if adapters:
        targets = adapters.get("target_modules")
        targets = ", ".join(targets) if isinstance(targets, list) else str(targets)
        unfrozen = ", ".join(adapters.get("trainable_modules") or []) or "none"
        lines += [
            f"Trained with LoRA (rank {adapters.get('rank')}, alpha {adapters.get('alpha')}, "
            f"dropout {adapters.get('dropout')}, on {targets}; modules trained in full: "
            f"{unfrozen}) on `{adapters.get('base_model', backbone)}`; the adapters are "
            "merged into these weights, which load without peft.",
            "",
        ]
    lines += [
        "## Evaluation",
        "",
        *_evaluation_section(evaluation, location),
        "",
        "## Usage",
        "",
        "With santa (queries and documents encoded at the lengths above, as in evaluation):",
        "",
        "```python",
        "import santa",
        "from santa.eval.retrieval import prepare_embeddings",
        "from santa.models.encoding import encode_texts",
        "",
        f'model = santa.load("{location}")',
        'queries = ["read a file line by line"]',
        'documents = ["def read_lines(path):\\n    return open(path).read().splitlines()"]',
        f'q = encode_texts(model, queries, max_length={query_length}, role="query", '
        "progress=False)",
        f'd = encode_texts(model, documents, max_length={document_length}, role="document", '
        "progress=False)",
        f'scores = prepare_embeddings(q, "{similarity}") @ prepare_embeddings(d, "{similarity}").T',
        "```",
        "",
    ]
    if sentence_transformers:
        lines += [
            "With sentence-transformers:",
            "",
            "```python",
            "from sentence_transformers import SentenceTransformer",
            "",
            f'model = SentenceTransformer("{location}")',
            'embeddings = model.encode(["read a file line by line", "def read_lines(path): ..."])',
            "print(model.similarity(embeddings[:1], embeddings[1:]))",
            "```",
            "",
        ]
    else:
        lines += [
            "The folder also loads with plain transformers (`AutoModel`, `AutoTokenizer`); "
            "export with `--format sentence-transformers` for a `SentenceTransformer` folder "
            "(encoder models).",
            "",
        ]
    lines += ["## Citation", "", CITATIONS, ""]
    return "\n".join(lines)


def write_model_card(
    folder: str | Path,
    *,
    model_uri: str,
    checkpoint_uri: str | None,
    step: int | None,
    sentence_transformers: bool,
    evaluation: Evaluation | None = None,
    name: str | None = None,
    location: str | None = None,
) -> Path:
    """Write ``README.md`` into an exported model folder; returns its path."""
    folder = Path(folder)
    saved = folder / "santa_config.json"
    santa_config = json.loads(saved.read_text()) if saved.is_file() else {}
    merged = folder / "santa_lora.json"  # santa.models.lora.MERGED_ADAPTERS_FILE
    adapters = json.loads(merged.read_text()) if merged.is_file() else None
    if evaluation is None:
        evaluation = find_evaluation(model_uri, checkpoint_uri)
    text = model_card(
        santa_config,
        model_uri=model_uri,
        checkpoint_uri=checkpoint_uri,
        step=step,
        sentence_transformers=sentence_transformers,
        evaluation=evaluation,
        name=name or folder.name,
        location=location,
        adapters=adapters,
    )
    target = folder / CARD_FILE
    target.write_text(text)
    return target
