"""GRPO with a tool: a safe calculator, the environment TRL 1.16 calls it through, tool rollouts and their metrics.

Introduced in ``08_grpo_with_tools.ipynb``. TRL 1.16's ``GRPOTrainer(environment_factory=...)`` makes one
environment per rollout, calls its ``reset(**example)`` before generation, exposes its public methods as tools
(their names, type hints and docstrings become the tool schema in the prompt), runs the tool calls the model
writes (``_tool_call_loop``) and, when the environment defines ``get_reward()``, adds its value as one more
reward (weight 1, logged under the class's name).

- :func:`safe_calculate`: the calculator: labkit's ast-based evaluator (never ``eval``), with decimals, a
  length cap and a size cap; every bad input gives a short ``"error: ..."`` string, never an exception.
- :class:`CalculatorEnv`: the environment (``reset``, the ``calculate`` tool, ``get_reward``, a cap on calls).
- :func:`prepare_tool_tokenizer`: a tokenizer whose template renders tools and whose replies parse back
  (SmolLM2's own template has no tools: it gets the Qwen2.5 template TRL recognises).
- :func:`tool_rollouts` and :func:`tool_scores`: greedy (or sampled) multi-turn rollouts with the tool, as
  TRL runs them, and the held-out figures: replies that call the tool, well-formed calls, right answers.
- :func:`warm_up`: a few supervised steps on tool-use demonstrations (a small model never writes a tool call
  on its own, so GRPO would have nothing to reinforce).
"""
from __future__ import annotations

import re
import warnings
from fractions import Fraction

import torch

__all__ = ["TOOL_SYSTEM_PROMPT", "MAX_CALLS", "MAX_EXPRESSION_CHARS", "ERROR_PREFIX", "safe_calculate",
           "CalculatorEnv", "prepare_tool_tokenizer", "tool_prompt", "demonstration", "warm_up",
           "tool_rollouts", "tool_scores", "loss_mask_view", "tool_round_tokens", "tool_trainer", "record_batches",
           "execute_tool_calls", "TOOLS_16GB", "size_tools_recipe"]

TOOL_SYSTEM_PROMPT = ("Use the calculate tool for the arithmetic, then answer in one short sentence.")
MAX_CALLS = 3  # tool calls a rollout may make; the rest get an error message
MAX_EXPRESSION_CHARS = 100  # longer expressions are refused before parsing
ERROR_PREFIX = "error: "
_DECIMAL = re.compile(r"(?<![\d.])(\d+)\.(\d+)(?![\d.])")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")


def _format(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6g}"


def safe_calculate(expression) -> str:
    """Return the value of an arithmetic expression as text, or a short ``"error: ..."`` message; never raises.

    Accepted: integers and decimals (``2.5`` is read as the exact ``25/10``), ``+ - * /``, ``**`` with an
    exponent of at most 8, brackets, ``x`` / ``×`` for times, thousands separators (``1,200``). Refused with a
    message: a non-string, more than :data:`MAX_EXPRESSION_CHARS` characters, names, calls and attributes
    (``__import__('os')``), division by zero, and any intermediate value beyond 10^12 (``9**9**9`` stops at
    its first power, having computed nothing big). The evaluation is
    :func:`labkit.rewards.parse.evaluate_expression`: ``ast.parse`` and a walk over whitelisted nodes.
    """
    from labkit.rewards.parse import evaluate_expression

    if not isinstance(expression, str):
        return f"{ERROR_PREFIX}the expression must be a string, not {type(expression).__name__}"
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"{ERROR_PREFIX}the expression is longer than {MAX_EXPRESSION_CHARS} characters"
    text = _THOUSANDS.sub("", expression.strip().rstrip("=").strip())
    text = re.sub(r"(?<=[\d)\s])[xX](?=[\s\d(])", "*", text)
    text = _DECIMAL.sub(lambda m: f"({m.group(1)}{m.group(2)}/1{'0' * len(m.group(2))})", text)
    if not text:
        return f"{ERROR_PREFIX}empty expression"
    with warnings.catch_warnings():  # ast.parse warns on odd escapes ("\\F") in string literals: model text, not ours
        warnings.simplefilter("ignore")
        value = evaluate_expression(text, allow_power=True)
        as_product = None if value is not None else evaluate_expression(re.sub(r"/", "*", text), allow_power=True)
    if value is not None:
        return _format(value)
    if re.search(r"[A-Za-z_]", text):
        return f"{ERROR_PREFIX}only numbers and + - * / ** ( ) are allowed"
    if as_product is not None:  # the same with every "/" read as "*" evaluates: a division by zero
        return f"{ERROR_PREFIX}division by zero"
    return f"{ERROR_PREFIX}cannot evaluate {expression[:40]!r} (too large, or not arithmetic)"


