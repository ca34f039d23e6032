"""Recipes that reproduce a table of the papers, each setting with where it comes from.

Each :class:`TableRecipe` names the table and row it reproduces and the stage chain that
produced the row; every field of the ``model``, ``train`` and ``negatives`` sections that
changes what is computed is one of its :class:`Setting` s, which says its source:

- ``paper``: stated in the paper (the section is given);
- ``SANTA code``: not in the paper, or stated otherwise there, taken from SANTA's released
  code (github.com/OpenMatch/SANTA at c52f1e0: ``shell/*.sh``, ``model.py``,
  ``train_santa.py``; its trainer is Hugging Face's ``Trainer`` with OpenMatch's training
  arguments, whose defaults fill in what the scripts leave out). Where the paper's text and
  the released code disagree, the recipes follow the code and say which option selects the
  text (README, "Where the paper's text and its released code disagree");
- ``santa``: the paper and the code leave it open; santa's choice, with the reason;
- ``not read``: the stage never reads it (no hard negatives in pretraining, no MEP in
  fine-tuning, a T5 has no encoder-only projection), listed so every field is accounted for.

The scripts are templates in places (``shell/finetune-code.sh``: ``--learning_rate 1e-5 or
2e-5``, ten epochs, no hard negative, a batch of 128 with the comment "16 for adv"): where
they do not pin a table's number, the paper's is kept and the script's value is named.

The fields left out of every recipe are :data:`NOT_COMPUTATIONAL`: they change how or where
the same numbers are computed (logging, checkpoints, compilation, workers, resources), not
the numbers. A field added to the config later is in neither until someone decides
(tests/test_table_recipes.py fails until then). Run a family with ``ray_jobs.pipeline
--recipe NAME --stages <its chain>``; ``stage_recipe`` refuses a stage outside the chain, so
a forgotten ``--stages`` cannot silently train another recipe.
"""

from __future__ import annotations

from typing import Any

from santa.config import SantaConfig
from santa.config.table_settings import (  # noqa: F401 - the settings' names, re-exported
    CODE,
    NOT_COMPUTATIONAL,
    PAPER,
    SANTA,
    SOURCES,
    UNREAD,
    Setting,
    TableRecipe,
    code,
    paper,
    santa,
    unread,
)

__all__ = [
    "CODE",
    "NOT_COMPUTATIONAL",
    "PAPER",
    "SANTA",
    "TABLE_RECIPES",
    "UNREAD",
    "Setting",
    "TableRecipe",
]

# ----------------------------------------------------------------------------- shared

