"""Config: validation, dict round trips, dotted overrides and recipes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from santa.config import ModelConfig, NegativesConfig, SantaConfig, TrainConfig
from santa.config.recipes import PIPELINE_STAGES, RECIPES, get_recipe, minilm_path, stage_recipe


def test_defaults_are_the_paper() -> None:
    config = SantaConfig()
    assert config.model.kind == "t5"
    assert config.model.pooling == "decoder0"
    assert config.model.similarity == "dot"
    assert config.model.embed_unmasked_document is False
    assert config.train.mep_weight == 1.0
    assert config.train.warmup_ratio == 0.1
    assert config.train.global_batch_size == 128
    assert (config.train.max_query_length, config.train.max_document_length) == (50, 240)


def test_global_batch_must_divide_among_workers() -> None:
    with pytest.raises(ValueError, match="not divisible by num_workers=3"):
        TrainConfig(global_batch_size=128, num_workers=3)
    assert TrainConfig(global_batch_size=128, num_workers=4).per_worker_batch_size() == 32


def test_mep_with_an_encoder_only_backbone_is_rejected() -> None:
    with pytest.raises(ValueError, match="encoder-only backbones train with the SDA/DR loss only"):
        SantaConfig(
            model=ModelConfig(backbone="bert-base-uncased", kind="encoder"),
            train=TrainConfig(mep_weight=1.0),
        )
    # Without MEP (λ = 0, or fine-tuning where MEP does not run) it is a valid baseline.
    SantaConfig(
        model=ModelConfig(backbone="bert-base-uncased", kind="encoder"),
        train=TrainConfig(mep_weight=0.0),
    )
    SantaConfig(
        model=ModelConfig(backbone="bert-base-uncased", kind="encoder"),
        train=TrainConfig(stage="finetune"),
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "gpt"}, "kind must be one of"),
        ({"kind": "t5", "pooling": "mean"}, "does not fit kind='t5'"),
        ({"kind": "encoder", "backbone": "bert", "pooling": "decoder0"}, "does not fit"),
        ({"similarity": "l2"}, "similarity must be one of"),
        ({"temperature": 0.0}, "temperature must be positive"),
        ({"tiny_num_heads": 3}, "must divide"),
        ({"backbone": ""}, "must name a model"),
    ],
)
def test_model_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stage": "train"}, "stage must be one of"),
        ({"learning_rate": 0.0}, "learning_rate must be positive"),
        ({"warmup_ratio": 1.0}, r"warmup_ratio must be in \[0, 1\)"),
        ({"mep_weight": -1.0}, "mep_weight must be >= 0"),
        ({"sda_weight": -1.0}, "sda_weight must be >= 0"),
        ({"sda_weight": 0.0, "mep_weight": 0.0}, "sda_weight=0 leaves no loss to train"),
        ({"sda_weight": 0.0, "stage": "finetune"}, "sda_weight=0 leaves no loss to train"),
        ({"max_steps": 0}, "max_steps must be positive"),
    ],
)
def test_train_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"per_query": -1}, "per_query must be >= 0"),
        ({"source": "sometimes"}, "must be 'none', 'async' or 'table:URI'"),
        ({"source": "table:"}, "needs a URI after 'table:'"),
        ({"source": "async"}, "needs per_query >= 1"),
        ({"index": "lsh"}, "index must be one of"),
        ({"refresh_every": 0}, "refresh_every must be positive"),
        ({"skip_top": -1}, "skip_top must be >= 0"),
        ({"encoder_gpus": -0.5}, "encoder_gpus and encoder_cpus must be >= 0"),
    ],
)
def test_negatives_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NegativesConfig(**kwargs)


def test_old_negatives_keys_are_read_from_stored_configs_and_named_in_overrides() -> None:
    """Configs stored before the negatives section (checkpoints, sweeps) still load, with
    their values in the new place; a --set of an old key says the new name in one line."""
    stored = get_recipe("tiny").to_dict()
    stored.pop("negatives")
    stored["train"].update(hard_negatives="async", hard_negatives_per_query=2, negatives_top_k=50)
    config = SantaConfig.from_dict(stored)
    assert (config.negatives.source, config.negatives.per_query) == ("async", 2)
    assert config.negatives.top_k == 50
    with pytest.raises(ValueError, match=r"train.negatives_top_k is now negatives.top_k"):
        get_recipe("tiny").with_overrides(["train.negatives_top_k=10"])
    assert get_recipe("tiny").with_overrides(["negatives.top_k=10"]).negatives.top_k == 10


def test_pooling_defaults_by_kind() -> None:
    assert ModelConfig(kind="t5").pooling == "decoder0"
    assert ModelConfig(backbone="bert", kind="encoder").pooling == "mean"


def test_configs_are_frozen_and_keyword_only() -> None:
    config = TrainConfig()
    with pytest.raises(AttributeError):
        config.learning_rate = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        TrainConfig("pretrain")  # type: ignore[misc]


def test_dict_round_trip_is_json_safe() -> None:
    config = get_recipe("tiny").with_overrides(["train.max_steps=7", "model.similarity=cosine"])
    payload = json.loads(json.dumps(config.to_dict()))
    assert SantaConfig.from_dict(payload) == config
    assert ModelConfig.from_dict(config.model.to_dict()) == config.model
    assert TrainConfig.from_dict(config.train.to_dict()) == config.train


def test_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match=r"unknown TrainConfig keys \['learning_rat'\]"):
        TrainConfig.from_dict({"learning_rat": 1e-4})
    with pytest.raises(ValueError, match="unknown SantaConfig keys"):
        SantaConfig.from_dict({"model": {}, "optim": {}})


def test_overrides_are_typed_by_field() -> None:
    config = SantaConfig().with_overrides(
        [
            "train.learning_rate=1e-4",
            "train.global_batch_size=64",
            "train.num_workers=2",
            "train.use_gpu=true",
            "train.grad_clip=none",
            "train.max_steps=100",
            "model.embed_unmasked_document=False",
            "model.backbone=s3://bucket/models/codet5",
        ]
    )
    assert config.train.learning_rate == 1e-4 and isinstance(config.train.learning_rate, float)
    assert config.train.global_batch_size == 64 and isinstance(config.train.global_batch_size, int)
    assert config.train.per_worker_batch_size() == 32
    assert config.train.use_gpu is True
    assert config.train.grad_clip is None
    assert config.train.max_steps == 100
    assert config.model.embed_unmasked_document is False
    assert config.model.backbone == "s3://bucket/models/codet5"


def test_overrides_switching_to_an_encoder_baseline() -> None:
    config = SantaConfig().with_overrides(
        ["model.backbone=bert", "model.kind=encoder", "model.pooling=mean", "train.mep_weight=0"]
    )
    assert config.model.pooling == "mean"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.learning_rate", "must look like"),
        ("learning_rate=1", "must look like"),
        ("optim.learning_rate=1", "section must be one of model, train, negatives, scoder"),
        ("train.lr=1", "unknown field"),
        ("train.global_batch_size=big", "expected int"),
        ("train.use_gpu=maybe", "expected true or false"),
        ("train.num_workers=3", "not divisible"),
        ("model.kind=encoder", "does not fit kind='encoder'"),
    ],
)
def test_bad_overrides(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SantaConfig().with_overrides([override])


def test_tiny_ci_is_the_tiny_recipe_at_test_size_in_every_stage() -> None:
    test_size = [
        "train.global_batch_size=8",
        "train.max_query_length=24",
        "train.max_document_length=96",
        "train.max_target_length=32",
        "model.tiny_vocab_size=2000",
    ]
    for stage in ("pretrain", "finetune", "ance"):
        assert stage_recipe("tiny-ci", stage) == stage_recipe("tiny", stage).with_overrides(
            test_size
        )


def test_recipes() -> None:
    assert {"tiny", "minilm", "codet5-base-code", "t5-base-product"} <= set(RECIPES)
    tiny = get_recipe("tiny")
    assert tiny.model.is_tiny and tiny.train.global_batch_size == 16
    assert (tiny.train.max_query_length, tiny.train.max_document_length) == (32, 128)
    code = get_recipe("codet5-base-code")
    assert code.model.backbone == "Salesforce/codet5-base"
    assert (code.train.learning_rate, code.train.global_batch_size) == (5e-5, 128)
    assert code.train.max_target_length == 60
    product = get_recipe("t5-base-product")
    assert (product.train.learning_rate, product.train.global_batch_size) == (1e-4, 16)
    assert product.train.max_target_length == 35


def test_unknown_recipe_lists_names() -> None:
    with pytest.raises(
        ValueError, match=r"known recipes: \['codet5-base-adv', .*'codet5-base-code',"
    ):
        get_recipe("codet5-large")


def test_minilm_recipe_points_into_the_package() -> None:
    config = get_recipe("minilm")
    assert config.model.kind == "encoder" and config.model.pooling == "mean"
    assert config.train.mep_weight == 0
    assert config.model.backbone == minilm_path()
    assert (Path(config.model.backbone) / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        # (stage, learning rate, global batch, epochs, MEP on, hard negatives per query)
        (
            "codet5-base-code",
            [
                ("pretrain", 5e-5, 128, 10, True, 0),
                ("finetune", 2e-5, 128, 12, False, 0),
                ("ance", 1e-6, 128, 12, False, 1),
            ],
        ),
        (
            "t5-base-product",
            [
                ("pretrain", 1e-4, 16, 6, True, 0),
                ("finetune", 5e-5, 16, 60, False, 0),
                ("ance", 1e-5, 16, 60, False, 1),
            ],
        ),
    ],
)
def test_paper_stage_recipes(family: str, expected: list) -> None:
    """SANTA section 4 and appendix A.4: each stage's learning rate, batch and epochs."""
    for stage, lr, batch, epochs, mep, negatives in expected:
        config = stage_recipe(family, stage)
        train = config.train
        assert train.stage == ("pretrain" if stage == "pretrain" else "finetune")
        assert (train.learning_rate, train.global_batch_size, train.epochs) == (lr, batch, epochs)
        assert train.uses_mep is mep
        assert config.negatives.per_query == negatives
        # Pretraining uses in-batch negatives only (the paper's appendix).
        assert stage != "pretrain" or config.negatives.source == "none"
    with pytest.raises(ValueError, match="unknown stage"):
        stage_recipe(family, "distill")


