"""GSM8K evaluation: strict vs lenient scoring, batching that changes nothing, records, before/after."""
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from labkit.data import load_gsm8k
from labkit.evaluate import (EvalResult, before_after_table, ci95, grade_completion, gsm8k_accuracy, mcnemar_test,
                             newcombe_interval, paired_bootstrap, paired_change, pass_at_k, wilson_interval)
from labkit.models import build_tiny_model, load_policy, tiny_tokenizer


@pytest.mark.parametrize("completion, gold, expected", [
    ("<think>3 + 4 = 7</think>\n<answer>7</answer>", "7", (True, True, True)),
    ("<think>3 + 4 = 7</think>\n<answer>$7.00</answer>", "7", (True, True, True)),
    ("<think>3 + 4 = 8</think>\n<answer>8</answer>", "7", (True, False, False)),
    ("The answer is 7.", "7", (False, False, True)),  # right number, no format: lenient only
    ("<answer>7</answer>", "7", (False, False, True)),  # no reasoning: not the format
    ("<think>7</think><answer>7</answer> and 9", "7", (False, False, False)),  # trailing text, last number 9
    ("", "7", (False, False, False)),
    ("\x00\ufffd" * 1000, "7", (False, False, False)),
])
def test_score_completion(completion, gold, expected):
    scores = grade_completion(completion, gold)
    assert (scores["format_ok"], scores["strict_correct"], scores["lenient_correct"]) == expected


class ScriptedPolicy(torch.nn.Module):
    """Answers each GSM8K question with a scripted completion, whatever the batch and its padding."""

    def __init__(self, tokenizer, answers: dict[str, str]):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.tokenizer, self.answers = tokenizer, answers
        self.generation_config = type("GenerationConfig", (), {"eos_token_id": tokenizer.eos_token_id})()
        self.batch_sizes = []

    def generate(self, input_ids, attention_mask, max_new_tokens, **kwargs):
        assert not kwargs.get("do_sample") and not self.training
        assert (attention_mask[:, -1] == 1).all(), "prompts must be padded on the left"
        self.batch_sizes.append(input_ids.shape[0])
        rows = []
        for ids, mask in zip(input_ids, attention_mask):
            prompt = self.tokenizer.decode(ids[mask.bool()])
            question = next(q for q in self.answers if q in prompt)
            new = self.tokenizer(self.answers[question], add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            rows.append(new[:max_new_tokens])
        width = max(map(len, rows))
        pad = self.tokenizer.pad_token_id
        new = torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # (b, new)
        return torch.cat([input_ids, new], dim=1)


@pytest.fixture(scope="module")
def six_questions():
    return load_gsm8k("test", limit=6)


def test_rates_and_records_come_back_in_dataset_order(six_questions, tmp_path):
    tokenizer = tiny_tokenizer()
    q, gold = six_questions["question"], six_questions["answer"]
    scripted = {
        q[0]: f"<think>ok</think>\n<answer>{gold[0]}</answer>",  # strict and lenient
        q[1]: f"<think>ok</think>\n<answer>{gold[1]}</answer>",  # strict and lenient
        q[2]: f"so it is {gold[2]}",  # lenient only
        q[3]: "<think>ok</think>\n<answer>-1</answer>",  # format only
        q[4]: "no idea",
        q[5]: "x" * 500,  # cut at max_new_tokens
    }
    model = ScriptedPolicy(tokenizer, scripted)
    model.train()
    path = tmp_path / "records.jsonl"
    result = gsm8k_accuracy(model, tokenizer, limit=6, batch_size=4, max_new_tokens=64, records_path=path,
                            progress=False)
    assert model.training  # put back as it was
    assert model.batch_sizes == [4, 2]
    assert (result.n, result.strict_accuracy, result.lenient_accuracy, result.format_rate) == (6, 2 / 6, 3 / 6, 3 / 6)
    assert result.truncated_rate == pytest.approx(1 / 6)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["index"] for r in lines] == list(range(6)) and [r["gold"] for r in lines] == gold
    assert lines[2]["lenient_correct"] and not lines[2]["strict_correct"]
    assert lines[5]["truncated"] and lines[5]["completion_tokens"] == 64
    assert lines[0]["completion"] == scripted[q[0]]


def test_batching_does_not_change_greedy_completions():
    model, tokenizer = load_policy(build_tiny_model("qwen2"), "full")
    one = gsm8k_accuracy(model, tokenizer, limit=5, batch_size=1, max_new_tokens=12, progress=False)
    five = gsm8k_accuracy(model, tokenizer, limit=5, batch_size=5, max_new_tokens=12, progress=False)
    assert [r["completion"] for r in one.records] == [r["completion"] for r in five.records]
    assert tokenizer.padding_side == "left"


