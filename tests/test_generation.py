"""A recipe's generation path (labkit.generation): the same tokens, refused before any model loads, timed honestly.

- **The same tokens**: greedy completions of SmolLM2-135M-Instruct's first layers are the same, token for token,
  through TRL's trainer with "static-compiled" (compiled on the CPU with inductor) and "continuous" as with TRL's
  default "generate". The whole model is compared by ``python -m bench generation-paths``
  (results/generation_paths.json), with a learning run.
- **Refused first**: every path a recipe, the card or the installed libraries cannot run raises PresetError in
  ``validate``, naming what to choose instead.
- **The clock**: what it logs through TRL's metrics, the continuous path's dtype cast undone bit for bit, and a
  generation past its limit stopped with a clear message instead of a hang.
- **The limit**: the memory-bandwidth arithmetic against the figures of issue 43.
"""
import time

import pytest
import torch

from labkit.device import CARDS
from labkit.generation import (PATHS, GenerationClock, GenerationTooSlow, card_limit, decode_limit,
                               generation_arguments, kv_bytes_per_token)
from labkit.presets import PresetError, get_preset
from labkit.validation import validate

CUDA = CARDS["rtx3080-laptop-16gb"].device()


def _greedy(path: str, tmp_path, layers: int = 4) -> list[list[int]]:
    """Greedy completions of 8 training prompts through TRL's trainer on ``path``: SmolLM2-135M-Instruct's first
    ``layers`` layers (real weights write varied tokens; random tiny models tie and flip between kernels; 4 of its
    30 layers keep the CPU compilation of "static-compiled" to about 20 s)."""
    from labkit.run import build_run

    preset = get_preset("cpu-smollm2").replace(max_steps=1, save_strategy="no", generation=path, max_completion_length=16)
    run = build_run(preset, tmp_path / path, print_logs=False, generation_kwargs={"do_sample": False})
    base = run.trainer.model.get_base_model()
    base.model.layers = base.model.layers[:layers]
    base.config.num_hidden_layers = layers  # the static cache is sized from the config
    if getattr(base.config, "layer_types", None):
        base.config.layer_types = base.config.layer_types[:layers]
    prompts = [run.tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
               for row in run.train_dataset.select(range(8))]
    prompts = [p["input_ids"] if hasattr(p, "keys") else p for p in prompts]
    completions, _ = run.trainer._generate_single_turn(prompts, None, {}, 1)
    assert run.generation.calls and run.generation.calls[-1]["sequences"] == 8
    if path == "static-compiled":  # compiled once, then warm: the same shapes again make no new graph
        again, _ = run.trainer._generate_single_turn(prompts, None, {}, 1)
        first, second = run.generation.calls
        assert first["compiled"] > 0 and second["compiled"] == 0 and again == completions
    return [list(map(int, c)) for c in completions]


@pytest.fixture(scope="module")
def default_tokens(tmp_path_factory):
    tokens = _greedy("generate", tmp_path_factory.mktemp("generate"))
    assert len({t for c in tokens for t in c}) > 5, "the comparison needs varied tokens"
    return tokens


@pytest.mark.parametrize("path", ["continuous", "static-compiled"])
def test_each_path_writes_the_default_paths_greedy_tokens(path, default_tokens, tmp_path):
    assert _greedy(path, tmp_path) == default_tokens


def test_the_comparison_sees_a_different_model(default_tokens, tmp_path):  # the test above can fail
    assert _greedy("generate", tmp_path, layers=3) != default_tokens


# --------------------------------------------------------------------------- refused before any model loads