# SANTA section 4: "We use Adam optimizer ... set the warmup proportion to 0.1".
_ADAM = paper("adam", "SANTA §4 (Adam)")
# Adam has no weight decay of its own; SANTA's Trainer (Hugging Face) runs at weight
# decay 0 and clips gradients at norm 1.0 unless told otherwise, and the scripts never say.
_NO_DECAY = code(0.0, "Hugging Face Trainer default weight_decay=0.0 (not set in shell/*.sh)")
_CLIP = code(1.0, "Hugging Face Trainer default max_grad_norm=1.0 (not set in shell/*.sh)")
_WARMUP = paper(
    0.1, "SANTA §4 and A.4 (warm-up proportion 0.1; OpenMatch's DRTrainingArguments default)"
)
# Eq. 2: "sim is the dot product"; no temperature.
_DOT = paper("dot", "SANTA Eq. 2 (dot product)")
_DECODER0 = paper("decoder0", "SANTA Eq. 1 (first decoder position)")
# Lengths: the paper states none; the scripts pass these to train_santa.py.
_QUERY_LENGTH = code(50, "shell/pretrain-*.sh, finetune-*.sh: --q_max_len 50")
_DOCUMENT_LENGTH = code(240, "shell/pretrain-*.sh, finetune-*.sh: --p_max_len 240")
_TARGET_LENGTH = code(
    35,
    "shell/pretrain-code.sh and shell/pretrain-product.sh: --l_max_len 35 (santa_arguments.py's "
    "default too; the paper states none, Eq. 7 runs over every masked entity)",
)
# Eq. 7 sums each document's target tokens; the released code takes Hugging Face's loss.
_MEP_REDUCTION = code(
    "token_mean",
    "model.py SModel.encode_p: items_out.loss of T5ForConditionalGeneration(labels=...), "
    "the mean over the batch's target tokens (data_collator.py QPCollator sets padding to "
    "-100); Eq. 7's per-document sum is train.mep_reduction=sum",
)
# The released dev scripts score every saved checkpoint and keep the best.
_BEST_CODE = code(
    "dev_mrr",
    "shell/dev_code_*.sh, code_best_dev/evaluate_code_*.py: every saved checkpoint's MRR on "
    "the dev set, the best copied to best_dev",
)
_BEST_PRODUCT = code(
    "dev_ndcg",
    "shell/dev_product_*.sh, product_best_dev/evaluate_shop_*.py: every saved checkpoint's "
    "NDCG@100 on the dev queries, the best copied to best_dev (two-class gains over each "
    "query's judged products there; santa's dev_ndcg ranks the dev split's corpus)",
)
# The released trainer's batches (the paper says nothing of the order).
_SHUFFLE = santa(
    "global",
    "a new seeded permutation of the whole set every epoch. SANTA's train_santa.py streams "
    "its JSON lines through a 10,000-row shuffle buffer reseeded each epoch (trainer.py's "
    "MappingDRTrainDataset subclasses OpenMatch's StreamTrainDatasetMixin, whatever its name "
    "says); its code pretraining file is shuffled once when built "
    "(processing/Code/build_code_entity.py), its fine-tuning and product files are not. "
    "train.shuffle=local with train.shuffle_buffer=10000 is that mechanism over santa's "
    "corpus-ordered pairs",
)


def _model(backbone: Setting) -> dict[str, Setting]:
    """The dual encoder: one T5 for queries and documents, Eq. 1-2 (every stage)."""
    return {
        "model.backbone": backbone,
        "model.kind": paper("t5", "SANTA §4 (T5 / CodeT5)"),
        "model.pooling": _DECODER0,
        "model.similarity": _DOT,
        "model.temperature": paper(1.0, "SANTA Eq. 2 (the dot product, no temperature)"),
        "model.max_seq_length": code(
            None, "train_santa.py: texts are cut at --q_max_len / --p_max_len only"
        ),
        "model.lowercase": code(
            False, "processing/*/build_*.py: texts are tokenized as they are written"
        ),
        "model.tokenizer": code(
            None, "train_santa.py: the backbone's own tokenizer (--model_name_or_path)"
        ),
        **unread(
            "model.projection_dim",
            "model.projection_bias",
            "model.projection_activation",
            why="an encoder-only projection: a T5 has none (model.py: no linear head)",
        ),
        **unread(
            "model.tiny_d_model",
            "model.tiny_num_layers",
            "model.tiny_num_heads",
            "model.tiny_num_kv_heads",
            "model.tiny_d_ff",
            "model.tiny_vocab_size",
            "model.tiny_dropout",
            why="read for backbone='tiny' only (the T5's own config sets its dropout)",
        ),
        **unread("model.append_eos", why="decoder backbones only (a T5's tokenizer adds </s>)"),
        "model.query_prefix": code("", "processing/*/build_*.py: queries embedded as written"),
        "model.document_prefix": code("", "processing/*/build_*.py: documents embedded as written"),
        "model.lora_rank": code(0, "train_santa.py trains every weight of the T5 (no adapters)"),
        **unread(
            "model.lora_alpha",
            "model.lora_dropout",
            "model.lora_target_modules",
            "model.lora_trainable_modules",
            why="LoRA only (model.lora_rank > 0)",
        ),
    }