def test_every_recipe_has_its_stages() -> None:
    for family in ("tiny", "minilm", "codet5-base-code", "t5-base-product"):
        for stage in PIPELINE_STAGES:
            stage_recipe(family, stage)  # loads and validates


def test_single_pass_mep_with_hard_negatives_embeds_positives_unmasked() -> None:
    """Single-pass MEP embeds the masked document (sentinels inside); mined negatives are
    plain text. With hard negatives, positives must be embedded unmasked as well."""
    base = get_recipe("codet5-base-code")
    assert base.model.embed_unmasked_document is False  # in-batch only: the paper's one pass
    with_negatives = base.with_overrides(["negatives.source=async", "negatives.per_query=1"])
    assert with_negatives.model.embed_unmasked_document is True
    assert with_negatives.train.uses_mep
    finetune = get_recipe("codet5-base-code-ance").with_overrides(["negatives.source=async"])
    assert finetune.model.embed_unmasked_document is False  # no MEP, nothing masked


def test_elastic_workers_need_a_global_batch_every_size_divides() -> None:
    elastic = TrainConfig(global_batch_size=12, num_workers=4, min_workers=2)
    assert elastic.elastic and elastic.per_worker_batch_size(2) == 6
    assert elastic.per_worker_batch_size() == 3
    with pytest.raises(ValueError, match="not divisible by 3 workers"):
        TrainConfig(global_batch_size=8, num_workers=4, min_workers=3)
    with pytest.raises(ValueError, match="min_workers must be in"):
        TrainConfig(global_batch_size=8, num_workers=2, min_workers=3)
    assert not TrainConfig(global_batch_size=8, num_workers=2, min_workers=2).elastic
