"""Hugging Face causal LMs whose training loss lossfuse computes from the final hidden states, never making the
N x V logits (nor their float32 copy): one call per model, or per class.

    import lossfuse.integrations.transformers as lft
    lft.apply(model)                  # this model; lft.apply(LlamaForCausalLM): every instance of the class
    out = model(input_ids, labels=labels)          # out.loss by lossfuse.nn.functional.linear_cross_entropy
    lft.unapply(model)

With labels, the patched forward runs the model's own forward without them, catches the lm_head's input and returns
transformers' ForCausalLMLoss of it: the label shift (or `shift_labels`), `ignore_index` (-100), the mean over
unignored tokens or the sum over `num_items_in_batch`, the family's logit transform (Gemma-2/3 softcapping, Cohere's
logit_scale, Granite's logits_scaling), tied embeddings and a head bias, autocast; the loss is float32 as
transformers' is. Logits: None in training (`model.training`) when labels are given (in a tuple output an empty
(..., 0, V) tensor, so the positions hold), computed otherwise (return_logits=True / False at apply or per call
overrides). Without labels the forward is the model's own.
The families served are FAMILIES' keys; anything else (another class, a subclass that overrides forward, a head that
is not a Linear over config.vocab_size, a model.loss_function other than ForCausalLMLoss, a device other than the
CPU and, in a build with the CUDA route, CUDA) is refused with an error naming what differs. Proven by
python/tests/test_transformers.py (loss and every parameter's gradient against the unpatched model, on the CPU and on
CUDA). One forward at a time per model: the lm_head hook is registered per call.
"""

import functools
import inspect
import types

import torch

from .. import _patch
from .._linear_cross_entropy import linear_cross_entropy


def _plain(model):
    return 1.0, 0.0


def _softcapped(model):
    return 1.0, float(model.config.final_logit_softcapping or 0.0)


def _cohere(model):
    return float(model.logit_scale), 0.0


def _granite(model):
    return 1.0 / float(model.config.logits_scaling), 0.0


# The causal LM classes whose forward is: base model -> lm_head(hidden_states[, logits_to_keep]) -> a logit
# transform -> self.loss_function(logits, labels, ...). Value: model -> (logit_scale, softcap) of that transform.
FAMILIES = {
    "LlamaForCausalLM": _plain, "MistralForCausalLM": _plain, "Qwen2ForCausalLM": _plain,
    "Qwen3ForCausalLM": _plain, "GemmaForCausalLM": _plain, "Gemma2ForCausalLM": _softcapped,
    "Gemma3ForCausalLM": _softcapped, "GPT2LMHeadModel": _plain, "PhiForCausalLM": _plain,
    "Phi3ForCausalLM": _plain, "Olmo2ForCausalLM": _plain, "CohereForCausalLM": _cohere,
    "GraniteForCausalLM": _granite,
}
_MODES = ("auto", True, False)


def _valid_mode(mode):
    return mode is True or mode is False or mode == "auto"


def _family_class(cls):
    """The transformers class in cls's MRO that FAMILIES serves, provided no class below it overrides forward."""
    for base in cls.__mro__:
        if base.__name__ in FAMILIES and base.__module__.startswith("transformers."):
            below = cls.__mro__[:cls.__mro__.index(base)]
            if any("forward" in vars(c) and not _is_patch(vars(c)["forward"]) for c in below):
                raise TypeError(f"lossfuse: model: {cls.__name__} overrides {base.__name__}.forward; lossfuse serves "
                                "the transformers forward only")
            return base
    raise TypeError(f"lossfuse: model: expected a causal LM of the families {sorted(FAMILIES)}, got {cls.__name__}")


def _is_patch(fn):
    return hasattr(fn, "_lossfuse_original")


def _unpatched(fn):
    return getattr(fn, "_lossfuse_original", fn)


def _check(model, hidden=None):
    """(logit_scale, softcap) of model's family; raises where lossfuse would not compute the model's own loss."""
    family = _family_class(type(model))
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"lossfuse: model: expected the output embeddings to be a torch.nn.Linear, got "
                        f"{type(head).__name__}")
    vocab = model.config.vocab_size
    if head.out_features != vocab:
        raise ValueError(f"lossfuse: model: expected the lm_head's out_features to equal config.vocab_size, {vocab}, "
                         f"got {head.out_features}")
    from transformers.loss.loss_utils import ForCausalLMLoss
    loss_function = getattr(model, "loss_function", ForCausalLMLoss)
    if loss_function is not ForCausalLMLoss:
        raise ValueError(f"lossfuse: model.loss_function: expected transformers' ForCausalLMLoss, got "
                         f"{getattr(loss_function, '__name__', loss_function)!r}")
    device = hidden.device if hidden is not None else head.weight.device
    served = [d for d in _patch.devices("linear_cross_entropy") if d != "meta"]
    if device.type not in served:
        raise NotImplementedError(f"lossfuse: model: expected a model on a device lossfuse computes this loss on "
                                  f"({', '.join(served)}), got {device} (lossfuse.integrations.transformers."
                                  "unapply(model) restores transformers' loss)")
    return FAMILIES[family.__name__](model)


