"""Memory per GPU when a GRPO run is spread over several GPUs: ZeRO stages 0-3, offload, vLLM server.

Introduced in ``07_beyond_one_gpu.ipynb``. Built on :func:`labkit.memory.estimate`, which gives the
one-GPU breakdown; this module only divides its terms the way data-parallel sharding does. With
``N`` GPUs, each training on its own prompts (DeepSpeed ZeRO, Rajbhandari et al. 2020; FSDP is
PyTorch's counterpart of stage 3):

============  ==========================================================  ============================
stage         what each GPU holds                                          ``accelerate`` config
============  ==========================================================  ============================
0 (DDP)       everything: weights, reference, gradients, optimizer states  ``configs/multi_gpu.yaml``
1             optimizer states ``/ N``                                     DeepSpeed ``zero_stage: 1``
2             optimizer states and gradients ``/ N``                       DeepSpeed ``zero_stage: 2``
3             weights, reference, gradients, optimizer states ``/ N``      ``configs/zero3_offload.yaml``,
                                                                           ``configs/fsdp.yaml``
============  ==========================================================  ============================

Activations, the LM-head buffers and the KV cache are not sharded: each GPU runs its own
micro-batch. Four corrections to the one-GPU estimate, each a documented behaviour:

- **fp32 master weights.** DeepSpeed's mixed-precision optimizer keeps, for each trainable weight
  stored in bf16/fp16, an fp32 copy plus two fp32 Adam moments: 12 bytes a parameter (the ZeRO
  paper's ``K = 12``; DeepSpeed's docs: "32-bit weights, and the first, and second moment
  estimates") beside bf16 weights and gradients, where the one-GPU recipe keeps fp32 weights under
  autocast (:func:`~labkit.memory.estimate`'s default: 4 + 4 + 8 bytes). Stages 1-3 count 2 + 2 + 12
  (``master_weights=True``); stage 0 keeps :func:`~labkit.memory.estimate`'s figure, because plain
  DDP runs the same optimizer as one GPU. (accelerate's FSDP keeps fp32 sharded weights and fp32
  gradients instead: 4 + 4 + 8 bytes, the same 16 bytes a parameter in total.)
- **the gathered layer.** Under stage 3 a layer's weights are all-gathered just before it runs, and
  the next one is prefetched: add two decoder layers' weights (or the embedding matrix, if larger).
- **generation under stage 3.** TRL's ``ds3_gather_for_generation=True`` (its default) gathers the
  *whole* policy on every GPU to generate; ``False`` generates layer by layer from the shards
  (slow); ``vllm_server=True`` moves generation to a separate GPU (``trl vllm-serve``), so the
  training GPUs hold no KV cache at all.
- **offload.** ``offload_optimizer`` moves the optimizer shards to CPU RAM (stage >= 1);
  ``offload_params`` (stage 3 only) moves the weight shards of the policy and of the reference model
  to CPU RAM, as ``configs/zero3_offload.yaml`` does; ``offload_reference`` moves only the reference
  model's (the "reference model offload" of OpenRLHF issue 193). Offloaded bytes are reported as
  ``host`` (CPU RAM per GPU process), not dropped.

:func:`config_path` finds the accelerate configs shipped in ``labkit/configs/`` and
:func:`launch_command` builds the ``accelerate launch ... -m labkit train`` command line for them
(or for several CPU processes joined by gloo, which is how CI runs two ranks without a GPU).
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit.memory import GIB, MemoryEstimate, estimate
from labkit.memory import model_shape

__all__ = [
    "ZERO_STAGES",
    "CONFIGS",
    "config_path",
    "launch_command",
    "CODELLAMA_34B",
    "codellama_34b_config",
    "ShardedEstimate",
    "sharded_estimate",
    "sharding_table",
    "smallest_setup",
]

ZERO_STAGES = (0, 1, 2, 3)
# The accelerate configs shipped in labkit/configs/, by what they do.
CONFIGS = {
    "ddp": "multi_gpu.yaml",
    "zero3-offload": "zero3_offload.yaml",
    "fsdp": "fsdp.yaml",
}
# Adam under mixed precision: fp32 master weight + fp32 first and second moments (ZeRO's K = 12).
_MASTER_ADAM_BYTES = 12

# Published shape of codellama/CodeLlama-34b-hf (its config.json on the Hugging Face hub): a
# 33.7B-parameter Llama. Shapes are all the estimator needs; no weights are downloaded.
CODELLAMA_34B = dict(
    model_type="llama", hidden_size=8192, intermediate_size=22016, num_hidden_layers=48,
    num_attention_heads=64, num_key_value_heads=8, vocab_size=32000, max_position_embeddings=16384,
    rope_theta=1000000.0, tie_word_embeddings=False,
)


def codellama_34b_config():
    """Return a transformers ``LlamaConfig`` with CodeLlama-34B's published shape (for :func:`sharded_estimate`)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(**CODELLAMA_34B, name_or_path="codellama/CodeLlama-34b-hf")