def test_before_after_table():
    before = EvalResult(n=100, strict_accuracy=0.2, lenient_accuracy=0.4, format_rate=0.5)
    after = EvalResult(n=100, strict_accuracy=0.35, lenient_accuracy=0.45, format_rate=0.9)
    table = before_after_table(before, after)
    assert table.loc["strict accuracy", "change"] == pytest.approx(0.15)
    assert table.loc["format rate", "after"] == pytest.approx(0.9)
    low, high = wilson_interval(35, 100)
    assert table.loc["strict accuracy", "after 95% CI"] == f"[{low:.3f}, {high:.3f}]"
    assert table.loc["strict accuracy", "McNemar p"] == "needs per-problem records"  # counts alone cannot be paired
    assert list(before_after_table(before, after, metrics=["lenient accuracy"]).index) == ["lenient accuracy"]
    with pytest.raises(ValueError, match="unknown metric"):
        before_after_table(before, after, metrics=["accuracy"])
    with pytest.raises(ValueError, match="same questions"):
        before_after_table(before, EvalResult(n=50, strict_accuracy=0.1, lenient_accuracy=0.1, format_rate=0.1))


def _result(verdicts: list[bool]) -> EvalResult:
    records = [{"gold": str(i), "strict_correct": v, "lenient_correct": v, "format_ok": True}
               for i, v in enumerate(verdicts)]
    rate = sum(verdicts) / len(verdicts)
    return EvalResult(n=len(verdicts), strict_accuracy=rate, lenient_accuracy=rate, format_rate=1.0, records=records)


def test_before_after_table_pairs_the_problems():
    # 10 gained, 2 lost, 12 unchanged out of 24
    before = [False] * 10 + [True] * 2 + [True] * 6 + [False] * 6
    after = [True] * 10 + [False] * 2 + [True] * 6 + [False] * 6
    table = before_after_table(_result(before), _result(after))
    assert table.loc["strict accuracy", "McNemar p"] == f"{scipy_stats.binomtest(2, 12).pvalue:.2g}"
    assert table.loc["format rate", "McNemar p"] == "1"  # nothing changed
    assert table.loc["format rate", "change 95% CI"] == "[{:.3f}, {:.3f}]".format(*newcombe_interval([True] * 24,
                                                                                                   [True] * 24))
    low, high = newcombe_interval(before, after)
    assert table.loc["strict accuracy", "change 95% CI"] == f"[{low:.3f}, {high:.3f}]"
    assert low > 0 and paired_change(before, after).change == pytest.approx(8 / 24)


def test_a_tiny_mcnemar_p_is_shown_not_rounded_to_zero():
    # 30 gained, none lost: p = 2 x 0.5**30, about 1.9e-09; a table rounded to 4 places printed 0.0
    from labkit.evaluate import held_out_table

    table = before_after_table(_result([False] * 30 + [True] * 6), _result([True] * 36))
    assert table.loc["strict accuracy", "McNemar p"] == "1.9e-09" == f"{scipy_stats.binomtest(0, 30).pvalue:.2g}"
    summary = {"right_before": [False] * 30 + [True] * 6, "right_after": [True] * 36}
    assert held_out_table(summary).iloc[0]["McNemar p"] == "1.9e-09"


@pytest.mark.parametrize("k,n", [(0, 24), (24, 24), (3, 10), (50, 100), (1, 1319)])
def test_wilson_interval_matches_scipy(k, n):
    expected = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    low, high = wilson_interval(k, n)
    assert (low, high) == pytest.approx((expected.low, expected.high), abs=1e-9)
    assert high - low > 0  # never zero-width, also at 0 of n and n of n


def test_wilson_interval_refuses_impossible_counts():
    with pytest.raises(ValueError, match="between 0 and n"):
        wilson_interval(5, 4)
    with pytest.raises(ValueError, match="at least one"):
        wilson_interval(0, 0)


@pytest.mark.parametrize("gained,lost,same", [(10, 2, 12), (0, 0, 5), (3, 3, 0), (0, 7, 1), (25, 11, 60)])
def test_mcnemar_matches_scipy_binomtest(gained, lost, same):
    before = [False] * gained + [True] * lost + [True] * same
    after = [True] * gained + [False] * lost + [True] * same
    result = mcnemar_test(before, after)
    assert (result.gained, result.lost, result.n) == (gained, lost, gained + lost + same)
    expected = 1.0 if gained + lost == 0 else scipy_stats.binomtest(gained, gained + lost, 0.5).pvalue
    assert result.p_value == pytest.approx(expected, rel=1e-12)
    assert result.change == pytest.approx((gained - lost) / result.n)


