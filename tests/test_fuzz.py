"""Issue 32, reliability: ``validate`` and ``train --dry-run`` against generated inputs.

``tests/test_validation.py`` draws bad values from hand-picked lists. The properties here generate them:
floats with NaN, infinities, subnormals and huge values; integers at and past every bound of
:mod:`labkit.validation`'s own tables; arbitrary text; wrong types; unknown and near-miss keys; and
batch settings whose combination TRL's sampler cannot split into groups. The property:
``validate`` accepts and the plan's ``GRPOConfig`` is built, or it raises :class:`PresetError` naming the
field and what is allowed; never another exception. ``train --dry-run`` never prints a traceback, and never
prints or writes a secret. Each property counts its cases and asserts it ran enough of them, and both ways.
"""
import dataclasses
import math
import re
import string
import tempfile
from collections import Counter

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from labkit import device as dev
from labkit.cli import train_cli
from labkit.presets import PresetError, get_preset, resolve_plan
from labkit.validation import SECRET_FIELDS, TRL_CHOICES, TRL_NUMBER_RANGES, validate
from labkit.run import reward_functions
from labkit.training import grpo_config
from labkit.validation import _NUMBER_FIELDS

CPU = dev.DeviceInfo("cpu", "x86_64 CPU (2 cores)", None, None, bf16=False, fp16=False)
TINY = get_preset("cpu-tiny")
# What a refusal says is allowed: a kind and range, a list of choices, a rule, or TRL's own refusal.
ALLOWED = re.compile(r"must|one of|at least|at most|has no argument|may not|refuses")
FUZZ = settings(max_examples=800, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def _named(field: str, message: str) -> bool:
    return field in message or repr(field) in message


def _outcome(preset, fields) -> str:
    """Return "accepted" (validate passed and the plan's GRPOConfig was built) or "refused" (a PresetError that
    names one of ``fields`` and says what is allowed); any other exception fails the property."""
    try:
        validate(preset, CPU)
    except PresetError as exc:
        message = str(exc)
        assert any(_named(f, message) for f in fields), (fields, message)
        assert ALLOWED.search(message), message
        return "refused"
    plan = resolve_plan(preset, CPU)
    arguments = dict(plan.config)  # what build_run passes to grpo_config, as it passes it
    arguments["reward_weights"] = reward_functions(preset)[1]
    with tempfile.TemporaryDirectory() as folder:
        args = grpo_config(folder, device=CPU, precision=plan.precision, **arguments)
    assert args.generation_batch_size % args.num_generations == 0  # TRL's sampler splits it into whole groups
    return "accepted"


def _edges(low, high, kind):
    """Return the values at and just past a range's bounds (as ints for whole numbers, floats too otherwise)."""
    values = [low - 1, low, low + 1, high - 1, high, high + 1, -high, 10 * high]
    if kind != "a whole number":
        values += [math.nextafter(float(low), -math.inf), math.nextafter(float(low), math.inf),
                   math.nextafter(float(high), math.inf), float(low), float(high)]
    return values


FLOATS = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
HUGE_INTS = st.integers(min_value=-(10**400), max_value=10**400)  # past float's range: float() overflows
NUMBERS = FLOATS | st.integers() | HUGE_INTS | st.sampled_from([5e-324, -5e-324, 1e308, -0.0, 2**63, -(2**63)])
WRONG_TYPES = (st.text(max_size=12) | st.none() | st.booleans() | st.lists(st.integers(), max_size=3)
               | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2) | st.complex_numbers(max_magnitude=10)
               | st.binary(max_size=4))


def _values_for(low, high, kind):
    return st.sampled_from(_edges(low, high, kind)) | NUMBERS | WRONG_TYPES


def _run(prop, counts, minimum):
    prop()
    print(f"{prop.__name__}: {dict(counts)}")  # pytest -s shows how many cases ran, and how they ended
    assert counts["accepted"] + counts["refused"] >= minimum, counts
    assert counts["accepted"] and counts["refused"], counts  # both ways: a property that only refuses proves little


def test_preset_numbers_at_and_past_every_bound():
    counts = Counter()

    @FUZZ
    @given(data=st.data())
    def numbers(data):
        field = data.draw(st.sampled_from(sorted(_NUMBER_FIELDS)), label="field")
        kind, low, high, _ = _NUMBER_FIELDS[field]
        value = data.draw(_values_for(low, high, kind), label="value")
        base = TINY.replace(environment="calculator") if field == "max_tool_calling_iterations" else TINY  # a tool recipe
        counts[_outcome(base.replace(**{field: value}), [field])] += 1

    _run(numbers, counts, 700)