@dataclass(frozen=True)
class ShardedEstimate:
    """What :func:`sharded_estimate` returns: one GPU's memory in a multi-GPU run, term by term.

    ``bytes`` holds the per-GPU terms of :class:`labkit.memory.MemoryEstimate` (``weights``,
    ``reference``, ``gradients``, ``optimizer``, ``activations``, ``logits``, ``kv_cache``) plus
    ``gathered`` (stage 3's working set), the two phase peaks and ``total``; ``host`` is what each
    GPU's process keeps in CPU RAM. Attributes of the same names give GiB. ``single`` is the
    one-GPU estimate it started from.
    """

    bytes: dict
    host: int
    settings: dict
    single: object  # labkit.memory.MemoryEstimate

    __getattr__ = MemoryEstimate.__getattr__  # a term's name gives it in GiB

    @property
    def host_gib(self) -> float:
        return self.host / GIB

    def fits(self, card_gib: float, headroom_gib: float = 1.0) -> bool:
        """Return True when the per-GPU total plus ``headroom_gib`` (CUDA context, fragmentation) fits ``card_gib``."""
        return self.total + headroom_gib <= card_gib

    def label(self) -> str:
        """Return a short name of the set-up: ``"1 GPU"``, ``"8 GPUs, ZeRO-3 + offload params"``."""
        s = self.settings
        gpus = f"{s['num_gpus']} GPU{'s' if s['num_gpus'] > 1 else ''}"
        if s["zero_stage"] == 0:
            stage = "" if s["num_gpus"] == 1 else ", DDP (ZeRO-0)"
        else:
            stage = f", ZeRO-{s['zero_stage']}"
        extras = [name.replace("_", " ") for name in ("offload_optimizer", "offload_params", "offload_reference") if s[name]]
        if s["vllm_server"]:
            extras.append("vLLM server")
        elif s["zero_stage"] == 3 and not s["gather_for_generation"]:
            extras.append("no gather for generation")
        return f"{gpus}{stage}" + (" + " + ", ".join(extras) if extras else "")

    def as_dict(self) -> dict:
        """Return every per-GPU term in GiB (keys ending in ``_gib``), ``host_gib`` and the settings."""
        out = {f"{k}_gib": round(v / GIB, 3) for k, v in self.bytes.items()}
        out["host_gib"] = round(self.host / GIB, 3)
        out.update(self.settings)
        return out