@pytest.mark.parametrize("changes, device, expected", [
    (dict(generation="static"), None, "generation must be one of generate, static-compiled, continuous, vllm"),
    (dict(generation="static-compiled"), "qlora", "cannot compile a 4-bit (QLoRA) model"),
    (dict(generation="static-compiled"), "tools", "a new shape to compile each time"),
    (dict(generation="continuous", **{"generation_kwargs": {"min_new_tokens": 8}}), None,
     "drops min_new_tokens"),
    (dict(generation="continuous", **{"repetition_penalty": 1.1}), None, "drops repetition_penalty"),
    (dict(generation="continuous", gradient_accumulation_steps=12), "cuda",  # 288 sequences at full length
     "needs 12.7 GiB for its KV pages, attention mask and read buffers (transformers' own sizing), and this 15.7 GiB "
     "card has 11.8 GiB beside the weights and optimizer. Lower gradient_accumulation_steps"),
    (dict(generation="continuous", method="full", optim="adamw_torch"), "cuda", "a second copy of the model"),
    (dict(generation="vllm"), None, "needs a CUDA GPU"),
    (dict(generation="vllm"), "cuda", "vLLM is not installed"),
])
def test_a_path_that_cannot_run_is_refused_before_any_model_loads(changes, device, expected, monkeypatch):
    import labkit.models

    monkeypatch.setattr(labkit.models, "load_policy", lambda *a, **k: pytest.fail("a model was loaded"))
    base = {"qlora": "qlora-3b", "tools": "tools-16gb"}.get(device, "laptop-16gb" if device == "cuda" else "cpu-tiny")
    preset = get_preset(base).replace(**changes)
    with pytest.raises(PresetError) as error:
        validate(preset, CUDA if device in ("cuda", "qlora", "tools") else None)
    assert expected in str(error.value)
    assert "generation='generate'" in str(error.value) or "one of" in str(error.value) \
        or "static-compiled" in str(error.value)  # every refusal names what to choose instead


def test_the_paths_that_can_run_pass_and_static_compiled_on_a_cpu_warns():
    assert validate(get_preset("laptop-16gb").replace(generation="static-compiled"), CUDA) == \
        validate(get_preset("laptop-16gb"), CUDA)
    # no warning for continuous batching with LoRA: its CPU runs that stayed at the token limit were the recipe's
    # tipping point, which generate meets too (results/generation_paths.json, where_paths_part)
    assert validate(get_preset("laptop-16gb").replace(generation="continuous"), CUDA) == \
        validate(get_preset("laptop-16gb"), CUDA)
    warnings = validate(get_preset("cpu-tiny").replace(generation="static-compiled"))
    assert any("buys little on a CPU" in w for w in warnings)
    assert set(PATHS) == {"generate", "static-compiled", "continuous", "vllm"}


def test_config_may_not_set_a_paths_fields():
    preset = get_preset("cpu-tiny").replace(**{"use_transformers_continuous_batching": True})
    with pytest.raises(PresetError, match="the lab sets it from generation"):
        validate(preset)


def test_each_path_sets_its_grpo_config_fields():
    p = get_preset("laptop-16gb")
    assert generation_arguments(p) == {}
    # no pad_to_multiple_of: TRL would pad the loss's tensors too; the clock pads the prompts it generates from
    assert generation_arguments(p.replace(generation="static-compiled")) == dict(cache_implementation="static")
    cb = generation_arguments(p.replace(generation="continuous"))
    config = cb["transformers_continuous_batching_config"]
    assert cb["use_transformers_continuous_batching"] is True and config["seed"] == p.config["seed"]
    # pages for every sequence of the generation batch at full length, sized from the recipe
    assert config["num_blocks"] * config["page_size"] >= p.generation_batch_size * (
        p.max_prompt_length + p.config["max_completion_length"])
    assert config["drop_unsupported_processors"] is False  # a setting it cannot honour fails instead of vanishing
    # one whole prompt (256) or one decode step of the batch (96) a forward pass, not transformers' 8,192
    assert config["max_batch_tokens"] == 256 and config["max_memory_percent"] == 1.0


# --------------------------------------------------------------------------- the clock


class _Trainer:
    """What GenerationClock reads from a GRPOTrainer: a model, its metrics, _generate_single_turn."""

    def __init__(self, inner):
        from collections import defaultdict

        from transformers import AutoModelForCausalLM

        from labkit.models import resolve_model

        self.model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny:qwen2")).train()  # TRL trains
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._generate_single_turn = inner


