"""GRPO with a tool, as notebook 08 teaches it: tool rollouts and their metrics, the warm-up, the masks.

Introduced in ``08_grpo_with_tools.ipynb``. The environment itself (:func:`labkit.environments.safe_calculate`,
:class:`labkit.environments.CalculatorEnv`, its tokenizer and prompts) lives in :mod:`labkit.environments`, below the
recipe core, so that a preset can name it (``tools-16gb``).

- :func:`tool_rollouts` and :func:`tool_scores`: greedy (or sampled) multi-turn rollouts with the tool, as
  TRL runs them, and the held-out figures: replies that call the tool, well-formed calls, right answers.
- :func:`warm_up`: a few supervised steps on tool-use demonstrations (a small model never writes a tool call
  on its own, so GRPO would have nothing to reinforce).
"""
from __future__ import annotations

import itertools
import re

import torch

from labkit.environments import (ERROR_PREFIX, TOOL_SYSTEM_PROMPT, CalculatorEnv, environment_tools, safe_calculate,
                                 tool_prompt)

__all__ = ["demonstration", "warm_up", "tool_rollouts", "tool_scores", "loss_mask_view", "tool_round_tokens",
           "record_batches", "execute_tool_calls", "REASONING_TOKENS", "TOKENS_PER_ROUND", "tools_recipe",
           "size_tools_recipe", "tools_demo_table", "tools_demo_tests", "plot_tools_demo", "text_table", "message_text",
           "loss_mask_table"]


def _expression(question: str) -> str:
    a, b = re.findall(r"\d+", question)[:2]
    op = "*" if "bags with" in question else "-" if "gives away" in question else "+"
    return f"{a} {op} {b}"


def demonstration(question: str, answer: str, *, tool: bool = True) -> list[dict]:
    """Return a tool-use conversation for a word problem of :class:`labkit.tasks.WordProblems` (the warm-up's data).

    The assistant calls ``calculate`` with the problem's one operation, reads the result and states it:
    ``"Mia has 56 stickers."``. ``tool=False``: the same final sentence with no tool call (the warm-up of the
    run without the tool).
    """
    expression = _expression(question)
    result = safe_calculate(expression)
    subject, item = question.split(" ", 1)[0], re.search(r"How many (\w+)", question).group(1)
    if not tool:
        return [{"role": "assistant", "content": f"{subject} has {result} {item}."}]
    return [{"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "calculate", "arguments": {"expression": expression}}}]},
            {"role": "tool", "name": "calculate", "content": result},
            {"role": "assistant", "content": f"{subject} has {result} {item}."}]


def _assistant_spans(tokenizer, prompt: list[dict], turns: list[dict], tools) -> tuple[list[int], list[int]]:
    """Return (ids, labels mask) of prompt + turns: 1 on the assistant's own tokens, 0 on the prompt and tool turns."""
    ids = tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    mask = [0] * len(ids)
    history = list(prompt)
    for turn in turns:
        history.append(turn)
        full = tokenizer.apply_chat_template(history, tools=tools, tokenize=True, return_dict=False,
                                             add_generation_prompt=turn["role"] == "tool")
        new = full[len(ids):]
        ids, mask = full, mask + [1 if turn["role"] == "assistant" else 0] * len(new)
    return ids, mask


def warm_up(model, tokenizer, pairs, *, steps: int = 8, batch_size: int = 4, learning_rate: float = 1e-3,
            system_prompt: str = TOOL_SYSTEM_PROMPT, seed: int = 0, tool: bool = True) -> list[float]:
    """Return the loss per step of a short supervised warm-up on tool-use demonstrations (``model`` is trained).

    ``pairs`` are ``(question, answer)`` word problems; each becomes :func:`demonstration`'s conversation and
    the loss is the cross-entropy on the assistant's tokens only (the tool's reply is masked, as GRPO masks
    it). AdamW on the trainable parameters (the LoRA adapters). ``tool=False``: the demonstrations state the
    answer without the tool, and the prompt has no tool schema (pass ``system_prompt=NO_TOOL_SYSTEM_PROMPT``).
    """
    env = CalculatorEnv()
    examples = [_assistant_spans(tokenizer, tool_prompt(q, system_prompt), demonstration(q, a, tool=tool),
                                 [env.calculate] if tool else None)
                for q, a in pairs]
    generator = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=learning_rate)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    losses = []
    model.train()
    for _ in range(steps):
        batch = [examples[i] for i in torch.randint(len(examples), (batch_size,), generator=generator).tolist()]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in batch], device=device)  # (B, T)
        attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in batch], device=device)
        labels = torch.tensor([[t if m else -100 for t, m in zip(ids, mask)] + [-100] * (width - len(ids))
                               for ids, mask in batch], device=device)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