def sharded_estimate(model, method: str = "full", *, num_gpus: int, zero_stage: int = 3,
                     offload_optimizer: bool = False, offload_params: bool = False,
                     offload_reference: bool = False, gather_for_generation: bool = True,
                     vllm_server: bool = False, master_weights: bool | None = None,
                     **estimate_kwargs) -> ShardedEstimate:
    """Return a :class:`ShardedEstimate`: the memory of ONE of ``num_gpus`` GPUs in a ZeRO-``zero_stage`` run.

    ``model``, ``method`` and ``estimate_kwargs`` (GRPOConfig's names: ``per_device_train_batch_size``,
    ``gradient_accumulation_steps``, ``steps_per_generation``, ``num_generations``, ``max_prompt_length``,
    ``max_completion_length``, ``beta``, ``optim``, ``gradient_checkpointing``; and ``precision``,
    ``lora_rank`` ...) go to :func:`labkit.memory.estimate` unchanged: the batch is per GPU, as TRL's
    ``per_device_train_batch_size`` is. With ``N = num_gpus``, per GPU:

    - weights ``W``, reference ``R``: ``/ N`` at stage 3, else whole; 0 on the GPU when offloaded;
    - gradients ``G``: ``/ N`` from stage 2; optimizer ``O``: ``/ N`` from stage 1, where stages 1-3
      count ``12 P_t`` bytes for half-precision trainable weights (fp32 master + two fp32 moments);
    - ``gathered`` (stage 3): ``w x max(2 layer, V h)``, the layer that runs and the one prefetched;
    - ``generation = W_gen + R + O + kv_cache`` with ``W_gen`` the whole policy when stage 3
      gathers it for generation, and ``kv_cache = 0`` with a vLLM server on another GPU;
    - ``training = W + gathered + R + O + G + activations + logits``; ``total`` = the larger phase.

    ``num_gpus=1, zero_stage=0`` returns :func:`labkit.memory.estimate`'s figures unchanged.
    """
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of {ZERO_STAGES}, not {zero_stage!r}")
    if num_gpus < 1:
        raise ValueError(f"num_gpus must be at least 1, not {num_gpus}")
    if offload_params and zero_stage != 3:
        raise ValueError("offload_params needs ZeRO stage 3: only stage 3 partitions the weights "
                         "(DeepSpeed accepts offload_param only with zero_stage: 3)")
    if offload_reference and zero_stage != 3:
        raise ValueError("offload_reference needs ZeRO stage 3: below it TRL keeps a whole reference model on each GPU")
    if offload_optimizer and zero_stage == 0:
        raise ValueError("offload_optimizer needs ZeRO stage 1, 2 or 3 (ZeRO-Offload moves the optimizer shards)")
    if vllm_server and zero_stage == 3 and not gather_for_generation:
        raise ValueError("vllm_server needs gather_for_generation=True: TRL refuses vLLM with "
                         "ds3_gather_for_generation=False")

    if master_weights is None:
        master_weights = zero_stage >= 1
    if zero_stage >= 1 and method == "full" and master_weights:
        # DeepSpeed's bf16 / fp16 modes keep 16-bit weights on the GPU and the fp32 master copy inside the optimizer
        # state (the 12 bytes below), not as fp32 weights under autocast (the one-GPU recipe's default)
        estimate_kwargs.setdefault("fp32_master_weights", False)
    one = estimate(model, method, **estimate_kwargs)
    shape = model_shape(model)
    n = num_gpus
    single = one.bytes
    precision = one.settings["precision"]
    half_trainable = method == "full" and precision in ("bf16", "fp16")
    optimizer = single["optimizer"]
    if master_weights and half_trainable and one.settings["optim"] == "adamw":
        optimizer = _MASTER_ADAM_BYTES * one.trainable_params

    weights = single["weights"] / n if zero_stage == 3 else single["weights"]
    reference = single["reference"] / n if zero_stage == 3 else single["reference"]
    gradients = single["gradients"] / n if zero_stage >= 2 else single["gradients"]
    optimizer = optimizer / n if zero_stage >= 1 else optimizer
    host = 0.0
    if offload_optimizer:
        host += optimizer
        optimizer = 0.0
    if offload_params:
        host += weights + reference
        weights = reference = 0.0
    elif offload_reference:
        host += reference
        reference = 0.0

    gathered = 0.0
    partitioned = zero_stage == 3 and (n > 1 or offload_params)  # one GPU, no offload: nothing is partitioned
    if partitioned:
        weight_bytes = single["weights"] / max(shape.params, 1)  # bytes of one weight as stored
        embedding = shape.vocab_size * shape.hidden_size
        per_layer = max(shape.params - (1 if shape.tied_embeddings else 2) * embedding, 0) / max(shape.num_layers, 1)
        gathered = weight_bytes * max(2 * per_layer, embedding)

    kv_cache = 0 if vllm_server else single["kv_cache"] + single.get("transients", 0)  # + generation transients
    if partitioned and gather_for_generation and not vllm_server:
        generation_weights = single["weights"]  # the whole policy, gathered on every GPU
    else:
        generation_weights = weights + gathered
    generation = generation_weights + reference + optimizer + kv_cache
    training = weights + gathered + reference + optimizer + gradients + single["activations"] + single["logits"]
    terms = dict(weights=weights, reference=reference, gradients=gradients, optimizer=optimizer,
                 activations=single["activations"], logits=single["logits"], kv_cache=kv_cache,
                 gathered=gathered, generation_phase=generation, training_phase=training,
                 total=max(generation, training))
    terms = {k: int(round(v)) for k, v in terms.items()}
    settings = dict(model=shape.name, method=method, num_gpus=n, zero_stage=zero_stage,
                    offload_optimizer=offload_optimizer, offload_params=offload_params,
                    offload_reference=offload_reference, gather_for_generation=gather_for_generation,
                    vllm_server=vllm_server, master_weights=bool(master_weights and half_trainable))
    return ShardedEstimate(bytes=terms, host=int(round(host)), settings=settings, single=one)


# The set-ups a learner climbs through, cheapest first (fewest GPUs, least communication, no offload).
_LADDER = (
    dict(zero_stage=0),
    dict(zero_stage=1),
    dict(zero_stage=2),
    dict(zero_stage=3),
    dict(zero_stage=3, offload_reference=True),
    dict(zero_stage=3, offload_optimizer=True),
    dict(zero_stage=3, offload_optimizer=True, offload_params=True),
)