def _training(
    batch: Setting, lr: Setting, epochs: Setting, best: Setting | None = None
) -> dict[str, Setting]:
    """Optimisation, batches and precision (every stage)."""
    return {
        "train.objective": paper("santa", "SANTA §3: SDA (+ λ·MEP) pretraining, DR fine-tuning"),
        "train.keep_best_by": best or _BEST_CODE,
        "train.keep_best_mode": code("max", "the dev scripts keep the highest score"),
        "train.optimizer": _ADAM,
        "train.weight_decay": _NO_DECAY,
        "train.grad_clip": _CLIP,
        "train.warmup_ratio": _WARMUP,
        "train.global_batch_size": batch,
        "train.learning_rate": lr,
        "train.epochs": epochs,
        "train.max_steps": code(None, "shell/*.sh: --num_train_epochs, no --max_steps"),
        "train.max_query_length": _QUERY_LENGTH,
        "train.max_document_length": _DOCUMENT_LENGTH,
        "train.shuffle": _SHUFFLE,
        **unread("train.shuffle_buffer", why="train.shuffle=global permutes the whole set"),
        "train.drop_last": code(
            False,
            "train_santa.py: Hugging Face's TrainingArguments.dataloader_drop_last default "
            "(shell/*.sh do not set it); santa completes the last batch with the epoch's "
            "first rows, where the released Trainer trains a smaller last batch",
        ),
        "train.epoch_unit": code(
            "pair",
            "train_santa.py: one example per line of the training file, one pair each "
            "(build_code*.py, build_product_entity.py write a line per pair)",
        ),
        "train.mask_duplicates": code(
            False,
            "model.py SModel.forward: cross-entropy over every in-batch score; a document "
            "in the batch twice is a negative of its own query (no duplicate mask)",
        ),
        "train.bf16": code(
            False, "shell/*.sh pass no --fp16/--bf16: Hugging Face's Trainer trains in float32"
        ),
        **unread(
            "train.bf16_weights", "train.bf16_position_bias", why="read under train.bf16 only"
        ),
        "train.matryoshka_dims": paper((), "SANTA Eq. 3 and 5: the loss of the whole embedding"),
        **unread("train.matryoshka_weights", why="with train.matryoshka_dims only"),
        "train.seed": santa(
            42,
            "santa's seed (data order, masking); SANTA's Trainer defaults to 42 too, for "
            "its own draws",
        ),
    }


_NO_MINING = (
    "negatives.pool",
    "negatives.top_k",
    "negatives.skip_top",
    "negatives.index",
    "negatives.max_score_ratio",
    "negatives.min_margin",
)
_ASYNC_ONLY = unread(
    "negatives.refresh_every",
    "negatives.wait_for_first",
    why="async mining only; the paper mines once (--hard-negatives table)",
)


def _in_batch(where: str) -> dict[str, Setting]:
    """In-batch negatives only: nothing is mined."""
    return {
        "negatives.source": paper("none", f"{where} (in-batch negatives only)"),
        "negatives.per_query": paper(0, f"{where} (in-batch negatives only)"),
        **unread(*_NO_MINING, why="no hard negatives in this stage"),
        **_ASYNC_ONLY,
    }


def _pretrain(backbone: Setting, batch: Setting, lr: Setting, epochs: Setting) -> dict:
    """Structure-aware pretraining (SDA + MEP, in-batch negatives only)."""
    return {
        **_model(backbone),
        # The reference embeds the document from the same pass that gives the MEP loss.
        "model.embed_unmasked_document": code(
            False, "model.py encode_p: embedding from the masked pass with labels"
        ),
        **_training(batch, lr, epochs),
        "train.stage": paper("pretrain", "SANTA §3.2"),
        "train.sda_weight": paper(1.0, "SANTA Eq. 4 (L = L_SDA + L_MEP)"),
        "train.mep_weight": paper(1.0, "SANTA Eq. 4 (L = L_SDA + L_MEP)"),
        "train.mep_reduction": _MEP_REDUCTION,
        "train.max_target_length": _TARGET_LENGTH,
        **_in_batch("SANTA A.2"),
    }