# ----------------------------------------------------------------------------- rollouts with the tool


def _generate(model, tokenizer, batch_ids: list[list[int]], *, max_new_tokens: int, do_sample: bool,
              temperature: float) -> list[list[int]]:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(ids) for ids in batch_ids)
    device = next(model.parameters()).device
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch_ids], device=device)  # left-padded
    attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch_ids], device=device)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                             do_sample=do_sample, temperature=temperature if do_sample else None, top_p=None,
                             top_k=None, pad_token_id=pad)
    eos = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    # each reply up to and including its first end-of-turn token
    return [row[:next((i + 1 for i, t in enumerate(row) if t in eos), len(row))] for row in out[:, width:].tolist()]


def execute_tool_calls(tools, tool_calls) -> list[tuple[dict, bool]]:
    """Return ``(tool message, failed)`` per call, run as TRL 1.16's ``_tool_call_loop`` runs them.

    trl/trainer/grpo_trainer.py lines 1975-1993: a call of a tool that is not in ``tools`` becomes
    ``{"error": "Tool NAME not found."}``; a tool that raises (wrong or missing arguments:
    ``TypeError``) becomes ``{"error": str(exception)}``; the result is sent back as ``str(result)`` in a
    ``{"role": "tool"}`` message. ``failed`` also counts a tool's own ``"error: ..."`` answer (TRL counts only
    exceptions in ``tools/failure_frequency``; the lab's metrics count both).
    """
    by_name = {tool.__name__: tool for tool in tools}
    out = []
    for call in tool_calls:
        function = call.get("function", {}) if isinstance(call, dict) and call.get("type") == "function" else {}
        name = function.get("name", "unknown")
        try:
            if name not in by_name:
                raise ValueError(f"Tool {name} not found.")
            result = by_name[name](**(function.get("arguments") or {}))
        except Exception as error:  # noqa: BLE001  as TRL: the error goes back to the model, training goes on
            result = {"error": str(error)}
        failed = not isinstance(result, str) or result.startswith(ERROR_PREFIX)
        out.append(({"role": "tool", "name": name, "content": str(result)}, failed))
    return out