def test_config_numbers_choices_and_types():
    counts = Counter()
    booleans = ("mask_truncated_completions", "scale_rewards", "use_liger_kernel")
    others = ("steps_per_generation", "num_train_epochs", "logging_steps", "top_entropy_quantile")

    @FUZZ
    @given(data=st.data())
    def options(data):
        key = data.draw(st.sampled_from(sorted({*TRL_NUMBER_RANGES, *TRL_CHOICES, *booleans, *others})), label="key")
        if key in TRL_NUMBER_RANGES:
            kind, low, high, _ = TRL_NUMBER_RANGES[key]
            values = _values_for(low, high, kind)
        elif key in TRL_CHOICES:
            values = st.sampled_from(TRL_CHOICES[key]) | st.text(max_size=12) | WRONG_TYPES
        else:
            values = NUMBERS | WRONG_TYPES | st.sampled_from([1, 2, 4, 0.5, True, False])
        value = data.draw(values, label="value")
        counts[_outcome(TINY.replace(**{key: value}), [key])] += 1

    _run(options, counts, 700)


def _near_miss(data, key: str) -> str:
    i = data.draw(st.integers(0, len(key) - 1), label="position")
    change = data.draw(st.sampled_from(["drop", "double", "swap", "upper", "plural", "dash"]), label="change")
    missed = {"drop": key[:i] + key[i + 1:], "double": key[:i] + key[i] + key[i:],
              "swap": key[:i] + key[i + 1:i + 2] + key[i:i + 1] + key[i + 2:], "upper": key.upper(),
              "plural": key + "s", "dash": key.replace("_", "-")}[change]
    return missed


def test_unknown_and_near_miss_keys_are_refused_by_name():
    from trl import GRPOConfig

    grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    preset_fields = {f.name for f in dataclasses.fields(TINY)}
    counts = Counter()

    @FUZZ
    @given(data=st.data())
    def keys(data):
        where = data.draw(st.sampled_from(["preset", "config"]), label="where")
        known = sorted(preset_fields if where == "preset" else {*TRL_NUMBER_RANGES, *TRL_CHOICES, "num_iterations"})
        key = data.draw(st.sampled_from(known), label="known")
        key = data.draw(st.one_of(st.just(_near_miss(data, key)), st.text(min_size=1, max_size=16)), label="key")
        assume(key not in preset_fields | grpo_fields)  # neither kind of name: a GRPOConfig argument TRL lacks
        value = data.draw(NUMBERS | WRONG_TYPES, label="value")
        counts[_outcome(TINY.replace(**{key: value}), [key])] += 1

    keys()
    print(f"keys: {dict(counts)}")
    assert counts["refused"] >= 700 and not counts["accepted"], counts  # no unknown key is ever accepted


def test_batch_combinations_split_into_groups_or_are_refused():
    """Two or more fields at once: the generation batch must split into groups of num_generations, the prompts must
    fill a batch, epsilon_high >= epsilon, and prompt + completion must fit the model's context."""
    counts = Counter()

    @settings(FUZZ, max_examples=1000)
    @given(batch=st.integers(-1, 16), accumulation=st.integers(-1, 8), generations=st.integers(-1, 16),
           steps_per_generation=st.none() | st.integers(-1, 8), train_limit=st.none() | st.integers(0, 80),
           epsilon=st.none() | st.sampled_from([0.1, 0.2, 0.3]), epsilon_high=st.none() | st.sampled_from([0.1, 0.28]),
           completion=st.sampled_from([8, 32, 4000, 10**6]))
    def combinations(batch, accumulation, generations, steps_per_generation, train_limit, epsilon, epsilon_high,
                     completion):
        options = {k: v for k, v in dict(steps_per_generation=steps_per_generation, epsilon=epsilon,
                                         epsilon_high=epsilon_high).items() if v is not None}
        preset = TINY.replace(per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                              num_generations=generations, train_limit=train_limit, max_completion_length=completion,
                              **options)
        fields = ["per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "train_limit",
                  "max_completion_length", *options]
        outcome = _outcome(preset, fields)
        groups_split = (batch * (steps_per_generation or accumulation)) % max(generations, 1) == 0
        if outcome == "accepted":
            assert groups_split and generations >= 2
        counts[outcome] += 1
        counts["split" if groups_split else "unsplittable"] += 1

    _run(combinations, counts, 900)
    assert counts["unsplittable"] >= 150, counts  # the combination that matters was generated often


