"""Decoder ops other than attention: RMSNorm and LayerNorm (with fused residual), activations, rotary, linear.

Each public function dispatches through `kernels.dispatch` to its Triton kernel
or its torch reference for the tensor's device and dtype. Signatures and shapes:
docs/INTERFACES.md.
"""

from vlchat.kernels.ops.activation import gelu_tanh_and_mul, quick_gelu, silu_and_mul
from vlchat.kernels.ops.layer_norm import layer_norm
from vlchat.kernels.ops.linear import linear
from vlchat.kernels.ops.rms_norm import rms_norm
from vlchat.kernels.ops.rotary import apply_rotary

__all__ = ["rms_norm", "layer_norm", "silu_and_mul", "gelu_tanh_and_mul", "quick_gelu", "apply_rotary", "linear"]
