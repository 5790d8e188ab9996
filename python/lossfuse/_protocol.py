"""The public functions' __torch_function__ protocol: a tensor subclass or function mode sees lossfuse's functions as
it sees torch's."""

import functools

import torch


def overridable(fn):
    """torch's __torch_function__ protocol for a public loss function, as torch.nn.functional's own have: where an
    operand overrides it (a tensor subclass, a torch.fx tracing proxy) or a torch function mode is active, the call
    goes to handle_torch_function, which hands the function and its arguments to the override or mode."""
    @functools.wraps(fn)
    def public(*args, **kwargs):
        operands = (*args, *kwargs.values()) if kwargs else args
        # (torch's subclass handling switched off, as inside a subclass's super().__torch_function__: no override;
        # Dynamo's has_torch_function does not see that switch)
        if torch._C._is_torch_function_enabled() and _has_torch_function(operands):
            relevant = tuple(a for a in operands if hasattr(type(a), "__torch_function__"))
            return torch.overrides.handle_torch_function(public, relevant, *args, **kwargs)
        return fn(*args, **kwargs)

    return public


_has_torch_function = torch.overrides.has_torch_function
