"""Beyond one GPU: the shipped accelerate configs, the sharding arithmetic, and a real 2-process run.

- Each YAML under ``labkit/configs/`` is read by accelerate's own loader and launch parser, turned into
  the environment ``accelerate launch`` would give the workers, and the DeepSpeed / FSDP plugin is
  built from that environment: a misspelt key or an impossible value fails here, without GPUs and
  without deepspeed installed.
- ``labkit.scale`` divides :func:`labkit.memory.estimate`'s breakdown the way ZeRO 1-3 and offload do.
- ``accelerate launch`` starts two gloo CPU ranks of ``python -m labkit train`` with the tiny preset:
  different prompts on each rank, one saved adapter. (accelerate's ``--cpu --num_processes 2`` alone
  starts ONE process without MPI, which a test below shows; two CPU ranks need ``--multi_gpu`` on a
  machine that shows no CUDA device, see :func:`labkit.scale.launch_command`.)
"""
from __future__ import annotations

import dataclasses
import json
import os
from importlib import resources
from unittest import mock

import pytest
import yaml

from labkit.device import CARDS

CONFIGS = {
    "multi_gpu.yaml": "MULTI_GPU",
    "zero3_offload.yaml": "DEEPSPEED",
    "fsdp.yaml": "FSDP",
}


def _config_path(name):
    return str(resources.files("labkit").joinpath("configs", name))


