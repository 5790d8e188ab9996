"""lossfuse.integrations.transformers on tiny causal LMs of every family it serves, built from their configs (no
download): the patched model's loss and every parameter's gradient against the unpatched model's (float32: to
float32 rounding; bf16 weights and autocast: lossfuse's error against a float64 model no larger than transformers'),
gradient accumulation with num_items_in_batch, padding, logits kept or not, tuples, class-level patching, refusals."""

import pytest
import torch

transformers = pytest.importorskip("transformers")  # the GPU check's hosts may lack it: reported as a skip

import lossfuse.integrations.transformers as lft

V, H, T, B = 96, 32, 12, 3
_DECODER = dict(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager")
# family class -> its config's keyword arguments (Gemma-2 with a softcap the logits reach, Granite with a scaling,
# Phi with its bias on the head, Qwen2 untied, Llama tied; no dropout: the two runs must see the same model)
CONFIGS = {
    "LlamaForCausalLM": dict(_DECODER, tie_word_embeddings=True),
    "MistralForCausalLM": dict(_DECODER),
    "Qwen2ForCausalLM": dict(_DECODER, tie_word_embeddings=False),
    "Qwen3ForCausalLM": dict(_DECODER, head_dim=8),
    "GemmaForCausalLM": dict(_DECODER, head_dim=8),
    "Gemma2ForCausalLM": dict(_DECODER, head_dim=8, final_logit_softcapping=0.5, query_pre_attn_scalar=8),
    "Gemma3ForCausalLM": dict(_DECODER, head_dim=8, final_logit_softcapping=0.5, query_pre_attn_scalar=8),
    "GPT2LMHeadModel": dict(vocab_size=V, n_embd=H, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                            attn_implementation="eager"),
    "PhiForCausalLM": dict(_DECODER),
    "Phi3ForCausalLM": dict(_DECODER, pad_token_id=0),
    "Olmo2ForCausalLM": dict(_DECODER),
    "CohereForCausalLM": dict(_DECODER, logit_scale=0.5),
    "GraniteForCausalLM": dict(_DECODER, logits_scaling=4.0),
}
FAMILIES = sorted(CONFIGS)


def tiny(name, dtype=torch.float32, seed=0, **overrides):
    cls = getattr(transformers, name)
    config = cls.config_class(**{**CONFIGS[name], **overrides})
    torch.manual_seed(seed)
    model = cls(config).to(dtype)
    with torch.no_grad():  # weights large enough that the logits spread (and reach a softcap)
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    return model.train()


def batch(seed=0, rows=B):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (rows, T), generator=g)
    mask = torch.ones(rows, T, dtype=torch.long)
    mask[0, -4:] = 0  # right padding in the first row
    labels = ids.clone()
    labels[mask == 0] = -100
    labels[1, :3] = -100  # an unlabelled prompt
    return ids, mask, labels


def loss_and_grads(model, ids, mask, labels, **kw):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask, labels=labels, **kw)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def compare(model, device="cpu", **kw):
    """(unpatched, patched) (output, grads) of the same model and batch (on `device`)."""
    ids, mask, labels = (a.to(device) for a in batch())
    lft.unapply(model)
    ref = loss_and_grads(model, ids, mask, labels, **kw)
    lft.apply(model)
    try:
        got = loss_and_grads(model, ids, mask, labels, **kw)
    finally:
        lft.unapply(model)
    return ref, got


def assert_grads_close(ref, got, rtol, atol):
    assert ref.keys() == got.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("name", FAMILIES)
def test_float32_loss_and_every_gradient_match_the_unpatched_model(name):
    model = tiny(name)
    (ref_out, ref_grads), (out, grads) = compare(model)
    assert out.loss.dtype == torch.float32
    assert out.logits is None  # training with labels: never made
    assert ref_out.loss.item() > 0.5  # not a degenerate loss
    torch.testing.assert_close(out.loss, ref_out.loss, rtol=2e-6, atol=0)
    assert_grads_close(ref_grads, grads, rtol=1e-4, atol=1e-6)
    assert len(grads) == len(list(model.parameters()))  # the head (or the tied embedding) got its gradient


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "Gemma2ForCausalLM", "CohereForCausalLM", "GPT2LMHeadModel"])
def test_the_logits_are_never_made_in_training(name):
    model = tiny(name)
    lft.apply(model)
    shapes = []
    model.get_output_embeddings().register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
    ids, mask, labels = batch()
    model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    assert shapes == [(B, 0, V)]


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "Gemma2ForCausalLM",
                                  "GPT2LMHeadModel"])
