"""A preset made concrete: GSM8K prompts, rewards, a ``GRPOTrainer``, checkpoints and resume.

Introduced in ``04_lora_grpo_16gb.ipynb``. :func:`build_run` assembles a run in one pass:
the preset resolved once for the device into its plan (:func:`labkit.presets.resolve_plan`: the model path and shape,
the precision, the settings) and checked (:func:`labkit.validation.checked_plan`); then everything reads the
plan: the policy (TRL loads it from its path; QLoRA with PEFT's upcast goes through
:func:`labkit.models.load_policy`) -> the prompts (:func:`training_prompts`) -> the rewards ->
``GRPOConfig`` (:func:`labkit.training.grpo_config`) -> ``GRPOTrainer``.

Prompt length. TRL 1.16's ``GRPOConfig`` has no ``max_prompt_length``: ``GRPOTrainer`` tokenises
the whole chat-templated prompt and never truncates it. Cutting a maths question would drop the
question, so :func:`training_prompts` *filters* instead and reports how many prompts it dropped.

Resume. A run writes its preset to ``OUTPUT_DIR/labkit_preset.json`` and into every checkpoint.
:func:`resume_checkpoint` finds the last checkpoint and refuses to continue it with a different
recipe (:class:`ResumeMismatchError` names every difference); the seed is part of the recipe. A
checkpoint that is cut short or malformed is skipped, with a message, for the newest intact one.
A run whose last checkpoint reached ``max_steps`` is finished: training it again changes nothing
(:func:`finished_run`). While a run trains, ``OUTPUT_DIR/labkit.lock`` holds its process id, so a
second process started into the same folder is refused (:class:`RunLock`).

:meth:`Run.explain_oom` shows the report of the OOM doctor (:mod:`labkit.oom`) that :meth:`Run.train` wraps
the trainer in.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from transformers import TrainerCallback

from labkit.device import detect_device
from labkit.generation import dropped_settings_problem, prepare_generation
from labkit.models import load_tokenizer, match_adapter_dtype, quantization_config, write_whole
from labkit.oom import explain_oom
from labkit.presets import Plan, Preset, PresetError, get_preset
from labkit.rewards import named_rewards
from labkit.training import build_trainer, checkpoint_problem, checkpoint_step, grpo_config, last_checkpoint
from labkit.validation import SECRET_FIELDS, checked_plan, process_count

__all__ = ["Run", "build_run", "training_prompts", "reward_functions", "resume_checkpoint", "save_preset",
           "load_saved_preset", "task_dataset", "eval_prompts", "ResumeMismatchError", "RESUMABLE_CHANGES", "PRESET_FILE", "is_main_process",
           "finished_run", "RunLock", "RunLockedError", "LOCK_FILE", "merge_adapters", "question_prompt"]


PRESET_FILE = "labkit_preset.json"
LOCK_FILE = "labkit.lock"


# Fields and GRPOConfig arguments a resumed run may change: they do not change what the run computes.
RESUMABLE_CHANGES = ("description", "save_strategy", "save_steps", "save_total_limit", "activation_checkpointing",
                     "activation_checkpointing_kwargs", "eval_batch_size", "card", "card_gib")


def training_prompts(preset: Preset, tokenizer, *, split: str = "train", limit: int | None = None,
                     seed: int | None = None):
    """Return ``(dataset, dropped)``: the preset's task's prompts (GSM8K, or :class:`labkit.tasks.WordProblems`)
    of at most ``max_prompt_length`` tokens, and how many were dropped.

    The length is the chat-templated prompt's, with the generation prompt, i.e. exactly what
    ``GRPOTrainer`` feeds the model. TRL 1.16 has no ``max_prompt_length``; filtering
    (rather than cutting the question short) keeps every prompt intact. A tool recipe (``preset.environment``)
    asks each question with the tool prompt (:func:`labkit.environments.tool_prompt`), and its length counts
    the tool schema the template renders into the prompt.
    """
    limit = limit if limit is not None else preset.train_limit
    dataset = task_dataset(preset.task, split, seed=preset.config["seed"] if seed is None else seed)
    tools = None
    if preset.environment:
        from labkit.environments import ENVIRONMENTS, environment_tools, tool_prompt

        tools = environment_tools(ENVIRONMENTS[preset.environment]())
        # a list, not dataset.map: map draws a progress widget that a saved notebook cannot show again
        prompts = [tool_prompt(prompt[-1]["content"]) for prompt in dataset["prompt"]]
        dataset = dataset.remove_columns("prompt").add_column("prompt", prompts)

    def measure(rows):  # a plain-text prompt (your dataset's may be) goes to the model as it is, untemplated
        return [len(tokenizer(p)["input_ids"]) if isinstance(p, str) else
                len(tokenizer.apply_chat_template(p, tools=tools, add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"]) for p in rows["prompt"]]

    # Measure only what may be kept: with a limit, a window a few times larger is plenty.
    window = dataset if limit is None else dataset.select(range(min(len(dataset), 4 * limit + 64)))
    lengths = measure(window)
    if limit is not None and len(window) < len(dataset) and sum(n <= preset.max_prompt_length for n in lengths) < limit:
        window = dataset
        lengths = measure(window)
    keep = [i for i, n in enumerate(lengths) if n <= preset.max_prompt_length][:limit]
    if not keep:
        raise PresetError(f"every prompt is longer than max_prompt_length={preset.max_prompt_length} tokens; raise it.")
    # dropped: the prompts passed over before the last one kept (all of them when the limit is not reached)
    dropped = (keep[-1] + 1 if len(keep) == limit else len(lengths)) - len(keep)
    kept = window.select(keep).add_column("prompt_length", [lengths[i] for i in keep])
    return kept, dropped


def task_dataset(task: str, split: str = "train", *, seed: int | None = None, limit: int | None = None):
    """Return the prompts of ``task`` (``"gsm8k"``, ``"word-problems"`` or ``"word-problems-large"``) and ``split``
    with their gold ``answer``.

    GSM8K's train split is shuffled with ``seed`` (its test split keeps its order); the word
    problems' train split is drawn with ``seed`` (1,000 of them), their held-out ``"test"`` split
    is a fixed pool of 200 that training never sees; ``"word-problems-large"`` are the same problems with
    :data:`labkit.tasks.NUMBER_RANGES` ``["large"]`` (notebook 08: the arithmetic a calculator is for).
    """
    if not isinstance(task, str):  # your own dataset (notebook 02): its rows are the training prompts
        if split != "train":
            raise PresetError("your dataset is the recipe's training prompts; it has no held-out split. Evaluate "
                              "on prompts of your own, kept out of it.")
        return task if limit is None else task.select(range(min(limit, len(task))))  # TRL's sampler shuffles
    if task == "gsm8k":
        from labkit.data import load_gsm8k

        return load_gsm8k(split, limit=limit, seed=seed)
    from labkit.tasks import HELD_OUT_POOL, WORD_PROBLEM_TASKS, WordProblems

    if task in WORD_PROBLEM_TASKS:
        n = limit or (HELD_OUT_POOL if split == "test" else 1000)
        return WordProblems(numbers=WORD_PROBLEM_TASKS[task]).dataset(n, seed=seed or 0, split=split)
    raise ValueError(f"task must be 'gsm8k', 'word-problems' or 'word-problems-large', not {task!r}")


def eval_prompts(preset: Preset, limit: int | None = None):
    """Return the held-out prompts to evaluate a preset's run on: its task's test split (the first ``limit``)."""
    return task_dataset(preset.task, "test", limit=limit)


def question_prompt(question, like: list[dict], tokenizer, max_tokens: int) -> list[dict]:
    """Return the chat messages that ask ``question`` as the prompt ``like`` asks its own (notebook 04, section 9).

    ``like`` is one of the run's conversational prompts: its messages before the last (the task's system prompt)
    are kept and ``question`` replaces the last. A question that is not text, is empty, or with the chat
    template is longer than ``max_tokens`` (the preset's ``max_prompt_length``: the run never trained on a
    longer prompt) raises ``ValueError`` whose message is one line saying what to change.
    """
    if not isinstance(question, str) or not question.strip():
        shown = "empty" if isinstance(question, str) or question is None else f"not text ({type(question).__name__})"
        raise ValueError(f"the question is {shown}: write one in words, e.g. \"Tom has 4 boxes with 5 pens in each "
                         "box. How many pens does Tom have?\"")
    messages = [*like[:-1], {"role": "user", "content": " ".join(question.split())}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    tokens = len(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)  # transformers 5: a BatchEncoding
    if tokens > max_tokens:
        raise ValueError(f"the question makes a prompt of {tokens} tokens, and this run trained on prompts of at most "
                         f"{max_tokens} (max_prompt_length): shorten it by about {tokens - max_tokens} tokens")
    return messages


def reward_functions(preset: Preset) -> tuple[list, list[float]]:
    """Return ``(reward_funcs, reward_weights)`` for ``GRPOTrainer`` / ``GRPOConfig`` from the preset's names."""
    return named_rewards(preset.rewards, preset.reward_weights)