def _finetune(pretrain: dict, lr: Setting, epochs: Setting, batch: Setting) -> dict:
    """Fine-tuning with the DR loss (Eq. 3) and in-batch negatives, from the pretrained model."""
    settings = dict(pretrain)
    settings.update(
        {
            "train.stage": paper("finetune", "SANTA §4 (fine-tuning, Eq. 3)"),
            "train.sda_weight": paper(1.0, "SANTA Eq. 3 (the DR loss alone)"),
            "train.mep_weight": paper(0.0, "SANTA Eq. 3 (the DR loss alone)"),
            **unread(
                "model.embed_unmasked_document",
                "train.mep_reduction",
                "train.max_target_length",
                why="MEP runs in the pretrain stage only",
            ),
            "train.learning_rate": lr,
            "train.epochs": epochs,
            "train.global_batch_size": batch,
            **_in_batch("SANTA §4, SANTA (Inbatch)"),
        }
    )
    return settings


def _ance(
    finetune: dict, lr: Setting, epochs: Setting, count: Setting, mined_by: str, where: str
) -> dict:
    """Fine-tuning on in-batch negatives plus ``count`` hard negatives from the top 100."""
    settings = dict(finetune)
    settings.update(
        {
            "train.learning_rate": lr,
            "train.epochs": epochs,
            # Mined once with the previous stage's model and sampled from, as ANCE's first
            # round: the pipeline's ance stage with --hard-negatives table (its default).
            "negatives.source": santa(
                "none",
                "the pipeline's ance stage sets table:<URI>, the negatives it mines once "
                "with the previous stage's model (--hard-negatives table, its default)",
            ),
            "negatives.per_query": count,
            "negatives.top_k": paper(100, f"{where} (sampled from the top 100 {mined_by})"),
            "negatives.skip_top": santa(0, "the paper samples from the whole top 100"),
            "negatives.pool": santa(
                None,
                "the table keeps per_query negatives per query, drawn once from the top 100 "
                "(ANCE's first round; the paper does not say how often it draws)",
            ),
            "negatives.max_score_ratio": santa(None, "the paper samples from the whole top 100"),
            "negatives.min_margin": santa(None, "the paper samples from the whole top 100"),
            "negatives.index": santa(
                "flat",
                "exact search, so the top 100 is the model's own (SANTA's shell/index-code.sh "
                "retrieves with OpenMatch's faiss IndexFlatIP, exact too)",
            ),
            **_ASYNC_ONLY,
        }
    )
    return settings


# ----------------------------------------------------------------------------- code

_CODET5 = paper("Salesforce/codet5-base", "SANTA §4 (CodeT5-base for code search)")
_A4_PRETRAIN = _pretrain(
    _CODET5,
    batch=paper(
        128,
        "SANTA A.4 (batch 128 in pretraining; shell/pretrain-code.sh passes 128, its comment: "
        "'16 for adv and 128 for CodeSearch' is Table 2's Adv batch)",
    ),
    lr=paper(5e-5, "SANTA A.4 (pretraining learning rate 5e-5; shell/pretrain-code.sh agrees)"),
    epochs=paper(10, "SANTA A.4 (10 pretraining epochs; shell/pretrain-code.sh agrees)"),
)


def _a4_finetune(lr: Setting) -> dict:
    """A.4's fine-tuning: batch 128, 12 epochs, in-batch negatives and one hard negative."""
    finetune = _finetune(
        _A4_PRETRAIN,
        lr=lr,
        epochs=paper(
            12, "SANTA A.4 (12 fine-tuning epochs; shell/finetune-code.sh's template: 10)"
        ),
        batch=paper(
            128,
            "SANTA A.4 (batch 128 in fine-tuning; shell/finetune-code.sh passes 128, its "
            "comment: '16 for adv and 128 for CodeSearch' is Table 2's Adv batch)",
        ),
    )
    one = paper(
        1,
        "SANTA A.4 (one hard negative; shell/finetune-code.sh's template: --train_n_passages 1, "
        "none)",
    )
    return _ance(
        finetune, lr, finetune["train.epochs"], one, "of the pretrained SANTA", "SANTA A.4"
    )