class CalculatorEnv:
    """The lab's tool environment: TRL makes one per rollout (``environment_factory=CalculatorEnv``).

    - ``reset(**example)``: called by TRL before each rollout with the dataset row (``prompt``, ``answer``,
      ...); clears the previous rollout's calls and keeps the gold ``answer``. Returns ``None``: the prompt
      stays as it is (a string would be appended to the last user message).
    - ``calculate(expression)``: the tool (its docstring and type hint become the schema the model reads).
      At most :data:`MAX_CALLS` calls a rollout; every failure is a string that goes back to the model.
    - ``get_reward()``: 1.0 when a call of this rollout returned the gold answer, else 0.0 (TRL adds it to
      the other rewards with weight 1, under the name ``CalculatorEnv``).

    ``calls``, ``errors`` and ``results`` are what this rollout did (the notebook's metrics read them).
    """

    max_calls = MAX_CALLS

    def __init__(self):
        self.reset()

    def reset(self, answer=None, **example) -> None:
        self.answer = None if answer is None else str(answer)
        self.calls = 0
        self.errors = 0
        self.results: list[str] = []
        return None

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return its value.

        Args:
            expression: numbers with + - * / and brackets, for example "7 * (8 + 2)".
        """
        self.calls += 1
        if self.calls > self.max_calls:
            self.errors += 1
            return f"{ERROR_PREFIX}at most {self.max_calls} calls per question; answer now"
        result = safe_calculate(expression)
        if result.startswith(ERROR_PREFIX):
            self.errors += 1
        else:
            self.results.append(result)
        return result

    def get_reward(self) -> float:
        from labkit.rewards.parse import answers_match

        if self.answer is None:
            return 0.0
        return 1.0 if any(answers_match(r, self.answer) for r in self.results) else 0.0


# ----------------------------------------------------------------------------- the chat template


def prepare_tool_tokenizer(tokenizer):
    """Return ``tokenizer`` ready for tool calls: a template that renders tools, and a response parser.

    A template that cannot render a tool conversation (SmolLM2's: TRL's ``supports_tool_calling`` is False)
    is replaced by TRL's copy of Qwen2.5's ChatML template (``trl/chat_templates/qwen2_5.jinja``): SmolLM2
    speaks ChatML (``<|im_start|>``, ``<|im_end|>``), so only the tool blocks are new to it. That exact text
    is one ``add_response_schema`` recognises, so tool calls written as
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` parse back (``parse_response``).
    Qwen2.5's own tokenizer is left as it is (its template is that one).
    """
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template, supports_tool_calling

    if not supports_tool_calling(tokenizer):
        tokenizer.chat_template = qwen2_5_chat_template
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        add_response_schema(tokenizer)
    return tokenizer


def tool_prompt(question: str, system_prompt: str = TOOL_SYSTEM_PROMPT) -> list[dict]:
    """Return the conversational prompt of a question for the tool runs (system prompt, then the question)."""
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


_OPS = {"gets": "+", "more": "+", "gives away": "-", "left": "-", "bags with": "*"}


def _expression(question: str) -> str:
    numbers = re.findall(r"\d+", question)
    a, b = numbers[0], numbers[1]
    op = "*" if "bags with" in question else "-" if "gives away" in question else "+"
    return f"{a} {op} {b}"


def demonstration(question: str, answer: str) -> list[dict]:
    """Return a tool-use conversation for a word problem of :class:`labkit.tasks.WordProblems` (the warm-up's data).

    The assistant calls ``calculate`` with the problem's one operation, reads the result and states it:
    ``"Mia has 56 stickers."``.
    """
    expression = _expression(question)
    result = safe_calculate(expression)
    subject, item = question.split(" ", 1)[0], re.search(r"How many (\w+)", question).group(1)
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
            system_prompt: str = TOOL_SYSTEM_PROMPT, seed: int = 0) -> list[float]:
    """Return the loss per step of a short supervised warm-up on tool-use demonstrations (``model`` is trained).

    ``pairs`` are ``(question, answer)`` word problems; each becomes :func:`demonstration`'s conversation and
    the loss is the cross-entropy on the assistant's tokens only (the tool's reply is masked, as GRPO masks
    it). AdamW on the trainable parameters (the LoRA adapters).
    """
    env = CalculatorEnv()
    examples = [_assistant_spans(tokenizer, tool_prompt(q, system_prompt), demonstration(q, a), [env.calculate])
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
    completions = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        completions.append(row[:cut])
    return completions


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
                  temperature: float = 1.0) -> list[dict]:
    """Return one record per row of ``dataset`` (``prompt``, ``answer``): a multi-turn rollout with the tool.

    As TRL's ``_tool_call_loop`` runs it: generate; parse the reply (``trl.chat_template_utils.parse_response``);
    if it holds tool calls, run them on the row's environment, append the assistant turn and the tool turns,
    and generate again from the whole conversation, at most ``max_tool_calling_iterations`` times; a tool
    that raises, an unknown tool or wrong arguments give an error message in the tool turn, as in TRL. Each
    record holds the ``messages`` generated (assistant and tool turns), the ``text`` of the assistant turns,
    whether a tool call was attempted (``attempted``: the reply contains ``<tool_call>``), ``calls`` parsed,
    ``errors`` and the environment's ``reward``.
    """
    from trl.chat_template_utils import parse_response

    records = []
    for start in range(0, len(dataset), batch_size):
        rows = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        envs = [env_factory() for _ in rows]
        for env, row in zip(envs, rows):
            env.reset(**row)
        tools = [[env.calculate] for env in envs]
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


def loss_mask_view(tokenizer, completion_ids: list[int], tool_mask: list[int], width: int = 120) -> str:
    """Return a completion's text with the tokens the loss masks (tool output, ``tool_mask`` 0) in [[brackets]]."""
    parts, run, current = [], [], None
    for token, m in zip(completion_ids, tool_mask):
        if m != current and run:
            text = tokenizer.decode(run)
            parts.append(text if current else f"[[{text}]]")
            run = []
        current = m
        run.append(token)
    if run:
        text = tokenizer.decode(run)
        parts.append(text if current else f"[[{text}]]")
    return "".join(parts)


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


def tool_trainer(model, tokenizer, train_dataset, output_dir, *, env_factory=CalculatorEnv, reward_funcs=None,
                 max_steps: int = 8, learning_rate: float = 1e-3, num_generations: int = 8, prompts_per_step: int = 2,
                 max_completion_length: int = 96, max_tool_calling_iterations: int = 2, temperature: float = 1.0,
                 seed: int = 0, callbacks=None, micro_batch: int | None = None, **config):
    """Return a ``trl.GRPOTrainer`` that trains ``model`` with the tool environment ``env_factory``.

    TRL 1.16 takes the environment as ``environment_factory``: its ``calculate`` method becomes the tool, its
    ``get_reward`` an extra reward (weight 1). ``reward_funcs`` (default: :func:`labkit.rewards.right_answer_reward`
    on the assistant's text) score the final answer. ``max_completion_length`` bounds the whole multi-turn
    completion (every assistant turn *and* every tool turn between them); ``max_tool_calling_iterations`` the
    tool rounds. ``micro_batch``: completions per forward/backward pass (``per_device_train_batch_size``; the
    accumulation makes up the ``num_generations x prompts_per_step`` of a step; ``None``: all in one pass). A tool
    completion is long (the schema in the prompt, the tool turns): on a CPU, 16 of them in one fp32 pass of
    SmolLM2-135M took 18 GB. ``config``: any other ``GRPOConfig`` field. The dataset needs ``prompt`` and ``answer`` (the
    ``answer`` column reaches both the reward functions and ``env.reset``).
    """
    from trl import GRPOTrainer

    from labkit.rewards import right_answer_reward
    from labkit.training import grpo_config

    prepare_tool_tokenizer(tokenizer)
    completions = num_generations * prompts_per_step
    micro_batch = micro_batch or completions
    if completions % micro_batch:
        raise ValueError(f"micro_batch ({micro_batch}) must divide num_generations x prompts_per_step ({completions})")
    args = grpo_config(output_dir, per_device_train_batch_size=micro_batch,
                       gradient_accumulation_steps=completions // micro_batch, num_generations=num_generations,
                       max_completion_length=max_completion_length,
                       max_tool_calling_iterations=max_tool_calling_iterations, learning_rate=learning_rate,
                       max_steps=max_steps, temperature=temperature, seed=seed, beta=0.0,
                       **({"precision": "fp32"} if next(model.parameters()).device.type == "cpu" else {}), **config)
    trainer = GRPOTrainer(model=model, reward_funcs=list(reward_funcs or [right_answer_reward]), args=args,
                          train_dataset=train_dataset, processing_class=tokenizer, environment_factory=env_factory,
                          callbacks=callbacks)
    if args.disable_tqdm:  # then transformers prints every log as a dict (PrinterCallback): the dashboard shows them
        from transformers import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    return trainer


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

# GSM8K with the calculator on Qwen2.5-1.5B-Instruct (its own template renders tools; TRL recognises it). The
# prompt carries the tool schema (about 230 tokens of Qwen's template) besides the question; each tool round adds
# the call the model writes (about 37 tokens, trained) and the tool turn (about 26, masked) to the completion.
TOOLS_16GB = dict(model="Qwen/Qwen2.5-1.5B-Instruct", method="lora", gradient_accumulation_steps=4,
                  num_generations=8, max_prompt_length=448, reasoning_tokens=512, max_tool_calling_iterations=3,
                  tokens_per_round=64, optim="adamw_bnb_8bit", gradient_checkpointing=True, learning_rate=2e-4,
                  max_steps=200, lora_rank=16, card="rtx3080-laptop-16gb")  # labkit.cards: what a 16 GB laptop gives PyTorch


def size_tools_recipe(recipe: dict | None = None, *, batches=(4, 8, 12, 16, 24, 32)) -> list[dict]:
    """Return one row per ``per_device_train_batch_size``: the estimated peak of the tool recipe, and whether it fits.

    The completion budget counts the tool rounds: ``max_completion_length = reasoning_tokens +
    max_tool_calling_iterations x tokens_per_round`` (TRL bounds the whole multi-turn completion, tool turns
    included, by ``max_completion_length``), and the prompt the tool schema. Each row's estimate
    (:func:`labkit.memory.estimate`, bf16) is sized like the presets (:func:`labkit.cards.sized_gib`: x 1.1 + 1 GiB)
    against 80 % of the card. An **estimate**: the rehearsal on fake tensors and ``bench gpu`` have not run it yet.
    """
    from labkit.cards import CARDS, SIZING_TARGET, sized_gib
    from labkit.memory import estimate

    r = dict(TOOLS_16GB, **(recipe or {}))
    card_gib = CARDS[r["card"]].gib
    completion = r["reasoning_tokens"] + r["max_tool_calling_iterations"] * r["tokens_per_round"]
    rows = []
    for batch in batches:
        if batch % r["num_generations"] and (batch * r["gradient_accumulation_steps"]) % r["num_generations"]:
            continue
        peak = estimate(r["model"], r["method"], per_device_train_batch_size=batch,
                        gradient_accumulation_steps=r["gradient_accumulation_steps"],
                        num_generations=r["num_generations"], max_prompt_length=r["max_prompt_length"],
                        max_completion_length=completion, optim=r["optim"],
                        gradient_checkpointing=r["gradient_checkpointing"], precision="bf16",
                        lora_rank=r["lora_rank"]).total
        rows.append({"per_device_train_batch_size": batch, "max_prompt_length": r["max_prompt_length"],
                     "max_completion_length": completion, "estimated_gib": round(peak, 2),
                     "sized_gib": round(sized_gib(peak), 2),
                     "fits_80_percent": sized_gib(peak) <= SIZING_TARGET * card_gib})
    return rows
