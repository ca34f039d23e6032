"""Export a model as a sentence-transformers folder that encodes as santa does.

The folder is the Hugging Face folder santa writes plus sentence-transformers' module list
in the format every release since 2.x reads (``modules.json`` with ``Transformer``,
``Pooling``, an optional ``Dense`` and ``Normalize``, ``sentence_bert_config.json``,
``config_sentence_transformers.json``):

- pooling: santa's ``cls``, ``mean`` or a decoder's ``last`` (``lasttoken``: the EOS the
  folder's tokenizer appends); a projection becomes a ``Dense`` module;
- ``Normalize`` (and ``similarity_fn_name: cosine``) where santa scores by cosine, none and
  ``dot`` where it scores by raw dot product;
- ``max_seq_length``: the document length the evaluator uses for the model (santa encodes
  queries at the query length; sentence-transformers has one length for every text);
- lower-casing where the backbone lower-cases;
- ``model_args: {"add_pooling_layer": false}`` where the backbone's class would build a
  pooler the weights do not have (santa never trains one): the folder loads without
  transformers' report of ``pooler.dense.*`` as MISSING and newly initialised.
- the query/document prefixes as the prompts ``query`` and ``document`` (``encode_query``,
  ``encode_document``);
- ``truncate_dim`` when the export asks for one (a Matryoshka model's cut vectors);
- a decoder's tokenizer pads right: sentence-transformers numbers positions from the first
  column, so a left-padded text would get other positions than santa gives it.

T5 models are refused with one line: santa embeds with the decoder's state at position 0,
and sentence-transformers' ``Transformer`` module runs a T5's encoder only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["STExportError", "write_sentence_transformers_files"]

# santa's activation names → the torch classes sentence-transformers' Dense imports.
_ACTIVATION_CLASSES = {
    "identity": "torch.nn.modules.linear.Identity",
    "tanh": "torch.nn.modules.activation.Tanh",
    "relu": "torch.nn.modules.activation.ReLU",
    "gelu": "torch.nn.modules.activation.GELU",
    "sigmoid": "torch.nn.modules.activation.Sigmoid",
}


class STExportError(ValueError):
    """The model cannot be written as a sentence-transformers folder (the message says why)."""


def _write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def _builds_a_pooler_it_lacks(folder: Path, config) -> bool:
    """Whether loading the folder with ``AutoModel`` would build a pooler (BERT and kin)
    that its weights do not hold."""
    from safetensors import safe_open

    from santa.models.folders import without_pooler

    if not without_pooler(str(folder), config):
        return False  # the class has no pooler to leave out
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        return False
    for path in weights:
        with safe_open(str(path), framework="pt") as handle:
            if any(".pooler." in f".{key}" for key in handle.keys()):  # noqa: SIM118
                return False
    return True


def write_sentence_transformers_files(
    folder: str | Path, truncate_dim: int | None = None
) -> dict[str, Any]:
    """Add the sentence-transformers module files to a santa model folder; returns what
    was written (pooling, similarity, max_seq_length, modules, prompts, truncate_dim).
    ``truncate_dim``: the folder encodes to that many dimensions (``None``: all)."""
    import torch

    from santa.eval.evaluation import EvalConfig, evaluation_lengths
    from santa.models.dual_encoder import DualEncoder

    folder = Path(folder)
    model = DualEncoder.from_pretrained(str(folder))
    config = model.model_config
    if config.kind == "t5":
        raise STExportError(
            "a T5 model cannot be a sentence-transformers folder: santa embeds with the "
            "decoder's state at position 0 and sentence-transformers runs a T5's encoder only "
            "(export without --format, and load it with santa.load)"
        )
    saved = folder / "santa_config.json"
    train = json.loads(saved.read_text()).get("train", {}) if saved.is_file() else {}
    document_length = evaluation_lengths(model, train, EvalConfig()).document
    hidden = model.backbone.config.hidden_size
    if truncate_dim is not None and not 0 < truncate_dim <= model.embedding_dim:
        raise STExportError(
            f"--dim {truncate_dim}: the model gives {model.embedding_dim}-dimensional vectors"
        )
    if (
        config.is_decoder
        and model.tokenizer is not None
        and model.tokenizer.padding_side != "right"
    ):
        model.tokenizer.padding_side = "right"
        model.tokenizer.save_pretrained(str(folder))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    module_config: dict[str, Any] = {
        "max_seq_length": document_length,
        "do_lower_case": bool(config.lowercase),
    }
    if _builds_a_pooler_it_lacks(folder, config):
        # The Transformer module hands these to AutoModel.from_pretrained (every release
        # since 2.x; 6.x reads the old name as model_kwargs).
        module_config["model_args"] = {"add_pooling_layer": False}
    _write_json(folder / "sentence_bert_config.json", module_config)
    _write_json(
        folder / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": hidden,
            "pooling_mode_cls_token": config.pooling == "cls",
            "pooling_mode_mean_tokens": config.pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_lasttoken": config.pooling == "last",
        },
    )
    if model.projection is not None:
        from safetensors.torch import save_file

        path = "2_Dense"
        _write_json(
            folder / path / "config.json",
            {
                "in_features": hidden,
                "out_features": model.projection.out_features,
                "bias": model.projection.bias is not None,
                "activation_function": _ACTIVATION_CLASSES[config.projection_activation],
            },
        )
        state = {
            f"linear.{key}": value.detach().to(torch.float32).contiguous()
            for key, value in model.projection.state_dict().items()
        }
        save_file(state, str(folder / path / "model.safetensors"))
        modules.append(
            {"idx": 2, "name": "2", "path": path, "type": "sentence_transformers.models.Dense"}
        )
    if config.similarity == "cosine":
        index = len(modules)
        modules.append(
            {
                "idx": index,
                "name": str(index),
                "path": f"{index}_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    _write_json(folder / "modules.json", modules)
    prompts = {
        name: prefix
        for name, prefix in (("query", config.query_prefix), ("document", config.document_prefix))
        if prefix
    }
    settings: dict[str, Any] = {
        "similarity_fn_name": "cosine" if config.similarity == "cosine" else "dot",
        "prompts": prompts,
        "default_prompt_name": None,
    }
    if truncate_dim is not None:
        settings["truncate_dim"] = truncate_dim
    _write_json(folder / "config_sentence_transformers.json", settings)
    return {
        "pooling": config.pooling,
        "similarity": config.similarity,
        "max_seq_length": document_length,
        "modules": [module["type"].rsplit(".", 1)[-1] for module in modules],
        "prompts": prompts,
        "truncate_dim": truncate_dim,
    }
