"""Tool rounds forced on a model with random weights: what a tool recipe's rounds cost, measured by ``bench gpu``.

A model with random weights never writes a tool call, so a tool recipe (``tools-16gb``) measured on one would
never run a tool round: TRL 1.16's ``_tool_call_loop`` (trl/trainer/grpo_trainer.py) runs only for completions
whose parsed reply holds ``tool_calls``. Each round it runs the tool, appends the tool's answer to prompt + reply
so far (``_get_tool_suffix_ids``) and calls ``generate`` again on that longer prompt, asking for up to
``max_completion_length`` new tokens again (the trainer's one generation config); a round whose reply + tool turn
would pass ``max_completion_length`` is dropped, and the reply after the last round is cut to the budget.

:class:`ForcedToolCalls` is a ``transformers`` logits processor that makes every completion take exactly
``max_tool_calling_iterations`` rounds: in each turn before the last it lets the model write a few tokens, then
forces a well-formed call to the environment's tool, the very text the chat template renders for one
(:func:`forced_call`, checked with TRL's own ``parse_response``), and the end of turn. The free tokens are sized so
that the rounds fill the completion budget (the last round's prompt is then as long as TRL allows: prompt +
``max_completion_length``); the last turn writes no call and runs to ``max_completion_length`` new tokens (the
bench's ``min_new_tokens``), which TRL then cuts to the budget: the worst case, as every other row of ``bench gpu``.
TRL offers no hook for a logits processor (``GRPOConfig.generation_kwargs`` builds a ``GenerationConfig``, which
refuses one), so :func:`install` wraps the trained model's ``generate`` to pass it, and to record the longest
prompt each call saw.

The bench's byte-level tokenizer spells text byte by byte, so the tool schema alone would be 845 tokens where
Qwen2.5's tokenizer needs about 250, more than ``tools-16gb``'s 448-token prompt. :func:`prepare` gives it Qwen2.5's
four tool tags as single tokens (as Qwen2.5's vocabulary has them) and the rendered system turn (the system prompt
with the tool schema) as one more, so that :func:`tool_prompts` makes prompts of exactly ``max_prompt_length``
tokens, schema included, as the recipe's are: memory depends on how many tokens there are, not which.
"""
from __future__ import annotations

from labkit.environments import TOOL_SYSTEM_PROMPT, tool_prompt

__all__ = ["TOOL_TAGS", "FORCED_EXPRESSION", "prepare", "tool_prompts", "forced_call", "ForcedToolCalls", "install"]

# Single tokens in Qwen2.5's vocabulary (ids 151657, 151658, 151665, 151666); the chat template writes them.
TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
FORCED_EXPRESSION = "12 * (3 + 4)"  # what every forced call asks the calculator (it answers 84)


def _system_turn(tokenizer, tools, system_prompt: str) -> str:
    """Return the rendered system turn (the system prompt and the tool schema) between ``<|im_start|>`` and
    ``<|im_end|>``: the same text in every prompt of a tool recipe."""
    text = tokenizer.apply_chat_template([{"role": "system", "content": system_prompt}], tools=tools, tokenize=False)
    start, end = "<|im_start|>", "<|im_end|>"
    if not text.startswith(start) or end not in text:
        raise ValueError(f"the chat template does not render a ChatML system turn: {text[:80]!r}")
    return text[len(start):text.index(end)]


def prepare(tokenizer, tools, system_prompt: str = TOOL_SYSTEM_PROMPT):
    """Return ``tokenizer`` made ready for a tool recipe (:func:`labkit.environments.prepare_tool_tokenizer`) with
    :data:`TOOL_TAGS` and the rendered system turn added as single tokens (the module docstring says why)."""
    from labkit.environments import prepare_tool_tokenizer

    prepare_tool_tokenizer(tokenizer)
    tokenizer.add_tokens([*TOOL_TAGS, _system_turn(tokenizer, tools, system_prompt)])
    return tokenizer


def tool_prompts(tokenizer, tools, n: int, length: int, system_prompt: str = TOOL_SYSTEM_PROMPT):
    """Return ``n`` tool prompts (system prompt, then a question) of exactly ``length`` tokens as TRL renders them:
    with the tool schema and the generation prompt. Columns ``prompt`` and ``answer`` (the environment's
    ``reset`` receives the row)."""
    from datasets import Dataset

    def count(question: str) -> int:
        return len(tokenizer.apply_chat_template(tool_prompt(question, system_prompt), tools=tools,
                                                 add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])

    overhead = count("")
    if overhead > length:
        raise ValueError(f"the tool prompt without a question is {overhead} tokens, more than {length}")
    filler = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. " * 40
    ids = tokenizer(filler, add_special_tokens=False)["input_ids"][:length - overhead]
    question = tokenizer.decode(ids)
    if count(question) != length:
        raise RuntimeError(f"built a {count(question)}-token tool prompt, wanted {length}")
    return Dataset.from_dict({"prompt": [tool_prompt(question, system_prompt)] * n, "answer": ["84"] * n})


def forced_call(tokenizer, tools, expression: str = FORCED_EXPRESSION) -> tuple[str, list[int]]:
    """Return ``(text, ids)`` of one call to the environment's tool as the chat template writes it, ids ending with
    the end of turn (EOS). Raises ValueError unless TRL's ``parse_response`` reads it back as that call."""
    from trl.chat_template_utils import parse_response

    name = tools[0].__name__
    prompt = tool_prompt("Q")
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": name, "arguments": {"expression": expression}}}]}
    head = tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(prompt + [call], tools=tools, tokenize=False)
    text = full[len(head):].split(tokenizer.eos_token)[0]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    prefix = tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"]
    parsed = parse_response(tokenizer, ids, prefix=prefix, tools=tools)
    if parsed.get("tool_calls") != call["tool_calls"]:
        raise ValueError(f"the forced call {text!r} does not parse back as TRL parses a call: {parsed!r}")
    return text, ids