def test_the_clock_logs_seconds_tokens_and_decode_steps_through_trls_metrics():
    ticks = iter([0.0, 2.0, 10.0, 11.0])
    trainer = _Trainer(lambda prompts, *a, **k: ([[1] * 10, [2] * 30], None))
    clock = GenerationClock(trainer, bandwidth_gb_s=448, clock=lambda: next(ticks))
    trainer._generate_single_turn([[5, 6], [7, 8, 9, 10]], None, {}, 1)
    trainer._generate_single_turn([[5, 6], [7, 8, 9, 10]], None, {}, 1)
    metrics = trainer._metrics["train"]
    assert metrics["generation/seconds"] == [2.0, 1.0]
    assert metrics["generation/tokens_per_second"] == [20.0, 40.0]  # 40 completion tokens
    assert metrics["generation/ms_per_decode_step"] == [2000 / 30, 1000 / 30]  # the longest completion: 30 steps
    call = clock.calls[0]
    assert call["prompt_tokens"] == 3 and call["first"] and not clock.calls[1]["first"]
    limit = decode_limit(clock.weight_bytes, clock.kv_bytes_per_token, 2, 3 + 15, 448e9)
    assert metrics["generation/bandwidth_share"][0] == pytest.approx(20.0 / limit)
    summary = clock.summary()
    assert summary["first_extra_s"] == 1.0 and summary["tokens_per_second"] == 40.0


def test_the_continuous_paths_cast_is_undone_bit_for_bit():
    def casting_generate(prompts, *a, **k):  # what TRL's continuous path does before generate_batch (bf16 runs)
        trainer.model.to(torch.bfloat16)
        return [[1, 2]], None

    def tensors(model):  # parameters and buffers: the rotary frequencies (inv_freq) are a buffer
        return [*model.named_parameters(), *model.named_buffers()]

    trainer = _Trainer(casting_generate)
    assert any(n.endswith("inv_freq") for n, _ in trainer.model.named_buffers())
    before = {n: (t.data_ptr(), t.dtype) for n, t in tensors(trainer.model)}
    values = {n: t.detach().clone() for n, t in tensors(trainer.model)}
    GenerationClock(trainer, "continuous")
    trainer._generate_single_turn([[1]], None, {}, 1)
    after = {n: (t.data_ptr(), t.dtype) for n, t in tensors(trainer.model)}
    assert after == before
    assert all(torch.equal(t, values[n]) for n, t in tensors(trainer.model))
    trainer = _Trainer(casting_generate)  # without the path's restore, the cast would stay: the check can fail
    GenerationClock(trainer, "generate")
    trainer._generate_single_turn([[1]], None, {}, 1)
    assert {t.dtype for _, t in tensors(trainer.model)} == {torch.bfloat16}


def test_a_generation_past_its_limit_stops_with_a_clear_message():
    def never_ends(prompts, *a, **k):
        while True:
            time.sleep(0.02)

    trainer = _Trainer(never_ends)
    GenerationClock(trainer, "static-compiled", compile_limit_s=0.3)
    start = time.perf_counter()
    with pytest.raises(GenerationTooSlow, match="ran past its 0.3 s limit and was stopped. Set generation='generate'"):
        trainer._generate_single_turn([[1]], None, {}, 1)
    assert time.perf_counter() - start < 5


def test_a_later_generation_of_a_known_shape_is_not_limited():
    trainer = _Trainer(lambda prompts, *a, **k: (time.sleep(0.5), ([[1]], None))[1])
    clock = GenerationClock(trainer, "static-compiled", compile_limit_s=0.3)
    with pytest.raises(GenerationTooSlow):
        trainer._generate_single_turn([[1]], None, {}, 1)
    trainer._generate_single_turn([[1]], None, {}, 1)  # the same shape again: compiled already, no watchdog
    assert clock.calls[-1]["seconds"] >= 0.5
    with pytest.raises(GenerationTooSlow):  # a new shape (a longer prompt) is watched again
        trainer._generate_single_turn([[1, 2]], None, {}, 1)


# --------------------------------------------------------------------------- the limit