_MEP_NOTE = (
    "MEP is the released code's mean over the batch's target tokens (train.mep_reduction="
    "token_mean); the paper's Eq. 7 sums each document's target tokens: --set "
    "train.mep_reduction=sum."
)
_PRECISION_NOTE = (
    "The released code trains in float32 (train.bf16=false), also on a GPU: --set "
    "train.bf16=true trains faster under bf16 autocast, which the released code never did."
)
# The released code's text and MEP targets (processing/Code/build_code_entity.py), the
# default of every code table recipe's data: `ray_jobs.preprocess --recipe NAME`.
_RELEASED_CODE_DATA = {
    "code_text": code(
        "tokens",
        "processing/Code/build_code*.py: positives ' '.join(code_tokens), queries "
        "' '.join(docstring_tokens), in pretraining and fine-tuning; CodeXGLUE evaluates on "
        "the same joined tokens",
    ),
    "mep_targets": code(
        "released",
        "processing/Code/build_code_entity.py: every Python identifier; elsewhere the names of "
        "random.sample(Identifiers, int(max(ratio*(n-1), 1))), ratio 0.1 for JavaScript and "
        "0.5 otherwise; the label ends with the next sentinel",
    ),
}
_CODE_NOTES = (
    "Chain: pretrain, then fine-tune with one hard negative mined by the *pretrained* model "
    "(A.4): ray_jobs.pipeline --stages pretrain,ance.",
    "Pretraining data: CodeSearchNet with the CodeSearch/Adv dev and test functions left out "
    "(A.4); santa's preprocessing drops every held-out url and duplicate document.",
    "SANTA's scripts train one model per language (shell/pretrain-code.sh, finetune-code.sh "
    "take one language's data): run once per language with --languages for CodeSearch.",
    _MEP_NOTE,
    _PRECISION_NOTE,
)

CODET5_BASE_CODESEARCH = TableRecipe(
    name="codet5-base-codesearch",
    reproduces="SANTA Table 6 (Appendix A.4), CodeSearch columns, row SANTA (Hard Negative)",
    chain=("pretrain", "ance"),
    stages={
        "pretrain": _A4_PRETRAIN,
        "ance": _a4_finetune(paper(2e-5, "SANTA A.4 (learning rate 2e-5 for CodeSearch)")),
    },
    notes=_CODE_NOTES,
    preprocess=_RELEASED_CODE_DATA,
)

CODET5_BASE_ADV = TableRecipe(
    name="codet5-base-adv",
    reproduces="SANTA Table 6 (Appendix A.4), Adv column, row SANTA (Hard Negative)",
    chain=("pretrain", "ance"),
    stages={
        "pretrain": _A4_PRETRAIN,
        "ance": _a4_finetune(paper(1e-5, "SANTA A.4 (learning rate 1e-5 for Adv)")),
    },
    notes=(
        *_CODE_NOTES[:2],
        "Fine-tuning data: AdvTest's train split (python); evaluate with --protocol advtest.",
        _MEP_NOTE,
        _PRECISION_NOTE,
    ),
    preprocess=_RELEASED_CODE_DATA,
)