def save_preset(preset: Preset, folder: str | os.PathLike) -> Path:
    """Write ``preset`` (plus labkit's version) to ``folder/labkit_preset.json`` and return the path.

    Written whole or not at all (a temporary file, then renamed): a run killed while it copies its recipe into a
    checkpoint leaves that checkpoint without the file, resumable with the run's own copy, never with half a file."""
    from labkit import __version__

    recipe = preset.to_dict()
    # validate() refuses secrets; a preset built around it must still never write one.
    recipe["config"] = {k: v for k, v in recipe["config"].items() if k not in SECRET_FIELDS}
    text = json.dumps({"labkit": __version__, "preset": recipe}, indent=2) + "\n"
    return write_whole(Path(folder) / PRESET_FILE, text)


def load_saved_preset(folder: str | os.PathLike) -> Preset | None:
    """Return the preset saved in ``folder`` (a run or a checkpoint), or None when there is none.

    A file that is not a saved recipe (cut short, edited by hand) raises :class:`ResumeMismatchError`
    naming the file.
    """
    path = Path(folder) / PRESET_FILE
    if not path.exists():
        return None
    try:
        return Preset.from_dict(json.loads(path.read_text())["preset"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ResumeMismatchError(f"{path} is not a readable recipe ({type(exc).__name__}: {exc}). Restore it, "
                                  "or start a new output_dir.") from None


def resume_checkpoint(output_dir: str | os.PathLike, preset: Preset, resume: bool | str = "auto") -> Path | None:
    """Return the checkpoint to resume from (None: start at step 0), after checking the recipe matches.

    ``resume="auto"`` resumes when there is a checkpoint; ``True`` requires one; ``False``
    refuses a folder that already holds checkpoints (stale ones would be resumed later by
    mistake); a path resumes that checkpoint. The saved preset (the checkpoint's copy, else
    the run's) must equal ``preset`` except for :data:`RESUMABLE_CHANGES`; otherwise
    :class:`ResumeMismatchError` lists every difference.
    """
    output_dir = Path(output_dir)
    if isinstance(resume, (str, os.PathLike)) and str(resume) != "auto":
        checkpoint = Path(resume)
        if not (checkpoint / "trainer_state.json").exists():
            raise FileNotFoundError(f"{checkpoint} is not a checkpoint (no trainer_state.json)")
        problem = checkpoint_problem(checkpoint)
        if problem:
            raise ResumeMismatchError(f"cannot resume from {checkpoint}: {problem}")
    else:
        skipped = []
        checkpoint = last_checkpoint(output_dir, skipped=skipped)
        for path, problem in skipped:
            _report_once(f"skipping {path}: {problem}; "
                         + (f"resuming from {checkpoint.name}, the newest intact checkpoint" if checkpoint
                            else "no intact checkpoint is left, so the run starts at step 0"))
        if resume is False and checkpoint is not None:
            raise ResumeMismatchError(
                f"{output_dir} already holds checkpoints ({checkpoint.name}) from an earlier run. Resume it "
                "(resume='auto'), or choose a new output_dir, or delete the old checkpoints."
            )
        if resume is True and checkpoint is None:
            raise FileNotFoundError(f"resume=True but {output_dir} has no checkpoint to resume from")
        if resume is False or checkpoint is None:
            return None
    saved = load_saved_preset(checkpoint) or load_saved_preset(output_dir)
    if saved is None:
        raise ResumeMismatchError(
            f"{checkpoint} has no {PRESET_FILE}, so its recipe cannot be checked. Resume it with "
            "trainer.train(resume_from_checkpoint=...) yourself, or start a new output_dir."
        )
    now, before = _compared(preset), _compared(saved)
    differences = [f"{k}: checkpoint {before.get(k)!r}, now {now.get(k)!r}"
                   for k in dict.fromkeys([*now, *before]) if k not in RESUMABLE_CHANGES and now.get(k) != before.get(k)]
    if differences:
        lines = "\n".join(f"- {d}" for d in differences)
        raise ResumeMismatchError(
            f"{checkpoint} was trained with a different recipe than the one asked to continue it:\n{lines}\n"
            f"Continue with the saved recipe (labkit.run.load_saved_preset({str(checkpoint)!r})), or start a "
            "new output_dir for the new recipe. Only these may change on resume: " + ", ".join(RESUMABLE_CHANGES)
        )
    return checkpoint


def _compared(preset: Preset) -> dict:
    """The recipe a resume compares: the preset's fields and its GRPOConfig arguments side by side, secrets hidden."""
    recipe = preset.to_dict()
    config = recipe.pop("config")
    return {**recipe, **{k: ("<secret>" if k in SECRET_FIELDS else v) for k, v in config.items()}}


_REPORTED: set[str] = set()


def _report_once(message: str) -> None:
    """Print a warning to stderr once per process (resume_checkpoint runs twice on the way to training)."""
    import sys

    if message not in _REPORTED and is_main_process():
        _REPORTED.add(message)
        print(f"warning: {message}", file=sys.stderr)


def finished_run(output_dir: str | os.PathLike, preset: Preset) -> str | None:
    """Return why the run in ``output_dir`` is already finished (a message), or None when there is work left.

    Finished: its newest intact checkpoint reached ``max_steps`` (TRL saves one at the last step), or,
    for a run without checkpoints, ``final/`` holds its result. Training it again would train past
    ``max_steps`` and overwrite ``final/``.
    """
    output_dir = Path(output_dir)
    checkpoint = last_checkpoint(output_dir)
    final = output_dir / "final"
    if checkpoint is not None:
        if (checkpoint_step(checkpoint) or 0) >= preset.config["max_steps"]:
            return (f"the run in {output_dir} is finished: {checkpoint.name} reached max_steps={preset.config['max_steps']}"
                    + (f" and {final} holds the result" if final.exists() else "")
                    + ". Nothing to do; to train on, start a new --output-dir.")
        return None
    if (final / PRESET_FILE).exists():
        return (f"the run in {output_dir} is finished: {final} holds its result. Nothing to do; to train again, "
                "start a new --output-dir.")
    return None


class RunLockedError(RuntimeError):
    """Another live process is training into the same output folder."""


class RunLock:
    """A context manager that holds ``OUTPUT_DIR/labkit.lock`` (the process id) while a run writes there.

    Two processes training into one folder would both write ``checkpoint-2``, ``checkpoint-4``, ...
    The lock file is created atomically; a second process is refused with :class:`RunLockedError`
    while the first is alive. A lock left by a dead process (killed, machine rebooted) is taken over
    with a message. Re-entrant within one process; only the main process of a multi-process run locks.
    """

    def __init__(self, output_dir: str | os.PathLike):
        self.path = Path(output_dir) / LOCK_FILE
        self.owned = False

    def __enter__(self) -> "RunLock":
        if not is_main_process():
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                with open(self.path, "x") as handle:  # "x": created atomically, refused when it exists
                    handle.write(f"{os.getpid()}\n")
            except FileExistsError:
                pid = _lock_pid(self.path)
                if pid == os.getpid():
                    return self  # this process holds it already (train_cli around Run.train)
                if pid is not None and _alive(pid):
                    raise RunLockedError(
                        f"{self.path.parent} is in use by another training process (pid {pid}, {self.path}). "
                        "Wait for it to finish, or train into another --output-dir.") from None
                _report_once(f"taking over {self.path}: the process that held it "
                             f"({'pid ' + str(pid) if pid else 'unknown'}) is gone")
                self.path.unlink(missing_ok=True)
                continue
            self.owned = True
            return self
        raise RunLockedError(f"could not take the lock {self.path}; remove it if no run is training there")

    def __exit__(self, *exc) -> None:
        if self.owned:
            self.path.unlink(missing_ok=True)
            self.owned = False


def _lock_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


class SavePresetCallback(TrainerCallback):
    """Copies the run's preset into every checkpoint, so a checkpoint says how it was made."""

    def __init__(self, preset: Preset):
        self.preset = preset

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            save_preset(self.preset, Path(args.output_dir) / f"checkpoint-{state.global_step}")


@dataclass
class Run:
    """A preset made concrete: the trainer, its data, and where its checkpoints go."""

    preset: Preset
    trainer: object  # trl.GRPOTrainer
    tokenizer: object
    train_dataset: object
    dropped_prompts: int
    output_dir: Path
    warnings: list = field(default_factory=list)
    generation: object = None  # labkit.generation.GenerationClock: every generation's seconds and tokens

    @property
    def model(self):
        return self.trainer.model

    def train(self, resume: bool | str = "auto"):
        """Return TRL's ``TrainOutput`` after training, resumed from the last checkpoint when there is one.

        An out-of-memory error becomes :class:`labkit.oom.TrainingOutOfMemory`, whose message
        is the OOM doctor's short report; the checkpoints already written are kept.
        """
        from transformers.trainer_utils import TrainOutput

        from labkit.training import train_with_oom_doctor

        with RunLock(self.output_dir):
            checkpoint = resume_checkpoint(self.output_dir, self.preset, resume)
            if checkpoint is not None and (checkpoint_step(checkpoint) or 0) >= self.preset.config["max_steps"]:
                # Resuming a finished run would train one step past max_steps: report it and change nothing.
                if is_main_process():
                    print(finished_run(self.output_dir, self.preset))
                return TrainOutput(checkpoint_step(checkpoint), float("nan"), {})
            if self.trainer.args.should_save:
                save_preset(self.preset, self.output_dir)
            if checkpoint is not None and is_main_process():
                print(f"resuming from {checkpoint} (step {checkpoint.name.removeprefix('checkpoint-')})")
            return train_with_oom_doctor(self.trainer, resume_from_checkpoint=str(checkpoint) if checkpoint else None,
                                         settings=self.preset.to_dict())

    def explain_oom(self, error: BaseException, phase: str = "unknown"):
        """Return the OOM doctor's report (:func:`labkit.oom.explain_oom`) had ``error`` struck ``phase`` of this run's
        latest step (``trainer.state.global_step``): for its recipe, with its last checkpoint, as :meth:`train` reports."""
        state = self.trainer.state
        return explain_oom(error, phase=phase, step=state.global_step, max_steps=state.max_steps,
                           settings=self.preset.to_dict(), checkpoint=last_checkpoint(self.output_dir),
                           output_dir=self.output_dir)

    def save(self, folder: str | os.PathLike | None = None) -> Path:
        """Save the trained adapter (or model) and the tokenizer to ``folder`` (``OUTPUT_DIR/final``)."""
        import shutil

        folder = Path(folder or self.output_dir / "final")
        # Written beside the folder and renamed into place: a run killed while saving leaves the old folder or the
        # new one, never half of one (finished_run trusts final/ when it holds the recipe).
        partial = folder.with_name(folder.name + ".partial")
        with RunLock(self.output_dir):
            if partial.exists() and self.trainer.args.should_save:  # one process clears it (save_model is collective)
                shutil.rmtree(partial)
            self.trainer.save_model(str(partial))
            if self.trainer.args.should_save:
                self.tokenizer.save_pretrained(str(partial))
                save_preset(self.preset, partial)
                # into place as write_whole does: the old final/ steps aside first, so a kill never leaves neither
                write_whole(folder, lambda tmp: os.replace(partial, tmp))
        return folder


def merge_adapters(adapter_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None, *,
                   precision: str | None = None) -> Path:
    """Return the folder of a plain transformers model: a saved run's base with its LoRA adapter merged in.

    ``adapter_dir`` is what :meth:`Run.save` wrote (the adapter, the tokenizer, the recipe). The base named in
    its ``adapter_config.json`` is loaded in ``precision``'s dtype (default: this machine's; fp32 on a CPU),
    the adapter applied with PEFT and folded into the weights, ``W + (alpha / r) B A`` (``merge_and_unload``),
    and the result saved with the tokenizer to ``out_dir`` (default: ``merged`` beside ``adapter_dir``):
    ``AutoModelForCausalLM.from_pretrained(out_dir)`` loads it with no PEFT and no labkit. A QLoRA run's base
    is loaded in 4 bits, as it trained, and dequantised first (``model.dequantize()``): the adapter is added to
    the very weights it learned against, and the merged model is 16-bit (adding it to 4-bit codes would round
    the update away). Raises ``FileNotFoundError`` for a folder without an adapter.
    """
    import torch
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM

    from labkit.device import choose_precision, torch_dtype

    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").exists():
        raise FileNotFoundError(f"{adapter_dir} holds no LoRA adapter (adapter_config.json): pass the folder "
                                "run.save() returned, e.g. OUTPUT_DIR / 'final'")
    out_dir = Path(out_dir or adapter_dir.parent / "merged")
    base = PeftConfig.from_pretrained(str(adapter_dir)).base_model_name_or_path
    preset = load_saved_preset(adapter_dir)
    info = detect_device()
    device, precision = info.kind, precision or choose_precision(info)
    dtype = torch_dtype(precision, "lora")
    if preset is not None and preset.method == "qlora":
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype, quantization_config=quantization_config(precision),
                                                     device_map={"": 0 if device == "cuda" else device})
        model = model.dequantize(dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    with torch.no_grad():
        merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    merged = merged.to(dtype)  # PEFT's fp32 adapters do not change the base's dtype, but say so
    merged.save_pretrained(str(out_dir))
    load_tokenizer(adapter_dir).save_pretrained(str(out_dir))
    return out_dir


def is_main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


def build_run(preset, output_dir: str | os.PathLike, *, device=None, model=None, tokenizer=None,
              train_dataset=None, callbacks=None, seed: int | None = None, num_processes: int | None = None,
              print_logs: bool = True, environment_factory=None, **config_overrides) -> Run:
    """Return a :class:`Run`: the preset validated, its prompts filtered, a ``GRPOTrainer`` built.

    ``preset`` is a name, a :class:`Preset` or a :class:`labkit.presets.Plan`; it is resolved once, for
    ``device``, into the plan (:func:`labkit.presets.resolve_plan`) whose precision, model path, dtypes
    and LoRA config the run uses.

    ``model`` (with ``tokenizer``) is a policy you already loaded (for example with
    :func:`labkit.models.load_policy`, to evaluate it first); without one, the run hands the model's
    path to TRL, which loads it (the right way under ``accelerate launch``, where each process or shard
    loads its part): QLoRA with the plan's ``quantization_config``, as notebook 04's plain-TRL cell does.
    Only a QLoRA preset with ``prepare_model_for_kbit_training`` loads through
    :func:`labkit.models.load_policy` (PEFT's fp32 upcast runs before the adapters). ``config_overrides`` go to ``GRPOConfig``
    (``logging_steps=5``, ``disable_tqdm=True``, ``generation_kwargs=...``).
    ``print_logs=False`` drops transformers' printing of every log line and its progress bar and
    "Step | Training Loss" table (``disable_tqdm=True``; a :class:`labkit.dashboard.LiveDashboard` shows both).
    A tool recipe (``preset.environment``, notebook 08) hands TRL the named environment class
    (:data:`labkit.environments.ENVIRONMENTS`); ``environment_factory`` replaces that class with your own
    (the learner's checked ``CalculatorEnv``), and is refused for a recipe without an environment.
    """
    plan = preset if isinstance(preset, Plan) else None
    preset = plan.preset if plan else get_preset(preset)
    if seed is not None and seed != preset.config["seed"]:  # the seed is part of the recipe (saved, checked on resume)
        preset, plan = preset.replace(seed=seed), None
    secrets = sorted(set(config_overrides) & set(SECRET_FIELDS))
    if secrets:  # GRPOConfig is saved as training_args.bin in every checkpoint
        raise PresetError(f"build_run may not be given {secrets}: a checkpoint saves GRPOConfig, and a secret must "
                          f"never be saved. Set the {SECRET_FIELDS[secrets[0]]} environment variable instead.")
    device = device or (plan.card if plan and plan.card else detect_device())
    # resolved once and checked (labkit.validation.checked_plan): everything below reads the plan
    plan, warnings = checked_plan(plan or preset, device, num_processes=num_processes)
    if environment_factory is not None and not preset.environment:
        raise PresetError(f"environment_factory was given, but the recipe {preset.name!r} has no tool environment: "
                          "use a tool recipe (tools-16gb) or --set environment=calculator max_tool_calling_iterations=3.")
    preset, output_dir = plan.preset, Path(output_dir)

    settings = dict(plan.config)  # the preset's GRPOConfig arguments (labkit.presets.grpo_arguments)
    reward_funcs, settings["reward_weights"] = reward_functions(preset)
    if not print_logs:  # else trainer.py adds its own bar (NotebookProgressCallback in a notebook): a second clock
        settings["disable_tqdm"] = True
    settings.update(config_overrides)
    # validate saw the preset's config only; what the caller adds here must pass the same check
    dropped = dropped_settings_problem(preset.generation, settings.get("generation_kwargs"),
                                       settings.get("repetition_penalty", 1.0))
    if dropped:
        raise PresetError(dropped)
    peft_config = quantization = None
    if model is None and not preset.prepare_model_for_kbit_training:
        # TRL loads the model from its path (per process under accelerate) with the plan's model_init_kwargs; with
        # the plan's peft_config and gradient checkpointing it calls enable_input_require_grads() itself. QLoRA too:
        # TRL quantises the Linear weights with the plan's quantization_config (placing it: "auto" on one GPU, each
        # process's own device under accelerate), keeps every other weight in that dtype and casts the adapters to
        # bf16 (trl/trainer/grpo_trainer.py 336-348, 529-541): notebook 04's plain-TRL cell, the same model. The
        # plan's dtype sits under what the caller's model_init_kwargs add (bench gpu).
        settings["model_init_kwargs"] = {**plan.model_init_kwargs, **(config_overrides.get("model_init_kwargs") or {})}
        if process_count(num_processes) > 1:  # each process loads a whole copy (DDP) or its shard (FSDP, ZeRO-3)
            settings["model_init_kwargs"]["device_map"] = None
        tokenizer = tokenizer or load_tokenizer(plan.model_path)
        model, peft_config, quantization = plan.model_path, plan.peft_config, plan.quantization_config
    args = grpo_config(output_dir, device=device, plan=plan, **settings)
    if model is None:  # QLoRA with prepare_model_for_kbit_training: labkit's loader runs PEFT's upcast first
        model, tokenizer = plan.load_policy()
    elif not isinstance(model, str):
        if tokenizer is None:
            raise ValueError("pass the tokenizer together with a loaded model")
        if preset.config["activation_checkpointing"] and hasattr(model, "peft_config"):
            # The classic LoRA pitfall: with checkpointing and a frozen embedding, nothing entering a
            # checkpointed block requires grad and the adapters get no gradient at all.
            model.enable_input_require_grads()
    environment = None
    if preset.environment:  # a tool recipe: a template that renders tools and parses calls back, and the env class
        from labkit.environments import ENVIRONMENTS, prepare_tool_tokenizer

        prepare_tool_tokenizer(tokenizer)
        environment = environment_factory or ENVIRONMENTS[preset.environment]
    dropped = 0
    if train_dataset is None:
        train_dataset, dropped = training_prompts(preset, tokenizer)
    callbacks = [*(callbacks or []), SavePresetCallback(preset)]
    trainer = build_trainer(model, reward_funcs, train_dataset, args, tokenizer=tokenizer,
                            peft_config=peft_config, callbacks=callbacks, quantization_config=quantization,
                            environment_factory=environment)
    # TRL makes a 4-bit model's adapters bf16; under fp16 (a T4) the grad scaler would fail at step 1.
    match_adapter_dtype(trainer.model, plan.precision)
    # the generation path finished, and timed (labkit.generation)
    try:
        shape = plan.shape
    except Exception:  # noqa: BLE001  a model neither the catalogue nor a saved config knows: the clock reads its own
        shape = None
    clock = prepare_generation(trainer, preset.generation, max_prompt_length=preset.max_prompt_length, shape=shape)
    if not print_logs:  # with disable_tqdm, transformers' trainer.py adds PrinterCallback (a dict per log) instead
        from transformers import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    return Run(preset, trainer, tokenizer, train_dataset, dropped, output_dir, warnings, clock)


class ResumeMismatchError(ValueError):
    """A checkpoint made with a different recipe than the one asked to continue it."""