def test_the_bandwidth_limit_gives_issue_43s_figures():
    # Qwen2.5-1.5B in bf16 at a generation batch of 96, prompts of up to 256 tokens, completions of 786: the weights
    # (3.09 GB) and the KV cache over the generation (about 1.8 GB) per decode step
    shape_kw = dict(batch=96, prompt_tokens=256, completion_tokens=786)
    h100 = card_limit("Qwen/Qwen2.5-1.5B-Instruct", CARDS["h100-80gb"], **shape_kw)
    laptop = card_limit("Qwen/Qwen2.5-1.5B-Instruct", CARDS["rtx3080-laptop-16gb"], **shape_kw)
    assert 60_000 < h100 < 72_000  # issue 43: "about 66,000 tokens a second on an H100"
    assert 8_000 < laptop < 9_600  # "about 8,800 on an RTX 3080 Laptop GPU"
    # by hand: 28 layers x 2 KV heads x 128 x 2 (K and V) x 2 bytes
    from labkit.memory import model_shape

    assert kv_bytes_per_token(model_shape("Qwen/Qwen2.5-1.5B-Instruct")) == 28 * 2 * 128 * 2 * 2
    # at batch 4 the weights dominate: the limit is nearly 24x lower, the lesson of notebook 04
    assert card_limit("Qwen/Qwen2.5-1.5B-Instruct", CARDS["h100-80gb"], batch=4, prompt_tokens=256,
                      completion_tokens=786) < h100 / 15


def test_every_card_states_its_bandwidth_and_tensor_peak_and_where_they_come_from():
    for card in CARDS.values():
        assert card.bandwidth_gb_s > 0 and card.bandwidth_source, card.key
        assert card.tensor_tflops > 0 and card.tensor_source, card.key
    laptop = CARDS["rtx3080-laptop-16gb"]  # notebook 04b: "a ridge point of about 94 operations a byte"
    assert round(laptop.tensor_tflops * 1e12 / (laptop.bandwidth_gb_s * 1e9)) == 94


def test_the_dashboard_shows_the_generation_figures_once_logged():
    from labkit.dashboard import RunRecord
    from labkit.dashboard.live import text_line
    from labkit.dashboard.panels import tiles

    record = RunRecord("run", total_steps=2, device="cpu")
    record.add(1, {"reward": 0.5})
    assert not [t for t in tiles(record) if t[1].startswith("generation/")]  # a CPU run without the clock: no dashes
    record.add(2, {"reward": 0.6, "generation/tokens_per_second": 1143.2, "generation/ms_per_decode_step": 81.7,
                   "generation/bandwidth_share": 0.0174})
    shown = {label: text for label, _, text, _ in tiles(record)}
    assert shown["generation tok/s"] == "1,143" and shown["ms / decode step"] == "82"
    assert shown["of card's limit"] == "1.7%"
    assert "generation tok/s=1,143" in text_line(record)


def test_a_setting_the_path_would_drop_is_refused_when_build_run_is_given_it(monkeypatch, tmp_path):
    import labkit.run

    monkeypatch.setattr(labkit.run, "build_trainer", lambda *a, **k: pytest.fail("a trainer was built"))
    preset = get_preset("cpu-tiny").replace(generation="continuous")
    with pytest.raises(PresetError, match="drops min_new_tokens"):
        labkit.run.build_run(preset, tmp_path, generation_kwargs={"min_new_tokens": 8})


def test_continuous_batching_samples_with_a_new_seed_at_every_generation():
    # transformers' continuous batching seeds its sampler from its config at every generate_batch; with the recipe's
    # seed alone every step drew the same random numbers, and the CPU recipe learned 40.6 % instead of 68.8 %
    # (results/generation_paths.json, learning_fixed_seed)
    from types import SimpleNamespace

    seen = []
    trainer = _Trainer(lambda prompts, *a, **k: (seen.append(trainer.continuous_batching_config.seed), ([[1]], None))[1])
    trainer.continuous_batching_config = SimpleNamespace(seed=7)
    GenerationClock(trainer, "continuous")
    for _ in range(3):
        trainer._generate_single_turn([[1]], None, {}, 1)
    assert seen == [7, 8, 9]