# Table 2's code column: section 4 gives batch 16 for everything, 5e-5 for 6 epochs of
# continuous training, 1e-5 for 6 epochs of in-batch fine-tuning, 1e-6 for the hard
# negatives (no epoch count); SANTA's README lists the same pretraining parameters.
_T2_BATCH = paper(16, "SANTA §4 (batch size 16; shell/*-code.sh's comment: 16 for adv)")
_T2_PRETRAIN = _pretrain(
    _CODET5,
    batch=_T2_BATCH,
    lr=paper(
        5e-5, "SANTA §4 (continuous training learning rate 5e-5 for code; SANTA's README agrees)"
    ),
    epochs=paper(
        6,
        "SANTA §4 (6 continuous training epochs; SANTA's README agrees, shell/pretrain-code.sh "
        "has A.4's 10)",
    ),
)
_T2_FINETUNE = _finetune(
    _T2_PRETRAIN,
    lr=paper(
        1e-5,
        "SANTA §4 (fine-tuning learning rate 1e-5 for code; shell/finetune-code.sh's "
        "template: '1e-5 or 2e-5')",
    ),
    epochs=paper(
        6, "SANTA §4 (6 fine-tuning epochs for code; shell/finetune-code.sh's template: 10)"
    ),
    batch=_T2_BATCH,
)
_T2_ANCE = _ance(
    _T2_FINETUNE,
    lr=paper(1e-6, "SANTA §4 (hard-negative learning rate 1e-6 for code)"),
    epochs=santa(6, "not stated; as the in-batch fine-tuning stage"),
    count=santa(1, "§4 gives no count; one, as A.4's fine-tuning and ANCE train"),
    mined_by="of SANTA (Inbatch)",
    where="SANTA §4",
)

CODET5_BASE_ADV_TABLE2 = TableRecipe(
    name="codet5-base-adv-table2",
    reproduces="SANTA Table 2, code column (Adv MRR), rows SANTA (Inbatch) after finetune "
    "and SANTA (Hard Negative) after ance",
    chain=("pretrain", "finetune", "ance"),
    stages={"pretrain": _T2_PRETRAIN, "finetune": _T2_FINETUNE, "ance": _T2_ANCE},
    notes=(
        "Table 2's Adv MRR: 46.1 zero-shot (after pretrain), 47.3 SANTA (Inbatch), 47.5 SANTA "
        "(Hard Negative); evaluate with --protocol advtest.",
        "Pretraining data: CodeSearchNet python's train and test splits merged (Table 5: "
        "429,596 pairs, as SANTA's README merges them): ray_jobs.preprocess --dataset "
        "codesearchnet --languages python --split train+test --recipe codet5-base-adv-table2. "
        "Its test functions are, most likely, the un-obfuscated AdvTest test functions "
        "(CodeXGLUE built AdvTest's test set from CodeSearchNet python's test split, names "
        "obfuscated), so Table 2's zero-shot Adv figure may have seen its test code: the job "
        "says so in one line.",
        "Fine-tuning data (finetune and ance): AdvTest's train split (python).",
        "Hard negatives: mined once by the in-batch fine-tuned model (the finetune stage), one "
        "per query sampled from its top 100.",
        _MEP_NOTE,
        _PRECISION_NOTE,
    ),
    preprocess={
        **_RELEASED_CODE_DATA,
        "split": code(
            "train+test",
            "SANTA's README (the Table 5 pretraining set): CodeSearchNet python train and test "
            "merged (429,596 pairs)",
        ),
    },
)

# ----------------------------------------------------------------------------- products