def _launch_args(name):
    """Return (args, defaults): what ``accelerate launch --config_file NAME -m labkit train`` resolves to."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", _config_path(name), "-m", "labkit", "train"])
    args, defaults, _ = _validate_launch_command(args)
    return args, defaults


def _worker_env(name):
    """Return the environment variables ``accelerate launch`` would hand each worker for config NAME."""
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args, defaults = _launch_args(name)
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if k.startswith(("ACCELERATE_", "FSDP_"))}


def test_the_configs_ship_with_the_package():
    from labkit.scale import CONFIGS as BY_PURPOSE, config_path

    shipped = sorted(p.name for p in resources.files("labkit").joinpath("configs").iterdir() if p.name.endswith(".yaml"))
    assert shipped == sorted(CONFIGS) == sorted(BY_PURPOSE.values())
    assert config_path("zero3-offload") == _config_path("zero3_offload.yaml")
    with pytest.raises(KeyError, match="ships"):
        config_path("zero2")


def test_launch_commands_name_the_config_and_the_processes():
    from labkit.scale import launch_command

    command = launch_command(["--preset", "laptop-16gb"], num_processes=4, config="zero3-offload")
    assert command[2:4] == ["accelerate.commands.accelerate_cli", "launch"]
    assert command[command.index("--config_file") + 1].endswith("zero3_offload.yaml")
    assert command[command.index("--num_processes") + 1] == "4"
    assert command[-5:] == ["-m", "labkit", "train", "--preset", "laptop-16gb"]
    with pytest.raises(ValueError, match="cpu=True"):
        launch_command([], cpu=True, config="fsdp")


@pytest.mark.parametrize("name", CONFIGS)
def test_config_loads_with_accelerates_own_loader(name):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    config = load_config_from_file(_config_path(name))  # raises on a top-level key accelerate does not know
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type.value == CONFIGS[name]
    assert config.num_machines == 1 and config.num_processes >= 2 and config.use_cpu is False
    assert config.mixed_precision == "bf16"


def _unknown_options(raw: dict) -> list[str]:
    """Return the problems of a parsed accelerate YAML: keys accelerate does not know, values outside its choices."""
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser

    from accelerate.utils import constants

    fields = {f.name for f in dataclasses.fields(ClusterConfig)}
    problems = [f"{key} is not a ClusterConfig field" for key in raw if key not in fields]
    actions = {a.dest: a for a in launch_command_parser()._actions}
    # Values accelerate lists itself (its constants; the offload devices `accelerate config` offers).
    allowed = {
        "zero_stage": [0, 1, 2, 3],
        "offload_optimizer_device": ["none", "cpu", "nvme"],
        "offload_param_device": ["none", "cpu", "nvme"],
        "deepspeed_multinode_launcher": constants.DEEPSPEED_MULTINODE_LAUNCHERS,
        "fsdp_auto_wrap_policy": constants.FSDP_AUTO_WRAP_POLICY,
        "fsdp_state_dict_type": constants.FSDP_STATE_DICT_TYPE,
        "fsdp_backward_prefetch": constants.FSDP_BACKWARD_PREFETCH,
    }
    for section in ("deepspeed_config", "fsdp_config"):
        for key, value in (raw.get(section) or {}).items():
            if key not in actions:
                problems.append(f"{section}.{key} is not an `accelerate launch` option")
                continue
            choices = allowed.get(key, actions[key].choices)
            if choices is not None and str(value) not in {str(c) for c in choices}:
                problems.append(f"{section}.{key}={value!r} is not one of {list(choices)}")
    return problems


@pytest.mark.parametrize("name", CONFIGS)
def test_every_key_is_a_real_accelerate_option(name):
    """Top-level keys are ClusterConfig fields; nested keys are options of ``accelerate launch``, values in its choices."""
    assert _unknown_options(yaml.safe_load(open(_config_path(name)))) == []


def test_a_misspelt_key_or_value_is_caught(tmp_path):
    """The checks above can fail: misspelt keys and impossible values are reported, and accelerate refuses them too."""
    from accelerate.commands.config.config_args import load_config_from_file

    raw = yaml.safe_load(open(_config_path("zero3_offload.yaml")))
    bad = {**raw, "num_procesess": 2,
           "deepspeed_config": {**raw["deepspeed_config"], "offload_params_device": "cpu", "offload_optimizer_device": "gpu"}}
    problems = _unknown_options(bad)
    assert any("num_procesess" in p for p in problems)
    assert any("offload_params_device" in p for p in problems)
    assert any("offload_optimizer_device='gpu'" in p for p in problems)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match="unknown keys"):
        load_config_from_file(str(path))


def test_ddp_config_gives_each_gpu_a_full_copy():
    args, _ = _launch_args("multi_gpu.yaml")
    assert args.multi_gpu and not args.use_deepspeed and not args.use_fsdp
    assert args.gpu_ids == "all"
    assert _worker_env("multi_gpu.yaml")["ACCELERATE_MIXED_PRECISION"] == "bf16"


def test_zero3_config_builds_a_deepspeed_plugin_that_offloads_parameters():
    """The plugin accelerate would build in each worker: stage 3, parameters (policy and reference) in CPU RAM."""
    from accelerate.utils import DeepSpeedPlugin

    env = _worker_env("zero3_offload.yaml")
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    with mock.patch.dict(os.environ, env):
        plugin = DeepSpeedPlugin()  # reads the ACCELERATE_DEEPSPEED_* variables; deepspeed itself is not needed
    zero = plugin.deepspeed_config["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_param"]["device"] == "cpu"
    assert zero["offload_optimizer"]["device"] == "none"
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True  # a usable checkpoint, not shards
    assert plugin.zero3_init_flag is True
    # TRL gives the frozen reference model this same config without the optimizer settings
    # (trl.models.utils.prepare_deepspeed), so its parameter shards are offloaded as well.
    assert "offload_param" in zero


def test_fsdp_config_builds_an_fsdp2_plugin_that_wraps_decoder_layers():
    from accelerate.utils import FullyShardedDataParallelPlugin

    env = _worker_env("fsdp.yaml")
    assert env["ACCELERATE_USE_FSDP"] == "true"
    with mock.patch.dict(os.environ, env):
        plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is True  # full sharding, the ZeRO-3 equivalent
    assert plugin.auto_wrap_policy.__name__ == "transformer_auto_wrap_policy"
    assert plugin.state_dict_type.name == "FULL_STATE_DICT"
    # the lab's trainer checkpoints activations itself; transformers refuses FSDP's at the same time
    assert plugin.activation_checkpointing is False


# --------------------------------------------------------------------------- sharding arithmetic (labkit.scale)

SMALL = "Qwen/Qwen2.5-0.5B-Instruct"
SETTINGS = dict(beta=0.04, num_generations=4, per_device_train_batch_size=4, max_prompt_length=128,
                max_completion_length=128, precision="bf16")
LAPTOP_GIB, RTX4090_GIB, A100_GIB = (CARDS[k].gib for k in ("rtx3080-laptop-16gb", "rtx4090-24gb", "a100-80gb"))


def test_one_gpu_is_the_single_gpu_estimate():
    from labkit.memory import estimate
    from labkit.scale import sharded_estimate

    one = estimate(SMALL, "full", **SETTINGS)
    same = sharded_estimate(SMALL, "full", num_gpus=1, zero_stage=0, **SETTINGS)
    for key in ("weights", "reference", "gradients", "optimizer", "activations", "logits", "total"):
        assert same.bytes[key] == one.bytes[key], key
    assert same.bytes["kv_cache"] == one.bytes["kv_cache"] + one.bytes["transients"]  # generation's extra, counted there
    assert same.bytes["gathered"] == 0 and same.host == 0


def test_each_zero_stage_shards_what_it_says():
    from labkit.memory import estimate
    from labkit.scale import sharded_estimate

    n = 8
    ddp = estimate(SMALL, "full", **SETTINGS)  # one GPU's recipe: fp32 master weights under bf16 autocast
    # DeepSpeed (stages 1-3): bf16 weights and gradients on the GPU, the fp32 masters inside the optimizer state
    one = estimate(SMALL, "full", fp32_master_weights=False, **SETTINGS)
    stages = {k: sharded_estimate(SMALL, "full", num_gpus=n, zero_stage=k, **SETTINGS) for k in range(4)}
    master = 12 * one.trainable_params  # fp32 master weights + two fp32 moments
    assert stages[0].bytes["optimizer"] == ddp.bytes["optimizer"]  # plain DDP: the one-GPU optimizer, replicated
    assert stages[0].bytes["weights"] == ddp.bytes["weights"] == 2 * one.bytes["weights"]
    assert stages[1].bytes["optimizer"] == round(master / n)
    assert stages[1].bytes["gradients"] == one.bytes["gradients"]
    assert stages[2].bytes["gradients"] == round(one.bytes["gradients"] / n)
    assert stages[2].bytes["weights"] == one.bytes["weights"]
    assert stages[3].bytes["weights"] == round(one.bytes["weights"] / n)
    assert stages[3].bytes["reference"] == round(one.bytes["reference"] / n)  # TRL shards the reference at ZeRO-3
    assert stages[3].bytes["gathered"] > 0
    for k in range(1, 4):  # activations are per micro-batch: never sharded
        assert stages[k].bytes["activations"] == one.bytes["activations"]
    assert stages[0].bytes["activations"] == ddp.bytes["activations"]
    training = [stages[k].bytes["training_phase"] for k in range(1, 4)]
    assert training == sorted(training, reverse=True) and training[-1] < training[0]


def test_offload_moves_bytes_to_the_host_without_losing_any():
    from labkit.scale import sharded_estimate

    on_gpu = sharded_estimate(SMALL, "full", num_gpus=4, zero_stage=3, **SETTINGS)
    reference = sharded_estimate(SMALL, "full", num_gpus=4, zero_stage=3, offload_reference=True, **SETTINGS)
    both = sharded_estimate(SMALL, "full", num_gpus=4, zero_stage=3, offload_optimizer=True, offload_params=True,
                            **SETTINGS)
    assert reference.bytes["reference"] == 0 and reference.host == on_gpu.bytes["reference"]
    assert both.bytes["weights"] == both.bytes["reference"] == both.bytes["optimizer"] == 0
    moved = on_gpu.bytes["weights"] + on_gpu.bytes["reference"] + on_gpu.bytes["optimizer"]
    assert abs(both.host - moved) <= 2  # rounding of three terms
    assert both.total < reference.total < on_gpu.total


def test_generation_under_zero3_gathers_the_whole_policy_unless_told_otherwise():
    from labkit.scale import sharded_estimate

    gather = sharded_estimate(SMALL, "full", num_gpus=8, zero_stage=3, **SETTINGS)
    sharded = sharded_estimate(SMALL, "full", num_gpus=8, zero_stage=3, gather_for_generation=False, **SETTINGS)
    server = sharded_estimate(SMALL, "full", num_gpus=8, zero_stage=3, vllm_server=True, **SETTINGS)
    whole = gather.single.bytes["weights"]
    assert gather.bytes["generation_phase"] - sharded.bytes["generation_phase"] == whole - gather.bytes["weights"] - gather.bytes["gathered"]
    assert server.bytes["kv_cache"] == 0 and server.bytes["generation_phase"] < sharded.bytes["generation_phase"]


def test_impossible_setups_are_refused():
    from labkit.scale import sharded_estimate

    with pytest.raises(ValueError, match="stage 3"):
        sharded_estimate(SMALL, "full", num_gpus=2, zero_stage=2, offload_params=True, **SETTINGS)
    with pytest.raises(ValueError, match="zero_stage"):
        sharded_estimate(SMALL, "full", num_gpus=2, zero_stage=4, **SETTINGS)
    with pytest.raises(ValueError, match="stage 1, 2 or 3"):
        sharded_estimate(SMALL, "full", num_gpus=2, zero_stage=0, offload_optimizer=True, **SETTINGS)
    with pytest.raises(ValueError, match="num_gpus"):
        sharded_estimate(SMALL, "full", num_gpus=0, zero_stage=0, **SETTINGS)


def test_smallest_setup_climbs_only_as_far_as_needed():
    from labkit.scale import smallest_setup

    lora = smallest_setup(SMALL, "lora", card_gib=LAPTOP_GIB, **SETTINGS)
    assert lora.settings["num_gpus"] == 1
    sharded_generation = dict(SETTINGS, gather_for_generation=False)
    big = smallest_setup("Qwen/Qwen2.5-7B-Instruct", "full", card_gib=RTX4090_GIB, **sharded_generation)
    assert big is not None and big.settings["num_gpus"] > 1 and big.fits(RTX4090_GIB)
    no_offload = smallest_setup("Qwen/Qwen2.5-7B-Instruct", "full", card_gib=RTX4090_GIB, allow_offload=False,
                                **sharded_generation)
    assert no_offload.fits(RTX4090_GIB) and no_offload.host == 0
    assert no_offload.settings["num_gpus"] >= big.settings["num_gpus"]
    # TRL's default gathers the whole 7B policy on each GPU to generate: no rung without offload fits 24 GB
    assert smallest_setup("Qwen/Qwen2.5-7B-Instruct", "full", card_gib=RTX4090_GIB, allow_offload=False,
                          **SETTINGS) is None


@pytest.mark.slow
def test_34b_full_fine_tuning_needs_zero3_and_reference_offload_by_the_estimate():
    """The lab's own estimate for 34B on 8 x A100 80 GB (notebook 07), not a published recipe.

    OpenRLHF issue 193 (about DPO) only guessed that ZeRO-3 with reference offload "is OK", and the user then
    ran out of memory. With CodeLlama-34B's published shape, bf16, gradient checkpointing and beta > 0,
    notebook 07's settings: ZeRO-2 does not fit an A100 80 GB, ZeRO-3 alone misses by a few GiB, ZeRO-3
    plus the reference model in CPU RAM fits (with generation from the shards or a vLLM server).
    """
    from labkit.scale import codellama_34b_config, sharded_estimate

    config = codellama_34b_config()
    kw = dict(num_generations=8, per_device_train_batch_size=8, max_prompt_length=256, max_completion_length=512,
              beta=0.04,
              precision="bf16", gradient_checkpointing=True, gather_for_generation=False)
    one = sharded_estimate(config, "full", num_gpus=1, zero_stage=0, **kw)
    assert 33.0e9 < one.single.total_params < 34.5e9
    assert not sharded_estimate(config, "full", num_gpus=8, zero_stage=2, **kw).fits(A100_GIB)
    assert not sharded_estimate(config, "full", num_gpus=8, zero_stage=3, **kw).fits(A100_GIB)
    assert sharded_estimate(config, "full", num_gpus=8, zero_stage=3, offload_reference=True, **kw).fits(A100_GIB)


# --------------------------------------------------------------------------- two real processes

# Launched by accelerate in each process: records the prompts this rank scores (through the first
# reward function, which TRL calls on each rank with that rank's share of the batch), then runs the
# lab's CLI, `python -m labkit train ...`, unchanged, and prints accelerate's view of the process.
_PROBE = """
import json, os, sys
import labkit.run as presets  # build_run calls labkit.run.reward_functions