def test_the_saved_dashboard_puts_the_generation_figures_on_a_line_of_their_own():
    from labkit.dashboard import RunRecord
    from labkit.dashboard.picture import draw_figure

    record = RunRecord("run", total_steps=2, device="cpu")
    record.add(1, {"reward": 0.5, "loss": 0.01})
    assert len(draw_figure(record)[0]._suptitle.get_text().splitlines()) == 2
    record.add(2, {"reward": 0.6, "loss": 0.02, "generation/tokens_per_second": 73.0,
                   "generation/ms_per_decode_step": 437.0})
    title = draw_figure(record)[0]._suptitle.get_text().splitlines()
    assert title[2] == "generation: tok/s 73 · ms / decode step 437" and "generation" not in title[1]


# --------------------------------------------------------------------------- continuous batching on a 16 GB card

GIB = 2**30


def _paged_cache(cb_kwargs: dict, *, total_gib: float, used_gib: float):
    """transformers' own PagedAttentionCache for laptop-16gb's model and generation batch, built on the meta device
    (no memory) while transformers reads a card of ``total_gib`` with ``used_gib`` in use: its sizing and its check."""
    from unittest import mock

    from transformers.generation import ContinuousBatchingConfig
    from transformers.generation.continuous_batching import cache as cb
    from transformers.generation.continuous_batching.distributed import DistributedHelper
    from transformers.generation.continuous_batching.initialization import resolve_continuous_batching_config
    from transformers.generation.continuous_batching.utils import WorkloadHints

    from labkit.memory import model_config

    p = get_preset("laptop-16gb")
    config = model_config(p.model)[1]
    hints = WorkloadHints(max_prompt_length=p.max_prompt_length, max_generated_length=p.config["max_completion_length"],
                          num_requests=p.generation_batch_size)
    resolved = resolve_continuous_batching_config(config, ContinuousBatchingConfig(**cb_kwargs), hints, True,
                                                  torch.device("cuda"))
    card = lambda: (torch.device("meta"), int(total_gib * GIB), 0, int(used_gib * GIB))  # noqa: E731
    with mock.patch.object(cb, "get_device_and_memory_breakdown", card):
        return cb.PagedAttentionCache(config, resolved, "meta", DistributedHelper(None, None), dtype=torch.bfloat16,
                                      model_supports_logits_to_keep=True)


def test_continuous_batching_fits_a_16gb_card_by_transformers_own_check():
    from labkit.oom import estimate
    from labkit.presets import resolve_plan
    from labkit.device import SIZING_CONTEXT_GIB
    from labkit.generation import continuous_footprint

    p = get_preset("laptop-16gb").replace(generation="continuous")
    est = estimate(resolve_plan(p, CUDA))
    used = (est.bytes["generation_phase"] - est.bytes["kv_cache"]) / GIB + SIZING_CONTEXT_GIB  # the 1.5B loaded
    config = generation_arguments(p)["transformers_continuous_batching_config"]
    trl = dict(config)  # what TRL builds from it (trl/trainer/grpo_trainer.py 802-806)
    trl.setdefault("max_memory_percent", 0.5)
    cache = _paged_cache(trl, total_gib=15.7, used_gib=used)  # raises MemoryError when it does not fit
    # and within TRL's own default of half the free memory too
    _paged_cache(dict(trl, max_memory_percent=0.5), total_gib=15.7, used_gib=used)
    # labkit's estimate is transformers' footprint: the cache (less its two spare sectors) and the SDPA mask
    footprint = continuous_footprint(p.model, p.generation_batch_size, p.max_prompt_length, p.config["max_completion_length"])
    assert footprint["cache"] == cache.cache_tensor.numel() - 2 * cache.bytes_per_sector
    assert footprint["attention_mask"] == 2 * cache.max_batch_tokens * (cache.max_tokens_read + cache.max_batch_tokens)
    assert est.bytes["kv_cache"] == footprint["total"]
    from labkit.oom import preflight

    report = preflight(p, card_gib=CARDS["rtx3080-laptop-16gb"].gib)  # generation 7.1 GiB, training 10.2
    assert report.fits and report.breakdown["kv_cache"] == pytest.approx(footprint["total"] / GIB)
    assert round(footprint["total"] / GIB, 2) == 4.17  # cache 3.28, reads 0.76, mask 0.06
    # without a max_batch_tokens (the old config), transformers' default 8,192 makes a 2 GiB mask: MemoryError
    with pytest.raises(MemoryError):
        _paged_cache(dict(page_size=256, num_blocks=480, max_memory_percent=0.5), total_gib=15.7, used_gib=used)