# ----------------------------------------------------------------------------- the command line


VALID = {"--set": ["lora_rank=4", "learning_rate=1e-4", "beta=0", "temperature=0.7", "num_generations=2",
                   "max_steps=1", "train_limit=none", "lora_alpha=8.5", "target_modules=q_proj,v_proj", "seed=7",
                   "save_strategy=no", "activation_checkpointing=true", "description=", "reward_weights=1,0.5,0.5"],
         "--config": ["loss_type=dr_grpo", "num_iterations=2", "epsilon=0.1", "top_p=1", "scale_rewards=none",
                      "mask_truncated_completions=true", "steps_per_generation=4", "epsilon_high=0.28"]}
SECRET = st.text(string.ascii_letters + string.digits, min_size=16, max_size=24).map(lambda s: "hf_" + s)


def test_dry_run_never_prints_a_traceback_or_a_secret(capsys, tmp_path):
    """``--set`` / ``--config`` with generated keys and text (the CLI reads each word with parse_value), sometimes with a
    secret among them: exit 0 or 2, one error line, no traceback, the secret nowhere in the output or the folder."""
    fields = sorted({*(f.name for f in dataclasses.fields(TINY)), *TRL_NUMBER_RANGES, *TRL_CHOICES})
    words = (st.text(max_size=12) | st.sampled_from(["nan", "inf", "-inf", "1e999", "-0", "1_0", "none", "true", "0",
                                                     "4", "0.5", "1" + "0" * 400, "5e-324", "a,b", ","])
             | NUMBERS.map(repr) | st.integers(-5, 5000).map(str))
    counts = Counter()
    output_dir = tmp_path / "run"

    @settings(FUZZ, max_examples=800)
    @given(data=st.data())
    def command_line(data):
        # One --set and one --config, as a user writes them: argparse keeps only the last of a repeated option.
        pairs = {"--set": [], "--config": []}
        for _ in range(data.draw(st.integers(1, 3), label="pairs")):
            option = data.draw(st.sampled_from(sorted(pairs)), label="option")
            if data.draw(st.booleans(), label="a valid pair"):  # so that some commands pass and show the plan
                pairs[option].append(data.draw(st.sampled_from(VALID[option]), label="pair"))
                continue
            key = data.draw(st.sampled_from(fields) | st.text(min_size=1, max_size=10), label="key")
            pairs[option].append(f"{key}={data.draw(words, label='text')}")
        secret = data.draw(SECRET, label="secret") if data.draw(st.integers(0, 3), label="with a secret") == 0 else None
        if secret:
            key = data.draw(st.sampled_from(sorted(SECRET_FIELDS)), label="secret field")
            at = data.draw(st.integers(0, len(pairs["--config"])), label="at")
            pairs["--config"].insert(at, f"{key}={secret}")
        argv = [word for option, words in pairs.items() if words for word in (option, *words)]
        try:
            code = train_cli(["--preset", "cpu-tiny", "--dry-run", "--output-dir", str(output_dir), *argv])
        except SystemExit as exc:  # a word argparse reads as an option ("-x=1"): its usage message, exit 2
            out, err = capsys.readouterr()
            assert exc.code == 2 and "usage:" in err and "Traceback" not in err, (argv, err)
            assert not secret or secret not in out + err, (argv, err)
            counts["usage"] += 1
            return
        out, err = capsys.readouterr()
        assert code in (0, 2), (argv, code, err)
        assert "Traceback" not in out + err, (argv, err)
        if code == 2:
            errors = [line for line in err.splitlines() if line.startswith("error:")]
            assert len(errors) == 1, (argv, err)
        if secret:
            assert code == 2 and secret not in out + err, (argv, out, err)
            counts["secret"] += 1
        written = [p for p in tmp_path.rglob("*") if p.is_file()]
        assert not written, written  # a dry run writes nothing, so no secret either
        counts["accepted" if code == 0 else "refused"] += 1

    _run(command_line, counts, 650)
    assert counts["secret"] >= 100, counts