def _loss(model, hidden, labels, kwargs):
    """transformers' ForCausalLMLoss of lm_head(hidden), by linear_cross_entropy."""
    scale, softcap = _check(model, hidden)
    ignore_index = kwargs.get("ignore_index", -100)
    shift = kwargs.get("shift_labels")
    if shift is None:
        shift = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    if hidden.shape[:-1].numel() != shift.numel():
        raise ValueError(f"lossfuse: labels: expected one label per position of the lm_head's input, shape "
                         f"{tuple(hidden.shape[:-1])}, got shape {tuple(shift.shape)} (logits_to_keep must be 0 "
                         "with labels)")
    items = kwargs.get("num_items_in_batch")
    head = model.get_output_embeddings()
    loss = linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), head.weight,
                                shift.reshape(-1).to(hidden.device), linear_bias=head.bias,
                                ignore_index=ignore_index, reduction="mean" if items is None else "sum",
                                logit_scale=scale, softcap=softcap, loss_dtype=torch.float32)
    if items is not None:
        loss = loss / (items.to(loss.device) if torch.is_tensor(items) else items)
    return loss


def _patched(original, return_logits):
    """forward computing the loss from the lm_head's input; original is the transformers class's forward."""
    names = list(inspect.signature(original).parameters)
    labels_at = names.index("labels") - 1 if "labels" in names else None  # position among args after self

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        mode = kwargs.pop("return_logits", return_logits)
        if not _valid_mode(mode):
            raise ValueError(f"lossfuse: return_logits: expected 'auto', True or False, got {mode!r}")
        if labels_at is not None and len(args) > labels_at:
            labels, args = args[labels_at], args[:labels_at] + (None,) + args[labels_at + 1:]
        else:
            labels = kwargs.pop("labels", None)
        if labels is None:
            return original(self, *args, **kwargs)
        _check(self)
        keep = (not self.training) if mode == "auto" else mode
        wanted_dict = kwargs.pop("return_dict", None)
        if wanted_dict is None:
            wanted_dict = getattr(self.config, "return_dict", True)
        caught = []

        def catch(module, inputs):
            caught.append(inputs[0])
            if not keep:  # the head computes no row: logits (..., 0, V)
                return (inputs[0].narrow(-2, 0, 0),) + tuple(inputs[1:])
            return None

        handle = self.get_output_embeddings().register_forward_pre_hook(catch)
        try:
            out = original(self, *args, return_dict=True, **kwargs)
        finally:
            handle.remove()
        if len(caught) != 1:
            raise RuntimeError(f"lossfuse: model: expected the lm_head to run once per forward, it ran {len(caught)} "
                               "times")
        fields = dict(out.items())
        fields["loss"] = _loss(self, caught[0], labels, kwargs)
        if not keep and wanted_dict:  # a tuple keeps its logits slot (an empty (..., 0, V) tensor), so positions hold
            fields.pop("logits", None)
        out = type(out)(**fields)
        return out if wanted_dict else out.to_tuple()

    forward._lossfuse_original = original
    return forward


def apply(model, *, return_logits="auto"):
    """Routes the training loss of `model` (an instance: that model; a class: every instance of it) to lossfuse.
    return_logits: 'auto' (logits None when training with labels), True (always made), False (never with labels).
    Applying again replaces the earlier patch. Raises TypeError / ValueError for a model lossfuse does not serve."""
    if not _valid_mode(return_logits):
        raise ValueError(f"lossfuse: return_logits: expected 'auto', True or False, got {return_logits!r}")
    if isinstance(model, type):
        _family_class(model)  # checks before anything changes: a refused re-apply keeps the earlier patch
        unapply(model)
        own = "forward" in vars(model)  # a subclass inheriting forward gets its attribute removed by unapply
        patch = _patched(_unpatched(model.forward), return_logits)
        patch._lossfuse_own = own
        model.forward = patch
    else:
        _check(model)
        unapply(model)
        model.forward = types.MethodType(_patched(_unpatched(type(model).forward), return_logits), model)
    return model


def unapply(model):
    """Undoes apply() on this instance or class (a no-op where it was not applied)."""
    if isinstance(model, type):
        patch = vars(model).get("forward")
        if _is_patch(patch):
            if getattr(patch, "_lossfuse_own", True):
                model.forward = patch._lossfuse_original
            else:
                del model.forward
    elif _is_patch(getattr(vars(model).get("forward"), "__func__", None)):
        del model.forward
    return model


def is_applied(model):
    """Whether the forward model runs is lossfuse's (applied to the instance or to its class)."""
    forward = getattr(model, "forward", None)
    return _is_patch(getattr(forward, "__func__", forward))