_T5 = paper("t5-base", "SANTA §4 (T5-base for product search)")
_ESCI_BATCH = paper(16, "SANTA §4 (batch size 16; shell/*-product*.sh agree)")
_ESCI_PRETRAIN = _pretrain(
    _T5,
    batch=_ESCI_BATCH,
    lr=paper(
        1e-4,
        "SANTA §4 (continuous training learning rate 1e-4 for products; "
        "shell/pretrain-product.sh agrees)",
    ),
    epochs=paper(6, "SANTA §4 (6 continuous training epochs; shell/pretrain-product.sh agrees)"),
)
_ESCI_PRETRAIN["train.keep_best_by"] = _BEST_PRODUCT  # every product stage
_ESCI_FINETUNE = _finetune(
    _ESCI_PRETRAIN,
    lr=paper(
        5e-5,
        "SANTA §4 (fine-tuning learning rate 5e-5 for products; 'shell/finetune-product .sh' "
        "repeats pretraining's 1e-4)",
    ),
    epochs=paper(
        60,
        "SANTA §4 (60 fine-tuning epochs for products; 'shell/finetune-product .sh' repeats "
        "pretraining's 6)",
    ),
    batch=_ESCI_BATCH,
)
# The released product fine-tuning's epoch (trainer.py Sdataset.get_process_fn over
# processing/Product/build_product.py's file of one line per query) and query length.
_ESCI_FINETUNE.update(
    {
        "train.epoch_unit": code(
            "query",
            "trainer.py Sdataset.get_process_fn: one example per query and epoch, its positive "
            "group_positives[(hash(seed) + epoch) % n]; build_product.py drops queries "
            "without a negative judgment",
        ),
        "train.max_query_length": code(
            21,
            "processing/Product/build_product.py cuts ESCI queries to 20 tokens without special "
            "tokens; trainer.py's create_one_example then adds </s> (--q_max_len 50 never binds)",
        ),
    }
)
_ESCI_ANCE = _ance(
    _ESCI_FINETUNE,
    lr=paper(1e-5, "SANTA §4 (hard-negative learning rate 1e-5 for products)"),
    # The paper gives no epoch count for this stage; the scripts' dev checkpoint folder is
    # named hard-neg/top-100/t5-shop-1e-5_60 (shell/dev_product_finetune.sh).
    epochs=santa(60, "not stated; as the fine-tuning stage (the scripts' t5-shop-1e-5_60)"),
    count=santa(1, "§4 gives no count; one, as A.4's fine-tuning and ANCE train"),
    mined_by="of SANTA (Inbatch)",
    where="SANTA §4",
)

T5_BASE_ESCI = TableRecipe(
    name="t5-base-esci",
    reproduces="SANTA Table 2, product columns (NDCG@100 two- and four-class), rows "
    "SANTA (Inbatch) after finetune and SANTA (Hard Negative) after ance",
    chain=("pretrain", "finetune", "ance"),
    stages={"pretrain": _ESCI_PRETRAIN, "finetune": _ESCI_FINETUNE, "ance": _ESCI_ANCE},
    notes=(
        "Pretraining pairs: ray_jobs.preprocess --dataset esci --esci-version large "
        "--esci-pretrain paper (one pair per Exact judgment, as SANTA's "
        "processing/Product/build_product_entity.py; Table 5: 331,590 pairs).",
        "Fine-tuning pairs: --stage finetune --split train (ESCI small, the dev queries "
        "carved out as SANTA's build_product.py); dev: --stage eval --split valid.",
        "SANTA's code embeds a product as 'title : T text : D' (description only); santa "
        "embeds 'T D' with the bullet points after the description, in training and "
        "evaluation alike.",
        _MEP_NOTE,
        _PRECISION_NOTE,
    ),
)

TABLE_RECIPES: dict[str, TableRecipe] = {
    recipe.name: recipe
    for recipe in (CODET5_BASE_CODESEARCH, CODET5_BASE_ADV, CODET5_BASE_ADV_TABLE2, T5_BASE_ESCI)
}


def table_recipe_factories() -> dict[str, Any]:
    """``{recipe name: factory}`` for every stage of every table recipe (``santa.config.recipes``)."""
    factories = {}
    for recipe in TABLE_RECIPES.values():
        for stage in recipe.stages:
            name = recipe.name if stage == "pretrain" else f"{recipe.name}-{stage}"
            factories[name] = _factory(recipe, stage)
    return factories


def _factory(recipe: TableRecipe, stage: str):
    def build() -> SantaConfig:
        return recipe.config(stage)

    build.__doc__ = f"{recipe.reproduces}: the {stage} stage."
    return build


def check_stage(recipe_name: str, stage: str) -> None:
    """Raise ValueError when ``stage`` is not in the chain of the table recipe ``recipe_name``."""
    recipe = TABLE_RECIPES.get(recipe_name)
    if recipe is not None and stage not in recipe.chain:
        recipe.config(stage)  # raises with the chain in the message