def test_under_a_per_process_cap_transformers_checks_the_cache_against_the_cap(monkeypatch):
    from types import SimpleNamespace

    from transformers.generation import ContinuousBatchingConfig
    from transformers.generation.continuous_batching import cache as cb

    in_use = 4 * GIB  # the weights and optimizer of laptop-16gb, about, on a 140 GiB card capped at 6 GiB
    cap = {"fraction": 6 / 140}
    for name, value in dict(is_available=lambda: True, is_initialized=lambda: True, empty_cache=lambda: None,
                            synchronize=lambda *a: None, memory_reserved=lambda *a: in_use,
                            mem_get_info=lambda *a: (140 * GIB - in_use, 140 * GIB),
                            get_per_process_memory_fraction=lambda *a: cap["fraction"]).items():
        monkeypatch.setattr(torch.cuda, name, value)
    seen = []

    def generate(prompts, *a, **k):  # what transformers reads as available when it builds its cache
        seen.append(cb.PagedAttentionMemoryHandler.get_available_memory(SimpleNamespace(cb_config=config)))
        return [[1]], None

    config = ContinuousBatchingConfig(**generation_arguments(get_preset("laptop-16gb").replace(
        generation="continuous"))["transformers_continuous_batching_config"])
    trainer = _Trainer(generate)
    trainer.continuous_batching_config = config
    GenerationClock(trainer, "continuous")
    trainer._generate_single_turn([[1]], None, {}, 1)
    assert seen[-1] == pytest.approx(2 * GIB, rel=1e-6)  # the cap's 6 GiB less the 4 in use, not the card's 136
    with pytest.raises(MemoryError):  # so laptop-16gb's 4.2 GiB cache is refused under a 6 GiB cap
        _paged_cache(dict(vars(config)), total_gib=140, used_gib=140 - seen[-1] / GIB)
    cap["fraction"] = 1.0  # no cap: the card's free memory
    trainer._generate_single_turn([[1]], None, {}, 1)
    assert seen[-1] == 136 * GIB


def test_qlora_generates_with_continuous_batching_after_trls_cast():
    # TRL casts the PeftModel (PeftModel.to is nn.Module.to, not transformers' guarded PreTrainedModel.to): the
    # 4-bit weights stay uint8, and continuous batching writes the tokens generate writes
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from transformers.generation import ContinuousBatchingConfig, GenerationConfig

    from labkit.models import resolve_model

    nf4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny:qwen2"), quantization_config=nf4,
                                                dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cannot cast a bitsandbytes model"):
        base.to(torch.bfloat16)  # transformers' guard, which TRL's cast does not meet
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model.to(torch.bfloat16)  # grpo_trainer.py 1796-1797
    assert base.model.layers[0].self_attn.q_proj.base_layer.weight.dtype == torch.uint8
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    config = GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    outputs = model.generate_batch(prompts, generation_config=config, progress_bar=False,
                                   continuous_batching_config=ContinuousBatchingConfig(
                                       page_size=64, num_blocks=4, max_batch_tokens=64, max_memory_percent=1.0))
    for prompt, output in zip(prompts, outputs.values()):
        expected = model.generate(input_ids=torch.tensor([prompt]), generation_config=config)[0, len(prompt):]
        assert output.generated_tokens == expected.tolist()
    assert validate(get_preset("qlora-3b").replace(generation="continuous"), CUDA) == \
        validate(get_preset("qlora-3b"), CUDA)  # no longer refused


# --------------------------------------------------------------------------- generation leaves the model as it was