def test_paired_tests_refuse_unpaired_input():
    with pytest.raises(ValueError, match="one verdict per problem"):
        mcnemar_test([True, False], [True])
    with pytest.raises(ValueError, match="at least one problem"):
        paired_bootstrap([], [])


def test_paired_bootstrap_is_paired():
    # Every problem flips from wrong to right: the change is exactly 1 in every resample, so the
    # interval has no width. An unpaired bootstrap (resampling before and after apart) would not.
    assert paired_bootstrap([False] * 30, [True] * 30) == (1.0, 1.0, 1.0)
    assert paired_bootstrap([False], [True]) == (1.0, 1.0, 1.0)  # one problem: scipy needs two, the answer is plain
    # Against scipy's paired percentile bootstrap of the mean difference: the same interval within resampling noise.
    before = [i % 3 == 0 for i in range(96)]
    after = [i % 2 == 0 for i in range(96)]
    change, low, high = paired_bootstrap(before, after, n_resamples=20_000)
    diff = [float(a) - float(b) for b, a in zip(before, after)]
    expected = scipy_stats.bootstrap((diff,), lambda d, axis: d.mean(axis=axis), n_resamples=20_000,
                                     method="percentile", random_state=1).confidence_interval
    assert change == pytest.approx(sum(diff) / 96)
    assert (low, high) == pytest.approx((expected.low, expected.high), abs=0.015)


@pytest.mark.parametrize("n, before, after, figures", [
    (96, lambda i: i % 3 == 0, lambda i: i % 2 == 0, (0.16666666666666666, 0.03125, 0.3020833333333333)),
    (64, lambda i: i % 3 == 0, lambda i: i % 2 == 0, (0.15625, -0.015625, 0.328125)),
    (1319, lambda i: i % 5 < 2, lambda i: i % 7 < 4, (0.17210007581501138, 0.13419257012888552, 0.2092494313874147)),
])
def test_paired_bootstrap_keeps_the_figures_of_the_hand_written_one(n, before, after, figures):
    # scipy.stats.bootstrap draws the same indices from the same seeded generator as labkit's own loop did
    # (rng.integers(0, n, (n_resamples, n))) and takes the same linear quantiles: the same floats, not just close.
    assert paired_bootstrap([before(i) for i in range(n)], [after(i) for i in range(n)]) == figures


def test_paired_change_is_the_test_and_the_interval_of_the_same_verdicts():
    before = [i % 3 == 0 for i in range(64)]
    after = [i % 2 == 0 for i in range(64)]
    paired = paired_change(before, after)
    test, (low, high) = mcnemar_test(before, after), newcombe_interval(before, after)
    assert (paired.n, paired.gained, paired.lost, paired.p_value) == (test.n, test.gained, test.lost, test.p_value)
    assert (paired.change, paired.low, paired.high) == ((sum(after) - sum(before)) / 64, low, high)
    assert paired.points == pytest.approx(100 * (sum(after) - sum(before)) / 64)
    assert paired.low < paired.change < paired.high
    with pytest.raises(ValueError, match="one verdict per problem"):
        paired_change([True], [True, False])


def test_newcombe_interval_matches_a_published_example():
    # Cavo et al. 2012 in Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency Tables" (2017), ch. 8:
    # 59 right both times, 6 right only the first time, 16 only the second, 80 neither; Newcombe's square-and-add
    # interval of the difference is -0.0621 (-0.1186 to -0.0046) (their R package contingencytables prints it).
    first = [True] * 59 + [True] * 6 + [False] * 16 + [False] * 80
    second = [True] * 59 + [False] * 6 + [True] * 16 + [False] * 80
    low, high = newcombe_interval(second, first)  # the change from "before" to "after" is first - second
    assert (round(low, 4), round(high, 4)) == (-0.1186, -0.0046)