def tool_rollouts(model, tokenizer, dataset, *, env_factory=CalculatorEnv, max_new_tokens: int = 48,
                  max_tool_calling_iterations: int = 2, batch_size: int = 16, do_sample: bool = False,
                  temperature: float = 1.0, use_tool: bool = True) -> list[dict]:
    """Return one record per row of ``dataset`` (``prompt``, ``answer``): a multi-turn rollout with the tool.

    As TRL's ``_tool_call_loop`` runs it: generate; parse the reply (``trl.chat_template_utils.parse_response``);
    if it holds tool calls, run them on the row's environment, append the assistant turn and the tool turns,
    and generate again from the whole conversation, at most ``max_tool_calling_iterations`` times; a tool
    that raises, an unknown tool or wrong arguments give an error message in the tool turn, as in TRL. Each
    record holds the ``messages`` generated (assistant and tool turns), the ``text`` of the assistant turns,
    whether a tool call was attempted (``attempted``: the reply contains ``<tool_call>``), ``calls`` parsed,
    ``errors`` and the environment's ``reward``. ``use_tool=False``: the prompt has no tool schema and a tool
    call is not run (one turn): the run without the tool, scored the same way.
    """
    from trl.chat_template_utils import parse_response

    if not use_tool:
        max_tool_calling_iterations = 0
    records = []
    for start in range(0, len(dataset), batch_size):
        rows = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        envs = [env_factory() for _ in rows]
        for env, row in zip(envs, rows):
            env.reset(**row)
        tools = [environment_tools(env) if use_tool else None for env in envs]  # as TRL lists an env's tools
        conversations = [list(row["prompt"]) for row in rows]
        generated = [[] for _ in rows]
        state = [{"attempted": False, "calls": 0, "errors": 0} for _ in rows]
        active = list(range(len(rows)))
        for turn in range(max_tool_calling_iterations + 1):
            if not active:
                break
            prompt_ids = [tokenizer.apply_chat_template(conversations[i], tools=tools[i], add_generation_prompt=True,
                                                        tokenize=True, return_dict=False) for i in active]
            replies = _generate(model, tokenizer, prompt_ids, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                temperature=temperature)
            still = []
            for i, ids, prefix in zip(active, replies, prompt_ids):
                message = parse_response(tokenizer, ids, prefix=prefix, tools=tools[i])
                raw = tokenizer.decode(ids, skip_special_tokens=False)
                state[i]["attempted"] |= "<tool_call>" in raw
                calls = message.get("tool_calls") or []
                message = {"role": "assistant", "content": message.get("content", ""),
                           **({"tool_calls": calls} if calls else {})}
                conversations[i].append(message)
                generated[i].append(message)
                if not calls or turn == max_tool_calling_iterations:
                    continue
                for tool_message, failed in execute_tool_calls(tools[i], calls):
                    state[i]["calls"] += 1
                    state[i]["errors"] += failed
                    conversations[i].append(tool_message)
                    generated[i].append(tool_message)
                still.append(i)
            active = still
        for row, env, turns, s in zip(rows, envs, generated, state):
            records.append({"question": row["prompt"][-1]["content"], "gold": str(row["answer"]), "messages": turns,
                            "text": "\n".join(m["content"] for m in turns if m["role"] == "assistant" and m["content"]),
                            "reward": float(env.get_reward()), **s})
    return records


def tool_scores(records: list[dict]) -> dict:
    """Return the held-out figures of :func:`tool_rollouts` records, with one verdict per problem.

    ``tool_call``: the share of replies that try to call the tool (``<tool_call>`` written);
    ``well_formed``: the share with at least one call that parsed and ran without an error;
    ``right_answer``: the share whose final stated answer is the gold number
    (:func:`labkit.rewards.right_answer_reward` on the assistant's text, tool turns excluded).
    """
    from labkit.rewards import right_answer_reward

    n = len(records)
    right = [bool(x) for x in right_answer_reward([r["text"] for r in records], answer=[r["gold"] for r in records])]
    well = [r["calls"] > r["errors"] for r in records]
    return {"n": n, "tool_call": sum(r["attempted"] for r in records) / n, "well_formed": sum(well) / n,
            "right_answer": sum(right) / n, "right": right, "called": [bool(r["attempted"]) for r in records],
            "well_formed_each": well, "tool_errors": sum(r["errors"] for r in records),
            "tool_calls": sum(r["calls"] for r in records)}


# ----------------------------------------------------------------------------- masks and lengths


def loss_mask_view(tokenizer, completion_ids: list[int], tool_mask: list[int]) -> str:
    """Return a completion's text with the tokens the loss masks (tool output, ``tool_mask`` 0) in [[brackets]]."""
    parts = []
    for m, run in itertools.groupby(zip(completion_ids, tool_mask), key=lambda pair: pair[1]):
        text = tokenizer.decode([token for token, _ in run])
        parts.append(text if m else f"[[{text}]]")
    return "".join(parts)


def loss_mask_table(tokenizer, batch: dict, rows: int = 4):
    """Return a table of a recorded batch's first ``rows`` completions, as the loss sees them (notebook 08, section 6).

    ``batch`` is one of :func:`record_batches`' dicts. Each row shows the completion with its masked tokens in
    [[brackets]] (:func:`loss_mask_view`), its token counts, whether the model's own tokens hold a
    ``<tool_response>`` it wrote itself, and its advantage. It is a :func:`text_table`: the tags show as text.
    """
    out = []
    for i in range(min(rows, batch["completion_ids"].shape[0])):
        keep = batch["completion_mask"][i].bool()
        ids = batch["completion_ids"][i][keep].tolist()
        mask = batch["tool_mask"][i][keep].tolist() if "tool_mask" in batch else [1] * len(ids)
        own = tokenizer.decode([t for t, m in zip(ids, mask) if m])  # the model's own tokens: what the loss trains
        out.append({"completion (masked tokens in [[ ]])": loss_mask_view(tokenizer, ids, mask),
                    "tokens": len(ids), "trained on": sum(mask), "masked": len(mask) - sum(mask),
                    "writes its own <tool_response>": "<tool_response>" in own,
                    "advantage": float(batch["advantages"][i])})
    return text_table(out, formats={"advantage": "{:+.2f}"})