_reward_functions = presets.reward_functions

def recording_reward_functions(preset):
    funcs, weights = _reward_functions(preset)
    first = funcs[0]
    def recorded(completions, **kwargs):
        with open(os.path.join(os.environ["PROBE_DIR"], "rank" + os.environ["RANK"] + ".jsonl"), "a") as fh:
            for prompt in kwargs["prompts"]:
                fh.write(json.dumps(prompt[-1]["content"]) + "\\n")
        return first(completions, **kwargs)
    recorded.__name__ = first.__name__
    return [recorded, *funcs[1:]], weights

presets.reward_functions = recording_reward_functions
from labkit.cli import main
code = main(sys.argv[1:])
from accelerate import PartialState
print("[rank " + os.environ["RANK"] + "] " + str(PartialState()).replace(chr(10), " | "), flush=True)
sys.exit(code)
"""


def test_cpu_flag_alone_starts_one_process():
    """Why the test below says --multi_gpu: accelerate 1.15 runs `--cpu --num_processes 2` as ONE process (it needs MPI)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    args = launch_command_parser().parse_args(["--cpu", "--num_processes", "2", "-m", "labkit", "train"])
    args, _, _ = _validate_launch_command(args)
    cmd, env = prepare_simple_launcher_cmd_env(args)
    assert cmd[1:4] == ["-m", "labkit", "train"]  # a single `python -m labkit train`: no launcher, no second rank
    assert env.get("WORLD_SIZE") == os.environ.get("WORLD_SIZE")  # nothing tells the process it has a peer