def test_num_items_in_batch_gradient_accumulation(name):
    """Two micro-batches summed over the tokens of both, as transformers' Trainer does."""
    model = tiny(name)
    micro = [batch(seed) for seed in (1, 2)]
    items = sum(int((lab[:, 1:] != -100).sum()) for _, _, lab in micro)

    def accumulate():
        model.zero_grad(set_to_none=True)
        total = 0.0
        for ids, mask, labels in micro:
            loss = model(input_ids=ids, attention_mask=mask, labels=labels,
                         num_items_in_batch=torch.tensor(items)).loss
            loss.backward()
            total += loss.item()
        return total, {n: p.grad.clone() for n, p in model.named_parameters()}

    ref_total, ref_grads = accumulate()
    lft.apply(model)
    total, grads = accumulate()
    assert total == pytest.approx(ref_total, rel=2e-6)
    assert_grads_close(ref_grads, grads, rtol=1e-4, atol=1e-6)
    # and the accumulated gradient is the gradient of the one large batch's mean
    ids, mask, labels = (torch.cat(parts) for parts in zip(*micro))
    _, whole = loss_and_grads(model, ids, mask, labels)
    assert_grads_close(whole, grads, rtol=1e-4, atol=1e-6)


def test_shift_labels_and_ignore_index_are_the_models():
    model = tiny("Qwen2ForCausalLM")
    # targets unrelated to the labels' shift (ignored at 7): a forward that shifted the labels would differ
    shift = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(5))
    shift[0, :4] = 7
    (ref, ref_grads), (got, grads) = compare(model, shift_labels=shift, ignore_index=7)
    torch.testing.assert_close(got.loss, ref.loss, rtol=2e-6, atol=0)
    assert_grads_close(ref_grads, grads, rtol=1e-4, atol=1e-6)


def errors_against_float64(name, run):
    """|loss - float64 model's loss| and max |grad - float64 grad| of run(model) for bf16 unpatched and patched."""
    exact = tiny(name, torch.float64)
    ids, mask, labels = batch()
    ref_out, ref_grads = loss_and_grads(exact, ids, mask, labels)
    model = tiny(name)
    model.load_state_dict(exact.state_dict())
    errors = []
    for patched in (False, True):
        (lft.apply if patched else lft.unapply)(model)
        out, grads = run(model, ids, mask, labels)
        errors.append((abs(out.loss.double().cpu() - ref_out.loss).item(),
                       max(((grads[n].double().cpu() - ref_grads[n]).abs().max() / ref_grads[n].abs().max()).item()
                           for n in ref_grads)))
        assert out.loss.dtype == torch.float32
    lft.unapply(model)
    return errors


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "Gemma2ForCausalLM", "Qwen2ForCausalLM"])
def test_bf16_weights_no_less_exact_than_transformers(name):
    def run(model, ids, mask, labels):
        return loss_and_grads(model.to(torch.bfloat16), ids, mask, labels)

    (hf_loss, hf_grad), (our_loss, our_grad) = errors_against_float64(name, run)
    assert our_loss <= 1.25 * hf_loss + 1e-6  # both carry the same bf16 body; the head's part is ours
    assert our_grad <= 1.25 * hf_grad + 1e-6
    assert our_grad < 0.1


CUDA = torch.cuda.is_available() and torch.ops.lossfuse._has_cuda()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device and lossfuse's CUDA backend")
@pytest.mark.parametrize("name", ["LlamaForCausalLM", "Gemma2ForCausalLM", "Qwen2ForCausalLM", "PhiForCausalLM",
                                  "GPT2LMHeadModel"])