def text_table(rows: list[dict], *, index: str | None = None, formats: dict | None = None):
    """Return a pandas Styler of ``rows`` that a browser shows as written: every cell whole, tags as text.

    Cells and headers are HTML-escaped in one ``format`` call: a second ``Styler.format`` call resets the
    escaping of every column, and the browser then reads ``<tool_call>`` as a tag and hides it. Text is
    left-aligned, keeps its line breaks and is never cut. ``index`` names the column to use as row labels
    (none: no row numbers); ``formats`` maps a column to a format string such as ``"{:+.2f}"``.
    """
    import pandas as pd

    table = pd.DataFrame(rows)
    style = (table.set_index(index) if index else table).style.format(formats or {}, escape="html")
    style = style.format_index(escape="html", axis=0).format_index(escape="html", axis=1)
    style = style.set_properties(**{"text-align": "left", "vertical-align": "top", "white-space": "pre-wrap"})
    style = style.set_table_styles([{"selector": "th", "props": [("text-align", "left")]}])
    return style if index else style.hide(axis="index")


def message_text(message: dict) -> str:
    """Return one turn of a tool conversation as a line to read: who speaks, what it says, what it calls."""
    said = [(message.get("content") or "").strip()]
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        arguments = function.get("arguments") or {}
        shown = ", ".join(f"{k}={v!r}" for k, v in arguments.items()) if isinstance(arguments, dict) else repr(arguments)
        said.append(f"calls {function.get('name')}({shown})")
    return f"{message.get('role', '?')}: " + " ".join(part for part in said if part)