@pytest.mark.slow
def test_two_processes_train_on_different_prompts_and_save_one_adapter(tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2` on a machine with no GPU: two gloo CPU ranks.

    Without CUDA, accelerate's state falls back to MULTI_CPU with the gloo backend (the trainer
    runs with use_cpu=True, from labkit.training.grpo_config). Two steps of the tiny preset.
    """
    import subprocess

    import torch
    from safetensors.torch import load_file

    from labkit.scale import launch_command

    probe = tmp_path / "probe.py"
    probe.write_text(_PROBE)
    (tmp_path / "prompts").mkdir()
    output_dir = tmp_path / "run"
    command = launch_command(["--preset", "cpu-tiny", "--max-steps", "2", "--output-dir", output_dir,
                              "--set", "save_strategy=no"], num_processes=2, cpu=True, script=str(probe))
    assert command[command.index("--num_processes") + 1] == "2" and "--multi_gpu" in command
    env = {**os.environ, "PROBE_DIR": str(tmp_path / "prompts"), "OMP_NUM_THREADS": "1", "LABKIT_MODE": "cpu",
           "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]

    # the logs show two processes, joined by gloo on the CPU
    ranks = {line.split("]")[0] + "]": line for line in log.splitlines() if line.startswith("[rank ")}
    assert sorted(ranks) == ["[rank 0]", "[rank 1]"], log[-3000:]
    for line in ranks.values():
        assert "DistributedType.MULTI_CPU  Backend: gloo" in line and "Num processes: 2" in line, line
    assert "done: 2 steps" in log

    # both ranks trained, on different prompts
    seen = {rank: [json.loads(line) for line in (tmp_path / "prompts" / f"rank{rank}.jsonl").read_text().splitlines()]
            for rank in (0, 1)}
    assert seen[0] and seen[1]
    assert not set(seen[0]) & set(seen[1]), "the two ranks scored the same prompts"

    # one adapter, saved once (by rank 0), and trained: LoRA's B matrices start at zero
    adapters = sorted(output_dir.rglob("adapter_model.safetensors"))
    assert adapters == [output_dir / "final" / "adapter_model.safetensors"]
    weights = load_file(adapters[0])
    lora_b = [t for name, t in weights.items() if "lora_B" in name]
    assert lora_b and all(torch.isfinite(t).all() for t in lora_b)
    assert any(t.abs().sum() > 0 for t in lora_b)


def test_fsdp_refuses_bitsandbytes_optimisers_and_qlora_saying_what_to_set(monkeypatch):
    """Every GPU preset uses a bitsandbytes 8-bit optimiser, which FSDP's sharded parameters break."""
    from labkit.presets import PRESETS, PresetError, get_preset
    from labkit.validation import validate

    laptop = CARDS["a100-80gb"].device()
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what accelerate launch --config_file fsdp.yaml sets
    for name, preset in PRESETS.items():
        if preset.card_gib is None:
            continue
        with pytest.raises(PresetError, match=r"does not support FSDP.*optim='adamw_torch'"):
            validate(preset, laptop, num_processes=2)
    with pytest.raises(PresetError, match=r"QLoRA under FSDP needs bnb_4bit_quant_storage.*method='lora'"):
        validate(get_preset("qlora-3b", optim="adamw_torch"), laptop, num_processes=2)
    assert validate(get_preset("laptop-16gb", optim="adamw_torch"), laptop, num_processes=2) is not None
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    assert validate(get_preset("laptop-16gb"), laptop, num_processes=2) is not None  # DDP keeps the 8-bit optimiser


def test_a_finished_training_leaves_the_process_group(tmp_path, monkeypatch):
    """Each process of ``accelerate launch`` trains in one process group; ``train`` leaves it once the run is saved,
    so that no process exits with the group's threads alive (notebook 07's two-process CPU run once aborted there:
    'terminate called without an active exception')."""
    import types

    import torch.distributed as dist

    import labkit.run
    from labkit.cli import train_cli

    class SavedRun:  # what build_run returns, trained and saved at once
        dropped_prompts, train_dataset = 0, []

        def train(self, resume=None):
            return types.SimpleNamespace(global_step=1)

        def save(self):
            return tmp_path / "run" / "final"

    monkeypatch.setattr(labkit.run, "build_run", lambda *args, **kwargs: SavedRun())
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert train_cli(["--preset", "cpu-tiny", "--output-dir", str(tmp_path / "run")]) == 0
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