def sharding_table(model, method: str = "full", *, num_gpus: int, card_gib: float, headroom_gib: float = 1.0,
                   setups=None, **kwargs) -> list[dict]:
    """Return one row per set-up (one GPU, then ZeRO 0-3 and offload on ``num_gpus``): per-GPU GiB and whether it fits.

    Each row: ``setup`` (a label), the per-GPU terms in GiB, ``total_gib``, ``host_gib`` (CPU RAM
    per GPU process) and ``fits`` (``total + headroom_gib <= card_gib``). ``kwargs`` go to
    :func:`sharded_estimate` (``gather_for_generation``, ``vllm_server``) and on to
    :func:`labkit.memory.estimate`. ``07_beyond_one_gpu.ipynb`` shows it as a table.
    """
    rows = []
    plans = [(1, dict(zero_stage=0))] + [(num_gpus, dict(s)) for s in (setups or _LADDER)]
    for gpus, setup in plans:
        est = sharded_estimate(model, method, num_gpus=gpus, **setup, **kwargs)
        row = {"setup": est.label()}
        row.update({f"{k}_gib": round(getattr(est, k), 2) for k in
                    ("weights", "reference", "gradients", "optimizer", "gathered", "activations", "logits",
                     "kv_cache", "generation_phase", "training_phase", "total")})
        row["host_gib"] = round(est.host_gib, 2)
        row["fits"] = est.fits(card_gib, headroom_gib)
        rows.append(row)
    return rows


def smallest_setup(model, method: str = "full", *, card_gib: float, gpu_counts=(1, 2, 4, 8),
                   headroom_gib: float = 1.0, allow_offload: bool = True, **kwargs) -> ShardedEstimate | None:
    """Return the first set-up that fits ``card_gib`` per GPU, climbing the ladder; None if none does.

    The ladder: one GPU; then for 2, 4, 8 ... GPUs: ZeRO-0 (DDP), 1, 2, 3, 3 + reference offload,
    3 + optimizer offload, 3 + parameter offload. Fewer GPUs come first, and on a given count the
    set-up with the least communication and offload. ``allow_offload=False`` skips the offload
    rungs: offload saves GPUs but moves states over PCIe every step, so it is also the slowest.
    """
    ladder = _LADDER if allow_offload else tuple(s for s in _LADDER if not any(k.startswith("offload") for k in s))
    for gpus in gpu_counts:
        for setup in ((dict(zero_stage=0),) if gpus == 1 else ladder):
            est = sharded_estimate(model, method, num_gpus=gpus, **setup, **kwargs)
            if est.fits(card_gib, headroom_gib):
                return est
    return None


# --------------------------------------------------------------------------- launching


def config_path(name: str) -> str:
    """Return the path of a shipped accelerate config: ``"ddp"``, ``"zero3-offload"``, ``"fsdp"`` (or its file name)."""
    from importlib import resources

    filename = CONFIGS.get(name, name)
    if filename not in CONFIGS.values():
        raise KeyError(f"unknown accelerate config {name!r}; the lab ships {', '.join(CONFIGS)}")
    return str(resources.files("labkit").joinpath("configs", filename))


def launch_command(train_args, *, num_processes: int = 2, config: str | None = None, cpu: bool = False,
                   python: str | None = None, script: str | None = None) -> list[str]:
    """Return the argv of ``accelerate launch [--config_file C] --num_processes N -m labkit train TRAIN_ARGS``.

    ``config`` is one of :data:`CONFIGS` (``"ddp"``, ``"zero3-offload"``, ``"fsdp"``); its
    ``num_processes`` is overridden by ``num_processes`` (one process per GPU).

    ``cpu=True`` starts ``num_processes`` CPU processes joined by gloo, as CI does. accelerate's own
    ``--cpu --num_processes N`` does not do that: without MPI (``--mpirun_hostfile``) accelerate 1.15
    starts ONE process. So the command says ``--multi_gpu`` (torchrun starts N processes) on a
    machine with no CUDA device (``CUDA_VISIBLE_DEVICES=""`` for the child processes), and the
    trainer's ``use_cpu=True`` (:func:`labkit.training.grpo_config`) makes accelerate pick MULTI_CPU
    with the gloo backend. ``script`` runs a Python file instead of ``-m labkit`` (with the same
    ``train ...`` arguments); the multi-process test uses it to record what each rank sees.
    """
    import sys

    command = [python or sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch"]
    if cpu:
        if config is not None:
            raise ValueError("cpu=True runs plain data parallelism over CPU processes; the GPU configs do not apply")
        command += ["--multi_gpu", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    elif config is not None:
        command += ["--config_file", config_path(config)]
    else:
        command += ["--multi_gpu"]
    command += ["--num_processes", str(num_processes), "--main_process_port", "0"]
    command += [script] if script else ["-m", "labkit"]
    return command + ["train", *map(str, train_args)]