def test_the_continuous_cast_leaves_the_gradients_of_an_accumulation_as_they_were():
    def casting_generate(prompts, *a, **k):  # TRL's cast: nn.Module.to converts .grad too
        trainer.model.to(torch.bfloat16)
        return [[1, 2]], None

    trainer = _Trainer(casting_generate)
    for param in trainer.model.parameters():  # gradients of the accumulation's earlier micro-batches
        param.grad = torch.randn_like(param) * 1e-3
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
    GenerationClock(trainer, "continuous")
    trainer._generate_single_turn([[1]], None, {}, 1)
    assert {p.grad.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert all(torch.equal(p.grad, grads[n]) for n, p in trainer.model.named_parameters())


def _tiny_run(tmp_path, path: str = "generate"):
    from labkit.run import build_run

    preset = get_preset("cpu-tiny").replace(max_steps=1, save_strategy="no", generation=path, max_completion_length=8)
    return build_run(preset, tmp_path / path, print_logs=False, generation_kwargs={"do_sample": False})


def test_three_generations_leave_one_requires_grad_hook_on_the_embeddings(tmp_path):
    run = _tiny_run(tmp_path)  # LoRA (a PeftModel) with gradient checkpointing, as every GPU preset
    assert run.preset.config["activation_checkpointing"] and hasattr(run.trainer.model, "get_base_model")
    # what Trainer.train does first (transformers/trainer.py 1503-1514)
    run.trainer.model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    assert run.trainer.model.is_gradient_checkpointing
    embedding = run.trainer.model.get_input_embeddings()
    before = len(embedding._forward_hooks)
    assert before >= 1  # the requires_grad_ hook, which checkpointing a PEFT model needs
    prompts = [[1, 2, 3, 4]] * 2
    for _ in range(3):  # TRL turns checkpointing off and on around each (trl/models/utils.py 136-154)
        run.trainer._generate_single_turn(prompts, None, {}, 1)
    assert len(embedding._forward_hooks) == before
    assert embedding(torch.tensor([[1, 2]])).requires_grad  # the hook still works


def test_static_compiled_pads_the_prompts_it_generates_from_not_the_loss(tmp_path):
    seen = {}
    lengths = {}
    for path in ("generate", "static-compiled"):
        run = _tiny_run(tmp_path, path)
        trainer = run.trainer
        inner = run.generation._inner

        def spy(prompt_ids, *a, **k):  # what TRL pads the prompts it passes to generate with
            seen[path] = trainer.pad_to_multiple_of
            return inner(prompt_ids, *a, **k)

        run.generation._inner = spy
        trainer.generation_config.disable_compile = True  # the padding is the subject here, not the compilation
        batch = [run.train_dataset[i] for i in range(trainer.args.generation_batch_size)]
        out = trainer._generate_and_score_completions(batch)
        lengths[path] = (out["prompt_ids"].shape, out["completion_ids"].shape)
    assert seen == {"generate": None, "static-compiled": run.preset.max_prompt_length}
    assert lengths["static-compiled"] == lengths["generate"]  # the loss's tensors: not padded to 256


def test_vllm_server_mode_is_a_recipe_choice_and_vllm_options_need_the_vllm_path():
    from labkit.presets import PresetError, card_device, get_preset, grpo_arguments
    from labkit.validation import validate

    server = get_preset("laptop-16gb", generation="vllm",
                        **{"vllm_mode": "server", "vllm_server_base_url": "http://localhost:8000"})
    fields = {k: v for k, v in grpo_arguments(server).items() if "vllm" in k}
    # server mode: vLLM runs on its own GPU, so colocate's sleep mode and share of the card are not set
    assert fields == {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": "http://localhost:8000"}
    colocate = {k: v for k, v in grpo_arguments(get_preset("laptop-16gb", generation="vllm")).items() if "vllm" in k}
    assert colocate["vllm_mode"] == "colocate" and 0.1 <= colocate["vllm_gpu_memory_utilization"] <= 0.9
    with pytest.raises(PresetError, match="vllm_mode acts only with generation='vllm'.*or drop it"):
        validate(get_preset("laptop-16gb", **{"vllm_mode": "server"}), card_device("laptop-16gb"))
    with pytest.raises(PresetError, match="vllm_mode, vllm_server_base_url act only with generation='vllm'.*drop them"):
        validate(get_preset("laptop-16gb", vllm_mode="server", vllm_server_base_url="http://localhost:8000"),
                 card_device("laptop-16gb"))