def test_cuda_loss_and_every_gradient_match_the_unpatched_model(name):
    """The model on CUDA: float32 against transformers' own loss on the same device; bf16 weights no less exact than
    transformers' against the float64 model on the CPU."""
    model = tiny(name).cuda()
    (ref_out, ref_grads), (out, grads) = compare(model, device="cuda")
    assert out.loss.device.type == "cuda" and out.logits is None
    torch.testing.assert_close(out.loss, ref_out.loss, rtol=1e-5, atol=0)
    assert_grads_close(ref_grads, grads, rtol=1e-4, atol=1e-5)
    assert len(grads) == len(list(model.parameters()))

    def run(model, ids, mask, labels):
        return loss_and_grads(model.to("cuda", torch.bfloat16), ids.cuda(), mask.cuda(), labels.cuda())

    (hf_loss, hf_grad), (our_loss, our_grad) = errors_against_float64(name, run)
    assert our_loss <= 1.25 * hf_loss + 1e-6
    assert our_grad <= 1.25 * hf_grad + 1e-6


def test_autocast_bf16_no_less_exact_than_transformers():
    def run(model, ids, mask, labels):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return loss_and_grads(model, ids, mask, labels)

    (hf_loss, hf_grad), (our_loss, our_grad) = errors_against_float64("LlamaForCausalLM", run)
    assert our_loss <= 1.25 * hf_loss + 1e-6
    assert our_grad <= 1.25 * hf_grad + 1e-6


def test_logits_in_eval_and_when_asked():
    model = tiny("Gemma2ForCausalLM")
    ids, mask, labels = batch()
    ref = model.eval()(input_ids=ids, attention_mask=mask, labels=labels)
    lft.apply(model)
    got = model(input_ids=ids, attention_mask=mask, labels=labels)  # eval: logits made, loss by lossfuse
    torch.testing.assert_close(got.logits, ref.logits, rtol=0, atol=0)
    torch.testing.assert_close(got.loss, ref.loss, rtol=2e-6, atol=0)
    model.train()
    assert model(input_ids=ids, labels=labels, return_logits=True).logits.shape == (B, T, V)
    lft.apply(model, return_logits=True)
    assert model(input_ids=ids, labels=labels).logits.shape == (B, T, V)
    assert model(input_ids=ids, labels=labels, return_logits=False).logits is None
    # no labels: the model's own forward, logits_to_keep included
    assert model(input_ids=ids, logits_to_keep=1).logits.shape == (B, 1, V)


def test_tuple_output_has_the_loss_first_and_keeps_its_positions():
    model = tiny("MistralForCausalLM")
    ids, mask, labels = batch()
    ref = model(input_ids=ids, labels=labels, return_dict=False, use_cache=False, output_hidden_states=True)
    lft.apply(model, return_logits=True)
    got = model(input_ids=ids, labels=labels, return_dict=False, use_cache=False, output_hidden_states=True)
    assert isinstance(got, tuple) and len(got) == len(ref)
    torch.testing.assert_close(got[0], ref[0], rtol=2e-6, atol=0)
    torch.testing.assert_close(got[1], ref[1], rtol=0, atol=0)
    lft.apply(model)  # training: no logits made, an empty tensor in their slot
    got = model(input_ids=ids, labels=labels, return_dict=False, use_cache=False, output_hidden_states=True)
    assert len(got) == len(ref) and got[1].shape == (B, 0, V)
    torch.testing.assert_close(got[0], ref[0], rtol=2e-6, atol=0)
    torch.testing.assert_close(got[2][-1], ref[2][-1], rtol=0, atol=0)  # the hidden states where they were


def test_class_level_apply_and_unapply():
    cls = transformers.Olmo2ForCausalLM
    model = tiny("Olmo2ForCausalLM")
    ids, mask, labels = batch()
    ref = model(input_ids=ids, labels=labels).loss
    lft.apply(cls)
    try:
        assert lft.is_applied(model) and lft.is_applied(tiny("Olmo2ForCausalLM"))
        out = model(input_ids=ids, labels=labels)
        assert out.logits is None
        torch.testing.assert_close(out.loss, ref, rtol=2e-6, atol=0)
        lft.apply(model, return_logits=True)  # an instance patch over a class patch wraps the original forward
        assert model(input_ids=ids, labels=labels).logits is not None
        lft.unapply(model)
        assert model(input_ids=ids, labels=labels).logits is None
    finally:
        lft.unapply(cls)
    assert not lft.is_applied(model)
    assert model(input_ids=ids, labels=labels).logits.shape == (B, T, V)