@pytest.mark.parametrize("before, after", [
    ([False] * 30, [True] * 30),  # all gained: the percentile bootstrap gives (1, 1)
    ([True] * 30, [False] * 30),  # all lost
    ([True] * 30, [True] * 30),  # nothing changed, all right
    ([False] * 64, [False] * 64),  # nothing changed, all wrong
    ([True] * 48 + [False] * 48, [True] * 48 + [False] * 48),  # nothing changed, half right (phi = 1 uncorrected)
    ([True, False] * 32, [False, True] * 32),  # everything changed, as many gained as lost
    ([True] * 44 + [False] * 20, [True] * 64),  # tools-demo's 44 of 64 -> 64 of 64
    ([i % 3 == 0 for i in range(96)], [i % 2 == 0 for i in range(96)]),  # mixed
    ([True], [True]), ([False], [True]), ([True], [False]),  # one problem
])
def test_the_paired_interval_is_never_zero_width(before, after):
    paired = paired_change(before, after)
    assert -1.0 <= paired.low <= paired.change <= paired.high <= 1.0
    assert paired.high - paired.low > 0.01


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=200))
def test_the_paired_interval_has_width_and_holds_the_change_for_any_verdicts(pairs):
    before, after = [b for b, _ in pairs], [a for _, a in pairs]
    low, high = newcombe_interval(before, after)
    change = (sum(after) - sum(before)) / len(pairs)
    assert -1.0 <= low < high <= 1.0 and low <= change + 1e-12 and change <= high + 1e-12


def test_the_paired_interval_is_close_to_the_bootstrap_where_both_are_sound():
    before = [i % 5 < 2 for i in range(1319)]
    after = [i % 7 < 4 for i in range(1319)]
    _, boot_low, boot_high = paired_bootstrap(before, after)
    assert newcombe_interval(before, after) == pytest.approx((boot_low, boot_high), abs=0.005)


def test_pass_at_k_against_enumeration():
    from itertools import combinations

    for n, c in [(8, 0), (8, 1), (8, 3), (8, 8), (5, 2)]:
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            draws = list(combinations(samples, k))
            expected = sum(any(d) for d in draws) / len(draws)
            assert pass_at_k(n, c, k) == pytest.approx(expected), (n, c, k)
    assert pass_at_k(8, 2, 1) == pytest.approx(0.25)  # pass@1 is the plain rate
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)


def test_interval_shrinks_with_more_questions():
    assert ci95(0.5, 1319) == pytest.approx(0.027, abs=0.001)
    assert ci95(0.5, 30) == pytest.approx(0.179, abs=0.001)
    assert ci95(0.0, 10) == 0.0


# --------------------------------------------------------------------------- a learner's own question (notebook 04)


@pytest.mark.parametrize("reply, answer, says", [
    ("Tom has 4 * 5 = 20 pens.", "20", "states 20: right (MY_ANSWER is 20)"),
    ("Tom has 4 * 5 = 20 pens.", 20, "states 20: right (MY_ANSWER is 20)"),
    ("Tom has 4 * 5 * 4 = 60 pens in total.", "20",
     "states 60: wrong (MY_ANSWER is 20); its false arithmetic: 4 * 5 * 4 = 60"),
    ("Tom has 4 * 5 * 2 = 20 pens.", "20", "states 20: right (MY_ANSWER is 20); its false arithmetic: 4 * 5 * 2 = 20"),
    ("Tom has 4 * 5 = ", "20", "states no number as its answer: wrong (MY_ANSWER is 20)"),
])
def test_a_reply_to_the_learners_question_gets_its_stated_answer_and_its_false_arithmetic(reply, answer, says):
    from labkit.evaluate import answer_verdict

    assert answer_verdict(reply, answer) == says


@pytest.mark.parametrize("answer, shown", [(None, "not set"), ([20], "[20], not one number"),
                                           ("twenty", "'twenty', not one number"), ("", "'', not one number")])
def test_a_missing_or_wrong_my_answer_gets_a_sentence_not_an_exception(answer, shown):
    from labkit.evaluate import answer_verdict

    verdict = answer_verdict("Tom has 4 * 5 * 4 = 60 pens.", answer)
    assert verdict.startswith(f"states 60; not checked: MY_ANSWER is {shown} (set it in the parameters cell"), verdict
    assert verdict.endswith("; its false arithmetic: 4 * 5 * 4 = 60"), verdict  # still named without an answer


def test_held_out_scores_counts_right_replies_with_false_arithmetic():
    from labkit.evaluate import held_out_scores

    replies = [("Emma has 3 x 2 x 2 = 6 apples.", "6"),  # right by the reward, false arithmetic
               ("Emma has 3 x 2 = 6 apples.", "6"),  # right and true
               ("Tom has 4 * 5 * 4 = 60 pens.", "20"),  # wrong and false: the reward already pays 0
               ("She has 7 apples.", "7")]  # right, no equation
    records = [{"completion": text, "gold": gold, "lenient_correct": True} for text, gold in replies]
    scores = held_out_scores(EvalResult(n=4, strict_accuracy=0, lenient_accuracy=1, format_rate=1, records=records))
    assert scores["right"] == [True, True, False, True]
    assert scores["right_false_equation"] == 0.25
