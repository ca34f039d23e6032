"""cluster.yaml: checked offline against Ray's own launcher schema and EC2's API model.

``ray up`` runs ``prepare_config`` (merges the AWS defaults, merges setup commands, checks the
docker section) and then ``validate_config`` (``ray/autoscaler/ray-schema.json`` plus
cross-field checks) before it talks to AWS; both run here without a network. Each node
type's ``node_config`` is what Ray passes to EC2 ``RunInstances``, so it is validated against
botocore's model of that call.
"""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

CLUSTER_YAML = Path(__file__).resolve().parents[1] / "cluster.yaml"
IMAGE = "rayproject/ray:2.60.0-py311-gpu"
GPU_INSTANCE = re.compile(r"^(g\d|p\d|trn|inf|dl)", re.IGNORECASE)


def load() -> dict[str, Any]:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def check(config: dict[str, Any]) -> dict[str, Any]:
    """What ``ray up`` checks before launching anything; returns the prepared config."""
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return load()


def test_validates_against_rays_schema(config) -> None:
    prepared = check(config)
    assert prepared["provider"] == {
        "type": "aws",
        "region": "us-west-2",
        "availability_zone": config["provider"]["availability_zone"],
        "cache_stopped_nodes": False,
    }
    assert prepared["head_node_type"] in prepared["available_node_types"]
    assert config["idle_timeout_minutes"] > 0
    assert config["max_workers"] >= sum(
        node.get("max_workers", 0) for node in config["available_node_types"].values()
    )


def test_node_configs_are_valid_run_instances_requests(config) -> None:
    import botocore.session
    from botocore.validate import validate_parameters

    ec2 = botocore.session.get_session().get_service_model("ec2")
    shape = ec2.operation_model("RunInstances").input_shape
    for name, node_type in config["available_node_types"].items():
        # Ray adds the counts (and the AMI, subnets, key) itself.
        request = {**node_type["node_config"], "MinCount": 1, "MaxCount": 1}
        validate_parameters(request, shape)  # raises ParamValidationError on a bad key/type
        profile = node_type["node_config"]["IamInstanceProfile"]["Arn"]
        assert re.fullmatch(r"arn:aws:iam::\d{12}:instance-profile/[\w+=,.@-]+", profile), name


def test_docker_image_matches_the_client(config) -> None:
    assert config["docker"]["image"] == IMAGE
    assert "head_image" not in config["docker"] and "worker_image" not in config["docker"]
    assert any("NLTK_DATA=" in option for option in config["docker"]["run_options"])


def test_head_is_cpu_only_with_a_head_resource(config) -> None:
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    assert head["resources"].get("head", 0) >= 1
    assert not GPU_INSTANCE.match(head["node_config"]["InstanceType"])


def test_gpu_workers_autoscale_from_zero(config) -> None:
    gpu_types = {
        name: node
        for name, node in config["available_node_types"].items()
        if GPU_INSTANCE.match(node["node_config"]["InstanceType"])
    }
    assert gpu_types, "no GPU worker type"
    for node in gpu_types.values():
        assert node["min_workers"] == 0
        assert node["max_workers"] >= 1


def test_spot_cpu_workers_for_ray_data(config) -> None:
    spot = [
        node
        for name, node in config["available_node_types"].items()
        if name != config["head_node_type"]
        and node["node_config"].get("InstanceMarketOptions", {}).get("MarketType") == "spot"
    ]
    assert spot and all(node["min_workers"] == 0 for node in spot)
    assert all(not GPU_INSTANCE.match(node["node_config"]["InstanceType"]) for node in spot)


def test_setup_installs_santa_with_gpu_extra_and_the_tagger(config) -> None:
    prepared = check(config)
    for commands in (prepared["head_setup_commands"], prepared["worker_setup_commands"]):
        text = "\n".join(commands)
        assert re.search(r"pip install (-e )?\"?\$HOME/santa\[gpu\]", text), text
        assert "nltk.downloader" in text and "averaged_perceptron_tagger_eng" in text
    # The synced tree is what pip installs.
    assert config["file_mounts"] == {"~/santa": "."}
    pyproject = tomllib.loads((CLUSTER_YAML.parent / "pyproject.toml").read_text())
    assert "gpu" in pyproject["project"]["optional-dependencies"]


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda c: c.update(min_workers_typo=1), id="unknown-top-level-key"),
        pytest.param(lambda c: c.update(max_workers="twelve"), id="wrong-type"),
        pytest.param(
            lambda c: c["available_node_types"]["gpu"].update(min_worker=0),
            id="unknown-node-type-key",
        ),
        pytest.param(
            lambda c: c["docker"].update(imagee=IMAGE),
            id="unknown-docker-key",
        ),
        pytest.param(lambda c: c.update(head_node_type="nope"), id="missing-head-type"),
    ],
)
def test_broken_configs_fail_validation(mutate) -> None:
    config = load()
    mutate(config)
    with pytest.raises((jsonschema.ValidationError, ValueError)):
        check(config)


def test_bad_node_config_fails_the_ec2_model() -> None:
    import botocore.session
    from botocore.exceptions import ParamValidationError
    from botocore.validate import validate_parameters

    config = load()
    node_config = config["available_node_types"]["cpu_spot"]["node_config"]
    node_config["InstanceMarketOptions"] = {"MarketTyp": "spot"}
    shape = (
        botocore.session.get_session()
        .get_service_model("ec2")
        .operation_model("RunInstances")
        .input_shape
    )
    with pytest.raises(ParamValidationError):
        validate_parameters({**node_config, "MinCount": 1, "MaxCount": 1}, shape)


def test_declared_resources_let_santa_size_pools_by_what_the_cluster_can_grow_to(config) -> None:
    """Worker types state their CPUs and GPUs, so that ``cluster_capacity`` (which reads
    the autoscaler's config on the head) sees the GPU workers before any is up."""
    from santa.cluster.ray_utils import declared_max_resources

    declared = declared_max_resources(config)
    types = config["available_node_types"]
    workers = [node for name, node in types.items() if name != config["head_node_type"]]
    assert all(node["resources"].get("CPU") for node in workers)
    expected_gpus = sum(node["max_workers"] * node["resources"].get("GPU", 0) for node in workers)
    assert declared["GPU"] == expected_gpus >= 1
    assert declared["CPU"] > types[config["head_node_type"]]["resources"]["CPU"]


def test_serving_notes_name_commands_that_parse() -> None:
    """The Serving notes' index and serve commands are valid command lines of the jobs."""
    from ray_jobs import index, serve

    lines = CLUSTER_YAML.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# Serving"))
    commands: list[str] = []
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        text = line[1:].strip()
        if text.startswith("ray job submit"):
            commands.append(text)
        elif commands and text.startswith("--"):
            commands[-1] += " " + text
    parsed = {}
    for command in commands:
        module, _, arguments = command.partition(" -- python -m ")[2].partition(" ")
        parser = {"ray_jobs.index": index.parse_args, "ray_jobs.serve": serve.parse_args}[module]
        parsed.setdefault(module, []).append(parser(arguments.split()))
    assert parsed["ray_jobs.index"][0].output == "s3://BUCKET/indexes/csn"
    first, stop = parsed["ray_jobs.serve"]
    assert first.detach and first.host == "0.0.0.0" and first.gpus_per_replica == 1
    assert first.index == parsed["ray_jobs.index"][0].output and stop.stop