def tool_round_tokens(tokenizer, expression: str = "123 * 456", result: str = "56088") -> dict:
    """Return the tokens one tool round adds to a completion: the call the model writes, and the tool turn.

    Measured on ``tokenizer``'s template: ``call`` (``<tool_call>{...}</tool_call>`` and the end of turn, trained
    on) and ``tool_turn`` (``<|im_start|>user<tool_response>...`` up to the next assistant header, masked).
    """
    env = CalculatorEnv()
    prompt = tool_prompt("q")
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculate", "arguments": {"expression": expression}}}]}
    base = tokenizer.apply_chat_template(prompt, tools=[env.calculate], add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    with_call = tokenizer.apply_chat_template(prompt + [call], tools=[env.calculate], tokenize=True, return_dict=False)
    with_tool = tokenizer.apply_chat_template(prompt + [call, {"role": "tool", "name": "calculate", "content": result}],
                                             tools=[env.calculate], add_generation_prompt=True, tokenize=True,
                                             return_dict=False)
    return {"prompt": len(base), "call": len(with_call) - len(base), "tool_turn": len(with_tool) - len(with_call)}


# ----------------------------------------------------------------------------- the trainer


def record_batches(trainer) -> list[dict]:
    """Return a list that receives every batch ``trainer`` generates and scores (the dict TRL trains on).

    Each holds ``prompt_ids``, ``completion_ids``, ``completion_mask``, ``tool_mask`` (0 on tool-output tokens),
    ``advantages``: what the loss sees. It wraps the trainer's ``_generate_and_score_completions`` (TRL 1.16).
    """
    batches: list[dict] = []
    generate_and_score = trainer._generate_and_score_completions

    def recording(inputs):
        output = generate_and_score(inputs)
        batches.append({k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in output.items()})
        return output

    trainer._generate_and_score_completions = recording
    return batches


# ----------------------------------------------------------------------------- real mode: a 16 GB card

# GSM8K with the calculator on Qwen2.5-1.5B-Instruct: the preset tools-16gb (labkit.presets), which
# ``python -m labkit train --preset tools-16gb`` runs through labkit.run.build_run. Its completion budget counts the
# tool rounds: REASONING_TOKENS of the model's own text plus max_tool_calling_iterations x TOKENS_PER_ROUND (the call
# the model writes, about 37 tokens, trained, and the tool turn, about 26, masked: tool_round_tokens measures them).
REASONING_TOKENS = 512
TOKENS_PER_ROUND = 64


def tools_recipe():
    """Return the real mode's tool recipe: the preset ``tools-16gb``."""
    from labkit.presets import get_preset

    return get_preset("tools-16gb")


def size_tools_recipe(preset=None, *, batches=(8, 16, 24, 32, 40)) -> list[dict]:
    """Return one row per ``per_device_train_batch_size``: the estimated peak of the tool recipe, and whether it fits.

    ``preset`` (default ``tools-16gb``) bounds the whole multi-turn completion by ``max_completion_length``
    (:data:`REASONING_TOKENS` + ``max_tool_calling_iterations`` x :data:`TOKENS_PER_ROUND`) and its prompt, the
    tool schema included, by ``max_prompt_length``. A tool round is not only more tokens in one completion: TRL 1.16
    calls ``generate`` again on prompt + completion so far + tool turn (up to ``max_prompt_length +
    max_completion_length`` tokens, prefilled from scratch) and asks ``max_completion_length`` new tokens again,
    so the cache of every row of the generation batch grows toward ``max_prompt_length + 2 x
    max_completion_length`` (:func:`labkit.memory.estimate`, ``max_tool_calling_iterations``). Each row gives the
    generation phase's **estimate** for the first turn and for a tool round, and the step's peak
    (:func:`labkit.oom.estimate` of the plan on the preset's card), sized like the presets
    (:func:`labkit.device.sized_gib`: x 1.1 + 1 GiB) against 80 % of the card; the preset's own batch was chosen by
    the rehearsal on fake tensors, which runs every round (``python -m bench rehearsal``, results/rehearsal.csv).
    """
    from labkit.device import SIZING_TARGET, sized_gib
    from labkit.memory import GIB
    from labkit.oom import estimate
    from labkit.presets import card_device, resolve_plan

    preset = preset or tools_recipe()
    rows = []
    for batch in batches:
        if batch % preset.config["num_generations"]:
            continue
        candidate = preset.replace(per_device_train_batch_size=batch)
        est = estimate(resolve_plan(candidate, card_device(preset)))
        first = estimate(resolve_plan(candidate.replace(environment=None, max_tool_calling_iterations=None),
                                      card_device(preset)))  # the same step without a tool round: the first turn
        peak = est.total
        rows.append({"per_device_train_batch_size": batch, "generation_batch": est.settings["generation_batch"],
                     "max_prompt_length": preset.max_prompt_length,
                     "max_completion_length": preset.config["max_completion_length"],
                     "first_turn_gib": round(first.bytes["generation_phase"] / GIB, 2),
                     "tool_round_gib": round(est.bytes["generation_phase"] / GIB, 2),
                     "training_gib": round(est.bytes["training_phase"] / GIB, 2), "estimated_gib": round(peak, 2),
                     "sized_gib": round(sized_gib(peak), 2),
                     "fits_80_percent": sized_gib(peak) <= SIZING_TARGET * preset.card_gib,
                     "the preset": batch == preset.config["per_device_train_batch_size"]})
    return rows


# ----------------------------------------------------------------------------- reading the recorded experiment

_STAGES = {"untrained": "untrained", "before_grpo": "after the warm-up", "after_grpo": "after GRPO",
           "control_lr0": "control (lr 0)"}
_ARMS = {"tool": "with the calculator", "no_tool": "without a tool"}


def tools_demo_table(summary: dict):
    """Return a table of ``python -m bench tools-demo``'s figures: one row per arm and stage.

    Columns: the share of replies that call the tool, that call it well, and that are right, with the right-answer
    rate's 95 % Wilson interval.
    """
    import pandas as pd

    rows = []
    for arm, figures in summary["arms"].items():
        for stage, s in figures["stages"].items():
            low, high = figures["right_answer_ci95"][stage]
            rows.append({"run": _ARMS.get(arm, arm), "stage": _STAGES.get(stage, stage), "tool call": s["tool_call"],
                         "well formed": s["well_formed"], "right answer": s["right_answer"],
                         "95 % interval": f"{low:.0%} to {high:.0%}"})
    return pd.DataFrame(rows).set_index(["run", "stage"])


def plot_tools_demo(summary: dict, ax=None):
    """Return a bar chart of the recorded right-answer rates: each stage, with and without the tool, with 95 % intervals.

    The title carries the paired test of the two runs after GRPO (McNemar's exact test on the same problems).
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 3.6))
    stages = ("untrained", "before_grpo", "after_grpo")
    arms = [a for a in ("no_tool", "tool") if a in summary["arms"]]
    width = 0.8 / len(arms)
    for k, arm in enumerate(arms):
        figures = summary["arms"][arm]
        rates = [figures["stages"][s]["right_answer"] for s in stages]
        lows = [r - figures["right_answer_ci95"][s][0] for r, s in zip(rates, stages)]
        highs = [figures["right_answer_ci95"][s][1] - r for r, s in zip(rates, stages)]
        xs = [i + (k - (len(arms) - 1) / 2) * width for i in range(len(stages))]
        ax.bar(xs, rates, width, yerr=[lows, highs], capsize=3, label=_ARMS[arm],
               color="#4c78a8" if arm == "tool" else "#bab0ac")
        for x, r, up in zip(xs, rates, highs):
            ax.text(x, r + up + 0.015, f"{r:.0%}", ha="center", va="bottom", fontsize=8)  # above its interval
    ax.set_xticks(range(len(stages)), [_STAGES[s] for s in stages])
    ax.set_ylim(0, 1.12)
    ax.set_ylabel(f"right answers ({summary['held_out_problems']} held-out)")
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:.0%}"))
    after = summary.get("tool_vs_no_tool", {}).get("after_grpo")
    title = f"Word problems with {summary.get('numbers', 'small')} numbers, SmolLM2-135M on a CPU"
    if after:
        title += (f"\nafter GRPO, tool - no tool: {after['right_answer_change_points']:+.1f} points, "
                  f"McNemar p = {after['mcnemar_p']:.2g} (bars: 95 % intervals)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    return ax


def tools_demo_tests(summary: dict):
    """Return the recorded paired tests as a table: GRPO against the warm-up in each run, and the two runs after GRPO.

    Changes in points, Newcombe's 95 % paired interval computed here from the per-problem verdicts the record keeps
    (``stages/<stage>/right``, :func:`labkit.evaluate.paired_change`: never zero-width, where the percentile
    bootstrap of older records is when every problem moved the same way), McNemar's exact p as recorded (the same
    test), problems gained and lost. A record without the verdicts shows its own interval, named by its key.
    """
    import pandas as pd

    from labkit.evaluate import paired_change

    arms = summary["arms"]
    tests = {f"{_ARMS.get(arm, arm)}: GRPO against the warm-up": (figures["grpo_vs_before"]["after_grpo"],
                                                                   (arm, "before_grpo"), (arm, "after_grpo"))
             for arm, figures in arms.items()}
    if summary.get("tool_vs_no_tool"):
        tests["after GRPO: with the calculator against without"] = (summary["tool_vs_no_tool"]["after_grpo"],
                                                                     ("no_tool", "after_grpo"), ("tool", "after_grpo"))

    def verdicts(arm, stage):
        return arms.get(arm, {}).get("stages", {}).get(stage, {}).get("right")

    def interval(t, before, after):
        before, after = verdicts(*before), verdicts(*after)
        if before is not None and after is not None:
            paired = paired_change(before, after)
            return "{:+.0f} to {:+.0f} points (Newcombe)".format(100 * paired.low, 100 * paired.high)
        key = "change_ci95_paired" if "change_ci95_paired" in t else "change_ci95_paired_bootstrap"
        label = "Newcombe, recorded" if key == "change_ci95_paired" else "bootstrap, recorded"
        return "{:+.0f} to {:+.0f} points ({})".format(*(100 * x for x in t[key]), label)

    return pd.DataFrame({name: {"change": f"{t['right_answer_change_points']:+.1f} points",
                                "95 % paired interval": interval(t, before, after),
                                "gained": t["gained"], "lost": t["lost"], "McNemar p": f"{t['mcnemar_p']:.2g}"}
                         for name, (t, before, after) in tests.items()}).T