def test_unapply_restores_and_apply_twice_is_one_patch():
    model = tiny("LlamaForCausalLM")
    lft.apply(model)
    lft.apply(model)
    assert model.forward.__func__._lossfuse_original is type(model).forward
    lft.unapply(model)
    assert not lft.is_applied(model) and "forward" not in vars(model)


def test_refusals_name_what_differs():
    with pytest.raises(TypeError, match="families"):
        lft.apply(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="families"):
        lft.apply(transformers.BertForMaskedLM)

    class Custom(transformers.LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    with pytest.raises(TypeError, match="overrides LlamaForCausalLM.forward"):
        lft.apply(Custom)

    class Plain(transformers.LlamaForCausalLM):
        pass

    lft.apply(Plain)  # a subclass that keeps the forward is served
    lft.unapply(Plain)
    assert "forward" not in vars(Plain)  # inherited again, so it can be applied again
    lft.apply(Plain)
    lft.unapply(Plain)

    model = lft.apply(tiny("LlamaForCausalLM"))
    model.loss_function = lambda *a, **k: 0
    with pytest.raises(ValueError, match="ForCausalLMLoss"):
        lft.apply(model, return_logits=True)
    assert lft.is_applied(model)  # a refused re-apply keeps the earlier patch
    with pytest.raises(ValueError, match="return_logits"):
        lft.apply(tiny("LlamaForCausalLM"), return_logits=0)

    model = tiny("LlamaForCausalLM")
    model.loss_function = lambda *a, **k: 0
    with pytest.raises(ValueError, match="ForCausalLMLoss"):
        lft.apply(model)

    with pytest.raises(NotImplementedError, match=r"\(cpu.*\), got meta"):  # shapes only: nothing to compute
        lft.apply(tiny("LlamaForCausalLM").to("meta"))

    model = tiny("LlamaForCausalLM")
    model.lm_head = torch.nn.Linear(H, V + 1, bias=False)
    with pytest.raises(ValueError, match="vocab_size, 96, got 97"):
        lft.apply(model)

    model = lft.apply(tiny("LlamaForCausalLM"))
    ids, _, labels = batch()
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(input_ids=ids, labels=labels, logits_to_keep=2)
    with pytest.raises(ValueError, match="return_logits"):
        model(input_ids=ids, labels=labels, return_logits="yes")
    with pytest.raises(IndexError):
        model(input_ids=ids, labels=torch.full_like(labels, V))


def test_finetune_example_runs_and_its_two_curves_coincide(tmp_path):
    """examples/python/finetune_llama.py at a toy size: both variants train, from the same start to the same losses."""
    import csv
    import pathlib
    import subprocess
    import sys
    script = pathlib.Path(__file__).parents[2] / "examples" / "python" / "finetune_llama.py"
    out = tmp_path / "run"
    subprocess.run([sys.executable, str(script), "--steps", "6", "--warmup", "1", "--vocab", "3000", "--hidden", "64",
                    "--layers", "1", "--seq", "32", "--lr", "1e-2", "--out", str(out)], check=True,
                   capture_output=True)
    with open(f"{out}.csv") as f:
        rows = list(csv.DictReader(f))
    curves = {v: [float(r["loss"]) for r in rows if r["variant"] == v] for v in ("transformers", "lossfuse")}
    assert len(curves["lossfuse"]) == len(curves["transformers"]) == 6
    assert curves["lossfuse"] == pytest.approx(curves["transformers"], rel=1e-5)
    assert curves["lossfuse"][-1] < curves["lossfuse"][0]  # it trains
    assert "step peak memory" in (tmp_path / "run.md").read_text()