class ForcedToolCalls:
    """A logits processor that makes every completion call the tool in each of its first ``rounds`` turns.

    In a turn before the last (counted by the ``<tool_response>`` tokens TRL's tool turns left after the prompt),
    the model writes ``free`` sampled tokens, then :func:`forced_call`'s ids are forced one by one (every other
    logit set to -inf), the last being the end of turn; ``free`` is chosen per turn so that after round ``k`` the
    completion so far (replies and tool turns) is ``k x (max_completion_length // rounds)`` tokens. In the last turn
    nothing is forced. Sampled tokens may never be one of the ``structural`` ids (the tool tags, ``<|im_start|>``,
    the system turn's token), so the model cannot start or fake a call by chance. :meth:`begin` is called by
    :func:`install`'s ``generate`` before each call with the padded prompts.
    """

    def __init__(self, call_ids: list[int], rounds: int, budget: int, turn_tokens: int, header_ids: list[int],
                 response_id: int, structural: list[int]):
        self.call_ids, self.rounds, self.budget, self.turn_tokens = list(call_ids), rounds, budget, turn_tokens
        self.header_ids, self.response_id, self.structural = list(header_ids), response_id, list(structural)
        self.plans: list[int | None] = []  # per row of the current call: free tokens before its call, None: no call
        self.start_len = 0
        self.generate_calls = 0
        self.longest_prompt = 0  # tokens, without padding, of the longest prompt any generate call saw
        self.rounds_seen = 0  # the most tool turns a prompt already held (TRL's rounds really taken)
        self.calls_forced = 0

    def _completion_start(self, ids: list[int]) -> int:
        """Return where the completion starts: after the prompt's generation prompt (its first assistant header)."""
        n = len(self.header_ids)
        for i in range(len(ids) - n + 1):
            if ids[i:i + n] == self.header_ids:
                return i + n
        raise ValueError("no assistant header in the prompt: not a chat prompt")

    def begin(self, input_ids, attention_mask) -> None:
        """Plan each row's turn for a new ``generate`` call on ``input_ids`` (B, T), left-padded."""
        self.generate_calls += 1
        self.start_len = input_ids.shape[1]
        self.plans = []
        share = self.budget // self.rounds
        for row, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            ids = [t for t, m in zip(row, mask) if m]
            self.longest_prompt = max(self.longest_prompt, len(ids))
            start = self._completion_start(ids)
            done = ids[start:].count(self.response_id)
            self.rounds_seen = max(self.rounds_seen, done)
            if done >= self.rounds:
                self.plans.append(None)
                continue
            so_far = len(ids) - start
            self.plans.append(max(0, (done + 1) * share - so_far - len(self.call_ids) - self.turn_tokens))

    def __call__(self, input_ids, scores):
        """Return ``scores`` (B, V) with the planned tokens forced and the structural ids banned elsewhere."""
        import torch

        new = input_ids.shape[1] - self.start_len  # tokens this call has written so far
        forced_rows, forced_ids, free_rows = [], [], []
        for row, free in enumerate(self.plans):
            if free is not None and free <= new < free + len(self.call_ids):
                forced_rows.append(row)
                forced_ids.append(self.call_ids[new - free])
                if new == free:
                    self.calls_forced += 1
            else:
                free_rows.append(row)
        if free_rows:
            rows = torch.tensor(free_rows, device=scores.device).unsqueeze(1)
            scores[rows, torch.tensor(self.structural, device=scores.device)] = -float("inf")
        if forced_rows:
            rows = torch.tensor(forced_rows, device=scores.device)
            scores[rows] = -float("inf")
            scores[rows, torch.tensor(forced_ids, device=scores.device)] = 0.0
        return scores

    def summary(self) -> dict:
        """Return what the forced rounds did: generate calls, rounds, calls forced, the longest prompt (tokens)."""
        return {"generate_calls": self.generate_calls, "tool_rounds_seen": self.rounds_seen,
                "calls_forced": self.calls_forced, "longest_prompt_tokens": self.longest_prompt}


def install(trainer, tokenizer, tools, *, rounds: int, budget: int) -> ForcedToolCalls:
    """Return the :class:`ForcedToolCalls` now passed to every ``generate`` call of ``trainer``'s model.

    The tool turn's length is what TRL itself appends after a call (its ``_get_tool_suffix_ids`` for the
    calculator's answer to :data:`FORCED_EXPRESSION`).
    """
    import functools

    from transformers import LogitsProcessorList

    from labkit.environments import safe_calculate

    _, call_ids = forced_call(tokenizer, tools)
    answer = {"role": "tool", "name": tools[0].__name__, "content": safe_calculate(FORCED_EXPRESSION)}
    turn_tokens = len(trainer._get_tool_suffix_ids([answer]))
    header = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    structural = tokenizer.convert_tokens_to_ids([*TOOL_TAGS, "<|im_start|>", _system_turn(tokenizer, tools,
                                                                                          TOOL_SYSTEM_PROMPT)])
    processor = ForcedToolCalls(call_ids, rounds, budget, turn_tokens, header,
                                tokenizer.convert_tokens_to_ids("<tool_response>"), structural)
    model = trainer.model
    original = model.generate

    @functools.wraps(original)
    def generate(*args, **kwargs):
        processor.begin(kwargs["input_ids"], kwargs["attention_mask"])
        processors = LogitsProcessorList([*(kwargs.pop("logits_processor", None) or []), processor])
        return original(*args, logits_processor=processors, **kwargs)

    model.generate = generate  # TRL calls the unwrapped model's generate: this one (an instance attribute)
    return processor
